"""Gang formation by compare-and-set (halfcast/core/db/members.py, worker/gang/formation.py, worker/gang/entry.py) on SQLite."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, select, update
from worker_support import MakeJob, present, small_spec

from halfcast.contracts.spec import JobSpec
from halfcast.contracts.status import FailureReason, JobStatus, MemberStatus
from halfcast.core.db.members import Member, Members
from halfcast.core.db.models import Attempt, Job, JobMember, utcnow
from halfcast.core.settings import Settings
from worker.gang.entry import GangEntry
from worker.gang.formation import GangEnd, Gathering, peer_verdict
from worker.gang.launch import NodePlan, gang_command
from worker.gang.plan import GANG_FILE, GangLauncher, GangPlanFile, read_plan, write_plan
from worker.lifecycle.reaper import Reaper
from worker.lifecycle.recovery import Recovery
from worker.store import JobStore

TTL = 30.0


def gang_spec(nodes: int = 3) -> dict:
    return small_spec(nodes=nodes, processes=2, distributed={"timeout_s": 5, "gang_timeout_s": 5})


def claim_node0(store: JobStore, members: Members, job_id: str, tmp_path: Path, worker: str = "w0/1") -> int:
    claim = store.claim(job_id, worker, tmp_path, TTL, status=JobStatus.GATHERING)
    assert claim is not None and store.status(job_id) == "gathering"
    assert members.open_node0(job_id, claim.attempt, worker, "10.77.0.2", 29400, TTL) is not None
    return claim.attempt


def test_workers_join_at_distinct_ranks_and_hold_one_open_membership_each(
    store: JobStore, make_job: MakeJob, tmp_path: Path
) -> None:
    members = Members(store.engine)
    first, second = make_job(gang_spec()), make_job(gang_spec())
    claim_node0(store, members, first, tmp_path)

    joined = [members.join(first, worker, "10.77.0.9", TTL) for worker in ("w1/1", "w2/1", "w3/1")]
    claim_node0(store, members, second, tmp_path, worker="w4/1")

    assert [m.node_rank for m in joined if m] == [1, 2] and joined[2] is None  # full at 3 nodes
    assert members.join(second, "w1/1", "10.77.0.9", TTL) is None  # w1 already holds an open membership
    assert members.open_node0(second, 1, "w0/1", "10.77.0.2", 1, TTL) is None
    assert [m.node_rank for m in members.of_attempt(first, 1)] == [0, 1, 2]


def test_racing_joins_never_share_a_rank(store: JobStore, make_job: MakeJob, tmp_path: Path) -> None:
    members = Members(store.engine)
    job_id = make_job(gang_spec(nodes=4))
    claim_node0(store, members, job_id, tmp_path)
    results: list[Member | None] = []
    threads = [
        threading.Thread(target=lambda w=w: results.append(members.join(job_id, w, "h", TTL)))
        for w in (f"w{i}/1" for i in range(1, 7))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    ranks = sorted(m.node_rank for m in results if m is not None)
    assert ranks == [1, 2, 3]


def gathering(members: Members, job_id: str, attempt: int, timeout_s: float, status: str = "gathering") -> Gathering:
    return Gathering(
        members,
        job_id,
        attempt,
        "w0/1",
        3,
        timeout_s,
        0.01,
        lambda: True,
        lambda: True,
        lambda: status,
        threading.Event(),
    )


def test_a_complete_gang_launches_and_a_gang_timeout_gives_the_job_back(
    store: JobStore, make_job: MakeJob, tmp_path: Path
) -> None:
    members = Members(store.engine)
    full, partial = make_job(gang_spec()), make_job(gang_spec())
    claim_node0(store, members, full, tmp_path)
    members.join(full, "w1/1", "h", TTL), members.join(full, "w2/1", "h", TTL)
    claim_node0(store, members, partial, tmp_path, worker="w3/1")
    members.join(partial, "w4/1", "h", TTL)

    assert gathering(members, full, 1, 5.0).wait() == GangEnd.COMPLETE and store.status(full) == "starting"
    assert gathering(members, partial, 1, 0.05).wait() == GangEnd.TIMED_OUT
    assert members.disband(partial, 1, "w3/1")

    with store.engine.connect() as conn:
        job = conn.execute(select(Job.status, Job.attempt, Job.worker_id).where(Job.id == partial)).one()
        attempts = conn.execute(select(Attempt).where(Attempt.job_id == partial)).all()
    assert tuple(job) == ("queued", 0, None) and attempts == []  # no attempt counted
    assert members.open_membership("w3/1") is None and members.open_membership("w4/1") is None
    assert members.join(partial, "w5/1", "h", TTL) is None  # queued, not gathering: nothing to join


def test_a_cancelled_gathering_ends_its_wait(store: JobStore, make_job: MakeJob, tmp_path: Path) -> None:
    members = Members(store.engine)
    job_id = make_job(gang_spec())
    claim_node0(store, members, job_id, tmp_path)

    assert gathering(members, job_id, 1, 5.0, status="cancelling").wait() == GangEnd.CANCELLED


def test_peer_verdicts(store: JobStore, make_job: MakeJob, tmp_path: Path) -> None:
    members = Members(store.engine)
    job_id = make_job(gang_spec())
    claim_node0(store, members, job_id, tmp_path)
    one, two = members.join(job_id, "w1/1", "h", TTL), members.join(job_id, "w2/1", "h", TTL)
    assert one and two and peer_verdict(members.of_attempt(job_id, 1)) is None

    members.close(one.id, MemberStatus.FAILED, 1)
    assert present(peer_verdict(members.of_attempt(job_id, 1))).reason == FailureReason.RANK_FAILED
    with store.begin() as conn:  # node 2's worker stopped renewing: lost comes first (it is retried)
        conn.execute(
            update(JobMember).where(JobMember.id == two.id).values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
    assert present(peer_verdict(members.of_attempt(job_id, 1))).reason == FailureReason.WORKER_LOST
    assert members.close_expired(job_id, 1) == 1 and present(members.get(two.id)).status == MemberStatus.LOST


def test_fair_ordering_joins_an_older_gathering_gang_before_newer_work(
    engine: Engine, store: JobStore, make_job: MakeJob, tmp_path: Path
) -> None:
    members = Members(engine)
    older = make_job(gang_spec())
    claim_node0(store, members, older, tmp_path)
    newer_single = make_job()
    entry = GangEntry(Settings(data_dir=tmp_path, worker_host_address="10.77.0.3"), members, lambda gpus: True)

    assert present(entry.gang_to_join(newer_single, "w1/1")).job_id == older
    assert present(entry.gang_to_join(older, "w1/1")).job_id == older  # the gang's own message
    with engine.begin() as conn:  # a one-node job older than the gang is not held back
        conn.execute(update(Job).where(Job.id == newer_single).values(created_at=utcnow() - timedelta(days=1)))
    assert entry.gang_to_join(newer_single, "w1/1") is None
    assert GangEntry(entry.settings, members, lambda gpus: gpus == 0).gang_to_join(older, "w9/1") is not None


def test_every_node_launches_torchrun_on_the_published_endpoint(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(gang_spec(nodes=2))
    node0 = gang_command(
        spec, tmp_path / "spec.json", tmp_path, NodePlan("j", 2, 0, 2, "10.77.0.2", 29400, "10.77.0.2")
    )
    node1 = gang_command(
        spec, tmp_path / "spec.json", tmp_path, NodePlan("j", 2, 1, 2, "10.77.0.2", 29400, "10.77.0.3")
    )

    def arg(command: list[str], name: str) -> str:
        return command[command.index(name) + 1]

    assert [arg(node0, "--nnodes"), arg(node0, "--nproc-per-node"), arg(node1, "--node-rank")] == ["2", "2", "1"]
    assert arg(node0, "--rdzv-endpoint") == arg(node1, "--rdzv-endpoint") == "10.77.0.2:29400"
    assert arg(node0, "--rdzv-backend") == "static" and arg(node0, "--rdzv-id") == arg(node1, "--rdzv-id") == "j-2"
    assert arg(node0, "--rdzv-conf") == arg(node1, "--rdzv-conf") == "timeout=5"  # distributed.timeout_s
    assert "--standalone" not in node0


def test_the_launch_file_names_the_gang_s_launcher_and_an_older_one_reads_as_torchrun(tmp_path: Path) -> None:
    write_plan(tmp_path, "ckpt/step-4", GangLauncher.WARM)
    assert read_plan(tmp_path) == GangPlanFile(resume_from="ckpt/step-4", launcher=GangLauncher.WARM)
    (tmp_path / GANG_FILE).write_text('{"resume_from": null}')  # written before gangs could start warm
    assert read_plan(tmp_path).launcher == GangLauncher.TORCHRUN


def test_the_reaper_closes_the_membership_of_a_dead_node_0(store: JobStore, make_job: MakeJob, tmp_path: Path) -> None:
    members = Members(store.engine)
    job_id = make_job(gang_spec(nodes=2))
    claim_node0(store, members, job_id, tmp_path)
    peer = members.join(job_id, "w1/1", "h", TTL)
    assert peer is not None and members.launch(job_id, 1, "w0/1")
    with store.begin() as conn:  # node 0's worker died: its job lease ran out; its membership lease has not yet
        conn.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))

    assert Reaper(Recovery(store, lambda _job: None), 1.0, threading.Event()).reap_once() == {job_id: "requeued"}
    by_rank = {m.node_rank: m.status for m in members.of_attempt(job_id, 1)}
    assert by_rank == {0: MemberStatus.LOST, 1: MemberStatus.JOINED}  # the live peer closes its own as it stops
    assert members.open_membership("w0/1") is None


def test_with_every_rendezvous_port_held_node_0_claims_nothing_and_sends_the_message_back(
    engine: Engine, store: JobStore, make_job: MakeJob, tmp_path: Path
) -> None:
    from worker.gang.ports import reserve_port
    from worker.runner import RunnerContext

    port = 29_650
    settings = Settings(
        data_dir=tmp_path, worker_host_address="127.0.0.1", rendezvous_port_min=port, rendezvous_port_max=port
    )
    job_id = make_job(gang_spec())
    sent: list[str] = []
    context = RunnerContext(settings=settings, store=store, worker_id="w0/1", enqueue=sent.append)
    entry = GangEntry(settings, Members(engine), lambda gpus: True)

    with reserve_port("127.0.0.1", port, port, settings.resolved_gpu_lock_dir):  # another gang's
        assert entry.run_queued(job_id, context) is None
    assert store.status(job_id) == "queued" and sent == [job_id]
    assert Members(engine).of_attempt(job_id, 1) == []
