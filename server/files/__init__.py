"""Files of a job's run directories, served and fetched: checkpoints, exports (listing, tar, extraction), and
the client's whole-or-absent download.

Nothing is imported here: the client uses :mod:`server.files.download` and the export modules without the server's
dependencies.
"""
