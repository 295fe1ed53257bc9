"""Test-only fault injection into `snapshot rollback` and `snapshot recover`, on real podman.

The installed tool has no way to be told to fail: its rollback takes a `saga.Faults` object
(none in production). `injecting(SPEC)` makes the CLI's rollback and recover use an `Inject`
for as long as it lasts (in-process tests); `python -m tests.faultinject SPEC ARGS…` runs
`linpodx ARGS…` the same way in a process of its own (for `kill@STEP`, which SIGKILLs it).

SPEC is `STEP` (an EngineError right after STEP changed something), `interrupt@STEP` (a Ctrl-C
there) or `kill@STEP` (SIGKILL there: nothing is undone in-process).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from linpodx.errors import EngineError
from linpodx.snapshot import rollback

# The rollback steps a failure can be injected after, in the order they run.
ROLLBACK_STEPS = rollback.STEPS.names()
# Where a kill can also land: after the `snapshot.rollback.commit` record, before the original
# container and the moved-aside copies are removed.
KILL_STEPS = (*ROLLBACK_STEPS, "commit")
# And where an undo can be killed: once the original is back, before it is started again.
RESTART_STEP = "restart"
ROOT = Path(__file__).resolve().parents[1]


class Inject:
    """A `saga.Faults` that fails as SPEC says, at that one point."""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def at(self, point: str) -> None:
        if self.spec == f"interrupt@{point}":
            raise KeyboardInterrupt
        if self.spec == f"kill@{point}":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.spec == point:
            raise EngineError(f"injected failure at step {point} (test only)")


@contextlib.contextmanager
def injecting(spec: str) -> Iterator[None]:
    """The CLI's `snapshot rollback` and `snapshot recover` fail as SPEC says meanwhile."""
    faults = Inject(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rollback, "rollback", functools.partial(rollback.rollback, faults=faults))
        mp.setattr(rollback, "recover", functools.partial(rollback.recover, faults=faults))
        yield


def run(spec: str, *args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`linpodx ARGS…` in a process of its own, failing as SPEC says."""
    return subprocess.run(
        [sys.executable, "-m", "tests.faultinject", spec, *args], capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, check=False, **kw,
    )


def main(argv: list[str]) -> int:
    from linpodx.cli.main import main as linpodx

    spec, *args = argv
    with injecting(spec):
        return linpodx(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
