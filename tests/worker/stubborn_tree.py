"""A process tree that resists stopping, shaped like torchrun's: used by the launch tests.

The leader starts (1) a child that starts a grandchild ignoring SIGTERM, (2) a child
ignoring SIGTERM that moved to its own process group (still in the session), and
(3) a child in a session of its own (as torchrun starts its ranks) whose own child
ignores SIGTERM. It prints ``tree started`` and sleeps, or with ``--exit`` leaves
its children behind and exits 0 once they are all started.
"""

import signal
import subprocess
import sys
import time

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
SPAWN = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {!r}]); time.sleep(600)"

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    subprocess.Popen([sys.executable, "-c", SPAWN.format(IGNORE_TERM)])
    subprocess.Popen([sys.executable, "-c", IGNORE_TERM], process_group=0)
    subprocess.Popen([sys.executable, "-c", SPAWN.format(IGNORE_TERM)], start_new_session=True)
    print("tree started", flush=True)
    if "--exit" in sys.argv:
        time.sleep(2)  # let the children start their own
        sys.exit(0)
    time.sleep(600)
