"""The benchmarked paths, each built lazily so a missing optional library only loses its own row.

:func:`build_runner` imports a peer's module only when that peer is asked for; a peer
whose library is missing raises :class:`NotInstalledError`, which the CLI reports as
"not installed".
"""

from __future__ import annotations

import importlib

from bench.peers.base import NotInstalledError, PeerInfo, Runner
from bench.workload import Workload

__all__ = ["PEERS", "NotInstalledError", "PeerInfo", "Runner", "build_runner"]

#: Peer name -> (module, class or factory taking the workload). ``hand`` is the reference of every ratio.
PEERS: dict[str, tuple[str, str]] = {
    "hand": ("bench.peers.hand", "hand_peer"),
    "halfcast": ("bench.peers.halfcast", "halfcast_peer"),
    "accelerate": ("bench.peers.accelerate_peer", "AccelerateRunner"),
    "fabric": ("bench.peers.fabric_peer", "FabricRunner"),
}


def build_runner(name: str, work: Workload) -> Runner:
    """Import and set up peer ``name`` on ``work``.

    Raises:
        KeyError: an unknown peer name.
        NotInstalledError: the peer's library is missing.
    """
    module_name, class_name = PEERS[name]
    runner_class = getattr(importlib.import_module(module_name), class_name)
    return runner_class(work)
