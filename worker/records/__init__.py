"""A run's ``records.jsonl``: read incrementally, and made into the progress and the end the worker stores."""
