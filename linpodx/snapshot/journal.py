"""The rollback journal: what a rollback in progress is about to change, so that a rollback
killed part-way (kill -9, a crash, power loss) is undone by the next command instead of leaving
the container stopped or renamed aside and the workspace half swapped.

One file per container, `snapshots/.rollbacks/NAME.json` (container names cannot start with a
dot, so no container's snapshot directory collides with `.rollbacks`). It is written before the
`snapshot.rollback` audit record is (staged, renamed into place after the record), rewritten
before each step starts (write-ahead: the step it names may or may not have happened, and
recovery looks at what is really there), and removed once the rollback is committed and cleaned
up, or fully undone. It records the process that owns it (pid and start time), so that a
journal whose owner is gone is told apart from a rollback that is still running.
"""

from __future__ import annotations

import base64
import contextlib
import os
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from linpodx.canonical import CanonicalError, canonical_bytes, strict_loads
from linpodx.errors import ChainBroken, LinpodxError
from linpodx.fsutil import Staged, atomic_write, fsync_dir
from linpodx.paths import rollback_journal
from linpodx.snapshot.jobs import proc_start_time

VERSION = 1
# In the order a rollback takes them; `commit` comes once the new container was checked (the
# original and the moved-aside copies are then removed, so recovery finishes instead of undoing).
STEPS = ("extract", "stop", "rename", "swap", "create", "verify", "commit")
MAX_BYTES = 4 << 20  # a run spec is a few KiB; anything this large is not ours


@dataclass(frozen=True)
class Journal:
    rollback_id: str
    container: str
    label: str
    image: str
    orig_id: str
    aside: str
    was_running: bool
    # The run spec's bytes (base64) as they were, to put back; None if there was none.
    spec: str | None
    # Per writable mount: source, target, kind (dir/file) and whether the source existed.
    mounts: list[dict[str, Any]] = field(default_factory=list)
    step: str = STEPS[0]
    pid: int = 0
    pid_start: int | None = None
    version: int = VERSION

    def spec_bytes(self) -> bytes | None:
        return None if self.spec is None else base64.b64decode(self.spec, validate=True)

    def owned_here(self) -> bool:
        return self.pid == os.getpid()

    def owner_alive(self) -> bool:
        """Whether the process that wrote it still runs (same pid and start time)."""
        return self.pid_start is not None and proc_start_time(self.pid) == self.pid_start


def path(name: str) -> Path:
    return Path(rollback_journal(name))


def new(
    *,
    rollback_id: str,
    container: str,
    label: str,
    image: str,
    orig_id: str,
    aside: str,
    was_running: bool,
    spec: bytes | None,
    mounts: list[Mapping[str, Any]],
) -> Journal:
    """A journal owned by this process, at the first step."""
    kept = [
        {
            "source": str(m["source"]),
            "target": str(m["target"]),
            "kind": str(m["kind"]),
            "existed": os.path.lexists(str(m["source"])),
        }
        for m in mounts
    ]
    return Journal(
        rollback_id=rollback_id,
        container=container,
        label=label,
        image=image,
        orig_id=orig_id,
        aside=aside,
        was_running=was_running,
        spec=None if spec is None else base64.b64encode(spec).decode("ascii"),
        mounts=kept,
        pid=os.getpid(),
        pid_start=proc_start_time(os.getpid()),
    )


def _encode(j: Journal) -> bytes:
    return canonical_bytes(asdict(j)) + b"\n"


def stage(j: Journal) -> Staged:
    """The journal in a fsynced temp file beside its place: `commit()` after the audit record."""
    return Staged(path(j.container), _encode(j))


def write(j: Journal) -> None:
    atomic_write(path(j.container), _encode(j))


def clear(name: str) -> None:
    p = path(name)
    with contextlib.suppress(FileNotFoundError):
        p.unlink()
        with contextlib.suppress(OSError):
            fsync_dir(p.parent)


def exists(name: str) -> bool:
    return os.path.lexists(path(name))


def _damaged(p: Path, why: str) -> ChainBroken:
    return ChainBroken(
        f"the rollback journal {p} is damaged: {why}",
        "linpodx cannot tell what the interrupted rollback changed; check the container "
        "(`podman ps -a`) and the workspace (`.linpodx-before-*` copies beside each mount "
        "source), put them right by hand, then remove the journal file",
    )


def read(name: str) -> Journal | None:
    """The container's journal, None if there is none; damage is refused (fail closed)."""
    p = path(name)
    try:
        # No links, no FIFOs: a swapped-in special file must not hang or redirect a command.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LinpodxError(
            f"cannot read the rollback journal {p}: {exc.strerror}",
            "check the permissions of linpodx's state directory",
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _damaged(p, "not a regular file")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise _damaged(p, "too large")
    try:
        doc = strict_loads(raw)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ValueError("not a version 1 journal")
        j = Journal(**doc)
        if j.container != name or j.step not in STEPS:
            raise ValueError("names another container or an unknown step")
        for m in j.mounts:
            if set(m) != {"source", "target", "kind", "existed"}:
                raise ValueError("a mount entry has other fields")
        j.spec_bytes()
    except (CanonicalError, TypeError, ValueError) as exc:
        raise _damaged(p, str(exc)) from None
    return j


def interrupted_notes() -> list[str]:
    """One line per container whose rollback was interrupted (its journal's owner is gone), for
    `linpodx ps` to say on stderr: such a container may be missing from the list (renamed
    aside) or stopped, and nothing acts on it until it is recovered."""
    where = Path(rollback_journal("x")).parent
    try:
        names = sorted(n[: -len(".json")] for n in os.listdir(where) if n.endswith(".json"))
    except OSError:
        return []
    notes = []
    for name in names:
        try:
            j = read(name)
        except LinpodxError as exc:
            notes.append(f"{exc.message}; {exc.hint}")
            continue
        if j is not None and not j.owned_here() and not j.owner_alive():
            notes.append(
                f"a rollback of {name} to {j.label} was interrupted at step {j.step}; run "
                f"`linpodx snapshot recover {name}`"
            )
    return notes


def check_no_interrupted(name: str) -> None:
    """Refuse to act on container `name` while a rollback of it is running in another process
    or was interrupted and not yet recovered. The rollback itself (this process) passes.

    Cheap when there is no journal (one lstat), so the run paths can afford it.
    """
    if not os.path.lexists(path(name)):
        return
    j = read(name)
    if j is None or j.owned_here():
        return
    if j.owner_alive():
        raise LinpodxError(
            f"a rollback of {name} (to {j.label}) is in progress (pid {j.pid})",
            f"wait for it to finish, then retry; `linpodx ps --all` shows {name}",
        )
    raise LinpodxError(
        f"a rollback of {name} to {j.label} was interrupted at step {j.step} and left {name} "
        "half done",
        f"run `linpodx snapshot recover {name}` to put {name} back as it was before the "
        "rollback (or finish it, if it had got that far)",
    )
