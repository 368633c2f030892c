"""Files of a job's run directory as the client fetches them and the API serves them: the whole-or-absent download
(:mod:`.download`), an export's files (:mod:`.export_files`), its tar stream (:mod:`.export_tar`) and its safe
extraction (:mod:`.export_extract`).

Nothing is imported here, and these modules need only the client's dependencies.
"""
