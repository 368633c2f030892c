"""Where the API's job polls got their reads, from its ``GET /metrics`` (``halfcast_poll_reads_total``).

The series is only there when polls keep reads (``HALFCAST_POLL_READS=notified`` or
``HALFCAST_POLL_MAX_AGE_S``); without it every poll makes a database read of its own.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: The counter's family name as the parser reports it (without ``_total``).
FAMILY = "halfcast_poll_reads"


def poll_read_counts(url: str, token: str) -> dict[str, float]:
    """``answered_from`` → polls so far; empty when the API keeps no reads."""
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    response.raise_for_status()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        if family.name == FAMILY:
            for sample in family.samples:
                if sample.name == f"{FAMILY}_total":
                    counts[sample.labels["answered_from"]] = sample.value
    return counts


def own_read_share(before: dict[str, float], after: dict[str, float]) -> float | None:
    """The share of the polls between two counts that made a database read of their own; ``None``: not counted."""
    polls = {source: after[source] - before.get(source, 0.0) for source in after}
    total = sum(polls.values())
    if not total:
        return None
    return polls.get("database", 0.0) / total
