"""``python -m worker.launch.torchrun ARGS...``: torchrun (``torch.distributed.run``), stopped by a signal without a crash report.

The worker launches every run through this module (:func:`worker.launch.process_tree.build_command`);
the arguments are torchrun's own. torchrun's elastic agent handles SIGTERM (and SIGINT,
SIGHUP, SIGQUIT) by raising ``SignalException`` in its monitoring loop. It then passes
the signal on to every rank (each rank's process group), waits for them up to its
shutdown timeout (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, which the worker sets from
``HALFCAST_CANCEL_GRACE_S``), SIGKILLs any rank still left, and raises the exception
again. Run as ``python -m torch.distributed.run``, the launcher then ends the way a
crash does: a ``SignalException`` traceback in ``launcher.log`` and exit status 1. It
also exits only after the interpreter's teardown, which takes about a second with
torch imported and several on a busy host.

Here torchrun's ``main`` runs unchanged. When it ends with ``SignalException``, its
ranks have already been stopped, so this module logs one line and exits at once with
128 + the signal number. That is the status an untrapped signal gives, and the one the
trainer's stop checkpoint ends with (:data:`trainer.preemption.STOPPED_EXIT`). Every
other ending is left to torchrun: success, its error report and traceback when a rank
fails (the worker reads them, :mod:`worker.lifecycle.failure_logs`), and its exit status.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main as torchrun_main

from trainer.preemption import exit_now

log = logging.getLogger("worker.launch.torchrun")

#: Format of this module's own log line (torchrun's own lines keep torchrun's format).
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


def run(argv: Sequence[str]) -> int:
    """Run torchrun with ``argv``; 0 when it returns, 128 + the signal number when a signal stopped it.

    Any other exception (a failed rank's ``ChildFailedError`` among them) propagates, as under
    ``python -m torch.distributed.run``.
    """
    try:
        torchrun_main(list(argv))
    except SignalException as stopped:
        log.warning("stopped by %s: torchrun passed it on to its ranks and waited for them", stopped.sigval.name)
        return 128 + int(stopped.sigval)
    return 0


def _log_to_stderr() -> None:
    """Send this module's own records to stderr (``launcher.log``), leaving torchrun's logging as it sets it up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun; after a stop signal exit at once (:func:`exit_now`), else return its status."""
    _log_to_stderr()
    status = run(sys.argv[1:] if argv is None else argv)
    if status != 0:
        exit_now(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
