"""A launcher shaped like torchrun, for the stop tests: ``python forwarding_launcher.py OUT_DIR [--no-forward]``.

It starts one "rank" in a session of its own (as torchrun does) and waits for it. On
SIGTERM it passes SIGTERM on to the rank's process group (after :data:`FORWARD_DELAY_S`,
as torchrun does once its handler has run) and keeps waiting; with ``--no-forward`` it
only keeps waiting (a launcher that does not pass the signal on). Either way it exits
143 once the rank has. The rank takes :data:`RANK_STOP_S` after its first SIGTERM (its
checkpoint), then exits 143. Both block SIGTERM and take it with ``sigtimedwait``, so
they know who sent it: each appends the sender's pid to ``OUT_DIR/launcher-sigterms``
or ``OUT_DIR/rank-sigterms``. The launcher prints ``started`` once the rank runs.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Seconds between the launcher's SIGTERM and its forward: a SIGTERM sent to the rank directly arrives first.
FORWARD_DELAY_S = 0.2
#: Seconds a rank takes from its first SIGTERM to its exit.
RANK_STOP_S = 0.3
#: Longest wait for a signal between two checks.
STEP_S = 0.01

RANK = f"""
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
(out / "rank-ready").touch()
first = None
while first is None or time.monotonic() - first < {RANK_STOP_S}:
    info = signal.sigtimedwait([signal.SIGTERM], {STEP_S})
    if info is not None:
        with (out / "rank-sigterms").open("a") as f:
            f.write(f"{{info.si_pid}}\\n")
        first = first or time.monotonic()
sys.exit(143)
"""


def main(out_dir: Path, forward: bool) -> int:
    """Run the rank and wait for it, recording (and with ``forward`` passing on) every SIGTERM; 143 at its exit."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(out_dir)], start_new_session=True)
    while not (out_dir / "rank-ready").exists():
        time.sleep(STEP_S)
    print("started", flush=True)
    while rank.poll() is None:
        info = signal.sigtimedwait([signal.SIGTERM], STEP_S)
        if info is None:
            continue
        with (out_dir / "launcher-sigterms").open("a") as f:
            f.write(f"{info.si_pid}\n")
        if forward:
            time.sleep(FORWARD_DELAY_S)
            os.killpg(rank.pid, signal.SIGTERM)
    return 143


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), "--no-forward" not in sys.argv))
