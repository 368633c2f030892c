"""Write ``tests/module_durations.json`` from a JUnit XML report: seconds per test module, longest first.

    pytest -n 3 --dist loadscope --junitxml=/tmp/run.xml
    python tests/module_durations.py /tmp/run.xml

``tests/conftest.py`` orders a run by it (longest module first); modules under 2 s are left out
(they count as 0). Rewrite it when modules are added or change much: only the order depends on it.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUT = Path(__file__).with_name("module_durations.json")
#: Modules shorter than this are left out.
MIN_S = 2.0


def module_durations(report: Path) -> dict[str, int]:
    """Seconds per module path (``tests/e2e/test_x.py``) in ``report``, longest first, at least :data:`MIN_S`."""
    seconds: dict[str, float] = {}
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0)
    longest_first = sorted(seconds.items(), key=lambda pair: -pair[1])  # stable: ties keep their report order
    return {module: round(s) for module, s in longest_first if s >= MIN_S}


if __name__ == "__main__":
    OUT.write_text(json.dumps(module_durations(Path(sys.argv[1])), indent=1) + "\n")
