"""What flows between the trainer, the worker, the API and its client, defined once (docs/architecture.md, "Contracts").

- :mod:`halfcast.contracts.rundir`: the run directory, every path in it and the attempt layout under the runs directory;
- :mod:`halfcast.contracts.records`: the lines of ``records.jsonl`` as typed models (a discriminated union);
- :mod:`halfcast.contracts.status`: job and attempt statuses and the typed failure reasons;
- :mod:`halfcast.contracts.resources`: the job resource and its pages, as the API serves them and the client reads them.
- :mod:`halfcast.contracts.stored`: the records as the API serves them from the database (typed, their JSON as stored);
- :mod:`.artifacts`, :mod:`.registry`, :mod:`.access`: checkpoints and exports,
  registered datasets and models, the session and the audit log;
- :mod:`halfcast.contracts.events`: the payloads of the Server-Sent Events, by event name.

Torch-, FastAPI- and SQLAlchemy-free (pydantic only), so every package and the client may import it; it
imports none of them.
"""
