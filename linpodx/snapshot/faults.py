"""The one test-only hook left in the installed tool, checked in exactly one place.

`LINPODX_SNAPSHOT_TEST_DELAY=<seconds>` makes the create worker sleep before each step so tests
can observe (and kill) it mid-job; it does nothing when unset. (Rollback's fault points are an
object the caller passes, `saga.Faults`: nothing in the tool reads them from its environment.)
"""

from __future__ import annotations

import os
import time

DELAY_ENV = "LINPODX_SNAPSHOT_TEST_DELAY"


def step_delay() -> None:
    """Sleep between worker steps if the test asked for it."""
    value = os.environ.get(DELAY_ENV, "")
    if not value:
        return
    try:
        seconds = min(max(float(value), 0.0), 600.0)
    except ValueError:
        return
    time.sleep(seconds)
