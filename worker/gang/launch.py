"""The torchrun command of one node of a multi-node job, and the addresses it is reached at.

Every node runs torchrun's own multi-node machinery: ``--nnodes N --node-rank k
--nproc-per-node P`` with the static rendezvous backend at the endpoint node 0 published
(``host:port``, the port node 0 found free on its address). The gang formed in the database
already, so the rendezvous only has to connect the agents: node 0's agent hosts the store
there (it is the store host because its node rank is 0, not by matching the endpoint against
its hostname, the guess of the c10d backend that fails inside containers and network namespaces)
and every node's ranks get global ranks ``k * P`` to ``k * P + P - 1``: global rank 0, which
writes the step records and checkpoints, runs on node 0, whose worker decides the job's outcome.
The ranks reach the store at node 0's address (``MASTER_ADDR``); the agents wait for each other
at most ``distributed.timeout_s`` (``--rdzv-conf timeout``).
"""

from __future__ import annotations

import fcntl
import socket
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from halfcast.contracts.rundir import RunDir
from halfcast.contracts.spec import JobSpec
from worker.launch.process_tree import LAUNCHER, RANK_WRAPPER

#: ``ioctl`` request for an interface's IPv4 address (Linux ``SIOCGIFADDR``).
SIOCGIFADDR = 0x8915
#: Variables naming the interface gloo and NCCL connect the ranks over.
SOCKET_IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
#: Port a database URL without one is reached at, for :func:`route_address`.
DEFAULT_DB_PORT = 5432


@dataclass(frozen=True)
class NodePlan:
    """Where one node sits in its gang: its rank, the gang's size and endpoint, its own address."""

    job_id: str
    attempt: int
    node_rank: int
    nodes: int
    endpoint_host: str
    endpoint_port: int
    local_address: str

    @property
    def endpoint(self) -> str:
        """``host:port`` of the rendezvous (IPv6 addresses bracketed)."""
        host = f"[{self.endpoint_host}]" if ":" in self.endpoint_host else self.endpoint_host
        return f"{host}:{self.endpoint_port}"


def gang_command(spec: JobSpec, spec_path: Path, run_dir: Path, plan: NodePlan, module: str = "trainer") -> list[str]:
    """The torchrun command line of node ``plan.node_rank`` (see the module's docstring)."""
    join_timeout = int(spec.effective_distributed.timeout_s)
    return [
        sys.executable, "-m", LAUNCHER,
        "--nnodes", str(plan.nodes), "--node-rank", str(plan.node_rank), "--nproc-per-node", str(spec.ranks_per_node),
        "--rdzv-backend", "static", "--rdzv-endpoint", plan.endpoint, "--rdzv-id", f"{plan.job_id}-{plan.attempt}",
        "--rdzv-conf", f"timeout={join_timeout}", "--max-restarts", "0",
        "-m", RANK_WRAPPER, str(RunDir(run_dir).logs), module, "--spec", str(spec_path), "--run-dir", str(run_dir),
    ]  # fmt: skip  # one row per group of torchrun's flags, each flag beside its value


def node_environment(environment: Mapping[str, str], address: str) -> dict[str, str]:
    """``environment`` plus the interface of ``address`` for gloo and NCCL.

    Without it gloo binds the ranks to the address the hostname resolves to (often a loopback
    address), which the other hosts cannot reach; the interface is left unset when none has ``address``.
    """
    interface = interface_of(address)
    extra = {name: interface for name in SOCKET_IFNAME_ENV} if interface else {}
    return {**environment, **extra}


def interface_of(address: str) -> str | None:
    """The name of the network interface with IPv4 ``address`` here, or ``None``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def route_address(database_url: str) -> str:
    """This host's address on its route to the database host (the others reach this host the same way).

    No packet is sent: connecting a UDP socket only picks the route. Falls back to the
    address of the hostname when the database is local (SQLite, a socket path).
    """
    parts = urlsplit(database_url)
    host = parts.hostname
    if not host or host in ("localhost", "127.0.0.1", "::1"):
        return socket.gethostbyname(socket.gethostname())
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, parts.port or DEFAULT_DB_PORT))
        return str(probe.getsockname()[0])
