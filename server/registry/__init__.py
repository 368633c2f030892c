"""Registered datasets and models: uploads checked and stored under ``<data_dir>/registry``, and job specs that name them.

- :mod:`.layout`: where files live (shared with the trainer's :mod:`trainer.registered`), staging and trash;
- :mod:`.upload`: a request body streamed to a staging file, hashed and bounded;
- :mod:`.dataset_check`: every row of a dataset file checked with the trainer's own parser;
- :mod:`.model_archive` and :mod:`.model_check`: a model tar checked entry by entry and extracted safely,
  and a model directory checked as the trainer would;
- :mod:`.refs`: a job spec's ``dataset_id`` / ``model_id`` looked up, checked and filled in;
- :mod:`.schemas`: the resources the API answers.

The rows live in ``datasets`` and ``models`` (:mod:`server.db.registry`); the routes are
:mod:`server.routes.datasets` and :mod:`server.routes.models`.
"""
