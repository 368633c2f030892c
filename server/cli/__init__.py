"""The operator's commands of ``halfcast`` (:mod:`halfcast.cli` dispatches them): the services (``up``, ``api``),
the database schema (``db``), API tokens (``tokens``) and per-owner quotas (``quotas``).

Each module has a ``register(subparsers)`` function, as the job commands of :mod:`halfcast.cli` do; they need
the ``server`` extra.
"""
