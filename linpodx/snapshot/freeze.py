"""Holding a container still while it is committed and its workspace archived.

Two ways, decided per host:
- `pause`: `podman pause` (the cgroup freezer). Works as root, and rootless on cgroup v2.
- `sigstop`: rootless podman on cgroup v1 has no cgroup it may freeze (`podman pause` refuses).
  We then stop every process of the container with SIGSTOP from the host and continue them with
  SIGCONT afterwards. SIGSTOP cannot be caught, blocked or ignored, so the result is as still as
  the freezer; the difference is that a parent may notice (SIGCHLD/CLD_STOPPED, `wait` with
  WUNTRACED). Processes that were already stopped before we came are left stopped.

A process belongs to the container if it is in the container's pid namespace (this catches
`podman exec` processes, which are not descendants of the init) or descends from such a process
(this catches processes in nested pid namespaces). Stopping repeats until a scan finds no process
we have not stopped, so a process forked during the scan is caught too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from linpodx.errors import EngineError
from linpodx.podman import engine

PAUSE = "pause"
SIGSTOP_METHOD = "sigstop"
NONE = "none"
STOPPED = "stopped"
"""Not a freeze: the container was stopped for the snapshot (`--consistency stop`)."""
_MAX_ROUNDS = 200

# What `snapshot create --consistency` may ask for.
FREEZE = "freeze"
"""The default: the cgroup freezer, or no snapshot of a running container."""
BEST_EFFORT = "best-effort"
"""The freezer where there is one, else SIGSTOP: a process can be continued under it (by
another one, or by a POSIX timer of its own that sends SIGCONT), so not a guaranteed point."""
STOP = "stop"
"""Stop the container for the snapshot (its processes end) and start it again after."""
CONSISTENCIES = (FREEZE, BEST_EFFORT, STOP)

CANNOT_FREEZE = (
    "this host cannot freeze it: rootless podman on cgroup v1 has no cgroup freezer, only "
    "signals (SIGSTOP), and a process can have itself continued (a POSIX timer that sends "
    "SIGCONT, another process that does), so the snapshot would not be one point in time"
)
CANNOT_FREEZE_HINT = (
    "pass `--consistency stop` to stop the container for the snapshot (it is started again "
    "after), or `--consistency best-effort` to take it held by signals only"
)


def can_freeze() -> bool:
    """Whether this host holds a running container with the cgroup freezer (`pause`)."""
    return default_method() == PAUSE


def default_method() -> str:
    """`pause` unless rootless on cgroup v1 (where podman cannot freeze)."""
    if os.geteuid() == 0:
        return PAUSE
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return PAUSE  # cgroup v2: rootless pause works when the freezer is delegated
    return SIGSTOP_METHOD


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    if len(rest) < 2:
        return None
    return rest[0], int(rest[1])


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def container_pids(init_pid: int) -> set[int]:
    """Host pids of every process of the container whose init is `init_pid`."""
    ns = _pidns(init_pid)
    if ns is None:
        raise EngineError(
            f"cannot read the pid namespace of the container's init (pid {init_pid})",
            "is the container still running? (`podman ps -a`)",
        )
    parents: dict[int, int] = {}
    members: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        st = _stat(pid)
        if st is None:
            continue
        parents[pid] = st[1]
        if pid == init_pid or _pidns(pid) == ns:
            members.add(pid)
    # Descendants of members (nested pid namespaces).
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                changed = True
    return members


@dataclass
class SignalFreeze:
    """The processes we stopped, so we continue exactly those."""

    init_pid: int
    stopped: set[int] = field(default_factory=set)

    def stop_all(self) -> None:
        """SIGSTOP every process of the container until none is left running."""
        for _ in range(_MAX_ROUNDS):
            pending = []
            for pid in container_pids(self.init_pid):
                st = _stat(pid)
                if st is None or st[0] in ("Z", "X"):
                    continue
                if st[0] in ("T", "t") and pid in self.stopped:
                    continue
                if pid not in self.stopped and st[0] in ("T", "t"):
                    continue  # stopped before we came: leave it as it was
                pending.append(pid)
            if not pending:
                return
            for pid in pending:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    self.stopped.add(pid)
            # Let the signals land before checking states again.
            time.sleep(0.005)
        raise EngineError(
            "could not stop every process of the container (processes kept appearing)",
            "try again when the container is less busy, or stop it first",
        )

    def continue_all(self) -> None:
        """SIGCONT every process we stopped."""
        for pid in sorted(self.stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.stopped.clear()


def _state(name: str) -> tuple[str, int]:
    return engine.status_and_pid(name)


OnHold = Callable[[str, list[list[int]]], None]


def _start_time(pid: int) -> int:
    from linpodx.snapshot.jobs import proc_start_time

    return proc_start_time(pid) or 0


@contextlib.contextmanager
def frozen(
    name: str, method: str | None = None, on_hold: OnHold | None = None,
    *, signals: bool = False,
) -> Iterator[str]:
    """Hold container `name` still for the duration; yields the method used.

    A container that is not running (created, exited, already paused) needs nothing: yields
    `none`. `on_hold(method, [[pid, start], …])` is called once the container is held (the
    worker records it so a reader can let the container go if the worker dies). The container
    is always let go again, whatever happens inside the block. Holding it by signals only
    (SIGSTOP) where the freezer is missing needs `signals`; EngineError otherwise.
    """
    status, init_pid = _state(name)
    if status != "running" or init_pid <= 0:
        yield NONE
        return
    method = method or default_method()
    if method == SIGSTOP_METHOD and not signals:
        raise EngineError(f"cannot freeze {name}: {CANNOT_FREEZE}", CANNOT_FREEZE_HINT)
    if method == PAUSE:
        try:
            engine.pause(name)
        except EngineError as exc:
            if "not supported" not in exc.stderr and "cgroup" not in exc.stderr:
                raise
            if not signals:
                raise EngineError(
                    f"cannot freeze {name}: `podman pause` refused ({exc.stderr.strip()})",
                    CANNOT_FREEZE_HINT,
                ) from None
            method = SIGSTOP_METHOD  # this host cannot freeze; stop the processes instead
        else:
            try:
                if on_hold is not None:
                    on_hold(PAUSE, [])
                yield PAUSE
            finally:
                engine.unpause(
                    name, hint=f"the container is still paused: run `podman unpause {name}`"
                )
            return
    sf = SignalFreeze(init_pid)
    try:
        sf.stop_all()
        if on_hold is not None:
            on_hold(SIGSTOP_METHOD, [[p, _start_time(p)] for p in sorted(sf.stopped)])
        yield SIGSTOP_METHOD
    finally:
        sf.continue_all()


def release(name: str, method: str | None, held: Sequence[Sequence[int]]) -> list[str]:
    """Let a container go that a dead worker left held; returns what was done."""
    done: list[str] = []
    if method == PAUSE:
        status, _ = _state(name)
        if status == "paused":
            engine.unpause(name)
            done.append("unpaused")
    elif method == SIGSTOP_METHOD:
        n = 0
        for pid, start in held:
            # Only the very process we stopped (same start time), and only if still stopped.
            st = _stat(pid)
            if st is None or st[0] not in ("T", "t") or _start_time(pid) != start:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                n += 1
        if n:
            done.append(f"continued {n} processes")
    elif method == STOPPED:
        done.append("the container was stopped for the snapshot and stays stopped (start it "
                    "with `linpodx start`)")
    return done
