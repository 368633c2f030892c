"""The shared core of the server and the worker: what both processes read and write, importing neither.

- :mod:`.settings`: the ``HALFCAST_*`` settings;
- :mod:`.data_dir`: the data directory (``HALFCAST_DATA_DIR``) and what lives in it;
- :mod:`.db`: the database models, engine, job transitions and every read and write of its rows;
- :mod:`.registry`: the registered datasets' and models' files (layout) and a spec's references to them;
- :mod:`.broker`: the Celery app both ends use, with its delivery settings and kombu transports.

The API (``server/``) and the Celery worker (``worker/``) import it; it imports neither of them.
"""
