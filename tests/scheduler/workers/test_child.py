"""The worker process's start-up (``scheduler.workers.child``)."""

from __future__ import annotations

import json
import subprocess
import sys

from scheduler.workers.child import GC_YOUNG_THRESHOLD

_PROBE = """
import gc, json
from scheduler.workers.child import settle_gc
before = gc.get_threshold()
settle_gc()
print(json.dumps({"frozen": gc.get_freeze_count(), "before": before, "after": gc.get_threshold()}))
"""


def test_settle_gc_freezes_what_was_loaded_and_makes_young_collections_rarer() -> None:
    # In a process of its own: freezing this test process's objects would outlive the test.
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60)
    seen = json.loads(out.stdout)
    assert seen["frozen"] > 1000  # the modules imported so far
    assert seen["after"] == [GC_YOUNG_THRESHOLD, *seen["before"][1:]]  # older generations as they were
