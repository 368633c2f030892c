"""Files of a job's run directories as the API serves them: checkpoints (:mod:`.checkpoint_files`) and an export's
checks (:mod:`.export_check`); the export files the client reads too are :mod:`halfcast.files`.
"""
