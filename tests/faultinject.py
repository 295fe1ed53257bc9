"""Test-only fault injection into `snapshot rollback`, `snapshot recover` and the create worker,
on real podman.

The installed tool has no way to be told to fail: its rollback takes a `saga.Faults` object
(none in production). `injecting(SPEC)` makes the CLI's rollback and recover use an `Inject`
for as long as it lasts (in-process tests); `python -m tests.faultinject SPEC ARGS…` runs
`linpodx ARGS…` the same way in a process of its own (for `kill@STEP`, which SIGKILLs it).

SPEC is `STEP` (an EngineError right after STEP changed something), `interrupt@STEP` (a Ctrl-C
there) or `kill@STEP` (SIGKILL there: nothing is undone in-process).

`slow_worker(SECONDS)` makes `snapshot create` start its worker through this file, as
`python faultinject.py worker SECONDS JOB`: the real worker, sleeping SECONDS before each step
(so a test can watch it and kill it mid-job).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from linpodx.errors import EngineError
from linpodx.snapshot import rollback, service, worker

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


class Delay:
    """A `saga.Faults` that only sleeps, at every point."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def at(self, point: str) -> None:
        time.sleep(self.seconds)


@contextlib.contextmanager
def slow_worker(seconds: float) -> Iterator[None]:
    """`snapshot create` meanwhile starts workers that sleep SECONDS before each step."""
    argv = (sys.executable, str(Path(__file__).resolve()), "worker", str(seconds))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(service, "start_create",
                   functools.partial(service.start_create, worker_argv=argv))
        yield


def run(spec: str, *args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`linpodx ARGS…` in a process of its own, failing as SPEC says."""
    return subprocess.run(
        [sys.executable, "-m", "tests.faultinject", spec, *args], capture_output=True, text=True,
        timeout=timeout, cwd=ROOT, check=False, **kw,
    )


def main(argv: list[str]) -> int:
    from linpodx.cli.main import main as linpodx

    if argv[:1] == ["worker"]:
        return worker.main(argv[2:], faults=Delay(float(argv[1])))
    spec, *args = argv
    with injecting(spec):
        return linpodx(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
