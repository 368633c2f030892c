"""Per-rank logs over a real run: a 2-process CPU job, rank 1's log followed live until the job ends."""

from __future__ import annotations

import pytest
from e2e_support import Stack, load_example

from halfcast.client import HalfcastClient
from halfcast.contracts.events import LogAttempt, LogChunk, LogEnd
from halfcast.contracts.status import JobStatus

pytestmark = pytest.mark.e2e


def test_follow_rank_1_of_a_two_process_job_until_it_ends(embedded_stack: Stack) -> None:
    spec = load_example("synthetic-fp16.json", processes=2, max_steps=20, faults={"sleep_per_step_s": 0.05})
    job_id = embedded_stack.submit(spec)["id"]
    url = str(embedded_stack.client.base_url)
    with HalfcastClient(url, stream_timeout=60, token=embedded_stack.token) as client:
        events = list(client.follow_logs(job_id, rank=1))  # submitted just now: the stream waits for the claim
        lines = [line for event in events if isinstance(event.data, LogChunk) for line in event.data.lines]
        assert events[0].event == "attempt" and events[0].data == LogAttempt(attempt=1, rank=1)
        assert events[-1].event == "end" and events[-1].data == LogEnd(status=JobStatus.SUCCEEDED, attempt=1)
        assert any("rank=1 world_size=2" in line for line in lines), lines  # rank 1's own "joined process group"
        assert any("finished 20 steps" in line for line in lines), lines
        assert not any(" rank0 " in line for line in lines), lines  # nothing of rank 0
        rank_0 = client.logs(job_id, rank=0, tail=1000).lines
        assert any("rank=0 world_size=2" in line for line in rank_0) and not any(" rank1 " in line for line in rank_0)
        assert client.logs(job_id, rank=1, tail=1000).lines == lines  # the follow saw every line, once, in order
    assert embedded_stack.job(job_id)["status"] == "succeeded"
