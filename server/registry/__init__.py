"""Registered datasets and models: uploads checked and stored under ``<data_dir>/registry``, and job specs that name them.

- :mod:`.upload`: a request body streamed to a staging file, hashed and bounded;
- :mod:`.dataset_check`: every row of a dataset file checked with the trainer's own parser;
- :mod:`.model_archive` and :mod:`.model_check`: a model tar checked entry by entry and extracted safely,
  and a model directory checked as the trainer would;
- :mod:`.schemas`: the resources the API answers.

Where the files live and a spec's references to them are the shared core's (:mod:`halfcast.core.registry`);
the rows live in ``datasets`` and ``models`` (:mod:`halfcast.core.db.registry`); the routes are
:mod:`server.routes.datasets` and :mod:`server.routes.models`.
"""
