"""Registered datasets and models as both the API and the worker see them.

- :mod:`.layout`: where their files live under ``<data_dir>/registry`` (shared with :mod:`trainer.registered`),
  staging and trash;
- :mod:`.refs`: a job spec's ``dataset_id`` / ``model_id`` looked up, checked for its owner and filled in.

The uploads and their checks are the API's (:mod:`server.registry`).
"""
