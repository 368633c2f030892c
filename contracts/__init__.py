"""What flows between the trainer, the worker, the API and its client, defined once (docs/architecture.md, "Contracts").

- :mod:`contracts.rundir`: the run directory, every path in it and the attempt layout under the runs directory;
- :mod:`contracts.records`: the lines of ``records.jsonl`` as typed models (a discriminated union);
- :mod:`contracts.status`: job and attempt statuses and the typed failure reasons;
- :mod:`contracts.resources`: the job resource and its pages, as the API serves them and the client reads them.

Torch-, FastAPI- and SQLAlchemy-free (pydantic only), so every package and the client may import it; it
imports none of them.
"""
