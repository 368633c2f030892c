"""General helpers every package may use: secret redaction, log quieting, time.

Nothing here imports another Halfcast package (``tests/test_import_rules.py``), nor a
web framework, database or torch: the client, the worker and the trainer can all use it.
"""
