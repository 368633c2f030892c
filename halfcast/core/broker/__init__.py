"""The broker, as both its ends use it: the Celery app of the API (which publishes) and of the worker (which consumes).

Its own package so that the API publishes a job without importing the worker: it
holds the Celery app factory and its delivery settings (:mod:`halfcast.core.broker.celery_app`)
and the two kombu transports it selects (:mod:`halfcast.core.broker.fs_transport` for the embedded
``filesystem://`` broker, :mod:`halfcast.core.broker.redis_transport` for Redis). It needs
``celery``/``kombu`` and :mod:`halfcast.core.settings` only (docs/architecture.md).
"""
