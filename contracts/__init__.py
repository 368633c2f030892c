"""What flows between the trainer, the worker, the API and its client, defined once (docs/architecture.md, "Contracts").

- :mod:`contracts.rundir`: the run directory, every path in it and the attempt layout under the runs directory;
- :mod:`contracts.records`: the lines of ``records.jsonl`` as typed models (a discriminated union);
- :mod:`contracts.status`: job and attempt statuses and the typed failure reasons;
- :mod:`contracts.resources`: the job resource and its pages, as the API serves them and the client reads them.
- :mod:`contracts.stored`: the records as the API serves them from the database (typed, their JSON as stored);
- :mod:`contracts.artifacts`, :mod:`contracts.registry`, :mod:`contracts.access`: checkpoints and exports,
  registered datasets and models, the session and the audit log;
- :mod:`contracts.events`: the payloads of the Server-Sent Events, by event name.

Torch-, FastAPI- and SQLAlchemy-free (pydantic only), so every package and the client may import it; it
imports none of them.
"""
