"""Test-only hooks, checked in exactly one place each.

`LINPODX_TEST_FAIL_AT=<step>` makes the named rollback step fail (after the steps before it
have changed things), so tests can prove the original container and workspace come back intact;
`LINPODX_TEST_FAIL_AT=interrupt@<step>` raises KeyboardInterrupt there instead (a Ctrl-C), and
`LINPODX_TEST_FAIL_AT=kill@<step>` SIGKILLs the process there (a crash: nothing is undone, the
rollback journal is left for the next command to recover).
`LINPODX_SNAPSHOT_TEST_DELAY=<seconds>` makes the create worker sleep before each step so tests
can observe (and kill) it mid-job. Neither is meant for anything but the test suite; both do
nothing when unset.
"""

from __future__ import annotations

import os
import signal
import time

from linpodx.errors import EngineError

FAIL_ENV = "LINPODX_TEST_FAIL_AT"
DELAY_ENV = "LINPODX_SNAPSHOT_TEST_DELAY"


def fail_point(step: str) -> None:
    """Raise an injected failure if the test asked for one at `step`."""
    value = os.environ.get(FAIL_ENV)
    if value == f"interrupt@{step}":
        raise KeyboardInterrupt
    if value == f"kill@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    if value == step:
        raise EngineError(f"injected failure at step {step} ({FAIL_ENV} is set; test only)")


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

# The rollback steps a failure can be injected after, in the order they run.
ROLLBACK_STEPS = ("extract", "stop", "rename", "swap", "create", "verify")
# Where a kill can also land: after the `snapshot.rollback.commit` record, before the original
# container and the moved-aside copies are removed.
KILL_STEPS = (*ROLLBACK_STEPS, "commit")
# And where an undo can be killed: once the original is back, before it is started again.
RESTART_STEP = "restart"
