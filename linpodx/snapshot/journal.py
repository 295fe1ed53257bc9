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
import binascii
import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from linpodx.canonical import CanonicalError, canonical_bytes, strict_loads
from linpodx.errors import ChainBroken, LinpodxError
from linpodx.fsutil import NotRegularFile, Staged, atomic_write, fsync_dir, read_regular
from linpodx.ids import ULID_RE
from linpodx.paths import rollback_journal, rollback_pending
from linpodx.snapshot import egresskeep
from linpodx.snapshot.jobs import proc_start_time
from linpodx.snapshot.names import LABEL_RE, image_ref
from linpodx.snapshot.workspace import DIR, FILE

VERSION = 1
# In the order a rollback takes them; `commit` comes once the new container was checked, and
# before its record (the original and the moved-aside copies are then removed, so recovery
# finishes instead of undoing).
STEPS = ("extract", "stop", "rename", "swap", "create", "verify", "commit", "undone")
# `undone` is not a step of the rollback but the last of an undo: the original container and
# workspace are back and only starting it again (it ran before) is left.
MAX_BYTES = 4 << 20  # a run spec is a few KiB; anything this large is not ours
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")


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
    # The container's egress policy file as it was before anything changed (its newest
    # allowlist, maybe from a re-apply after it was created), put back on whichever container
    # ends up under the name (`egresskeep`); None if it had none. Absent from journals written
    # before it existed, which then read as None.
    egress_policy: dict[str, Any] | None = None
    step: str = STEPS[0]
    pid: int = 0
    pid_start: int | None = None
    version: int = VERSION

    def spec_bytes(self) -> bytes | None:
        return None if self.spec is None else base64.b64decode(self.spec, validate=True)

    def owned_here(self) -> bool:
        """Whether this very process wrote it (pid and start time: a pid can be reused)."""
        return self.pid == os.getpid() and self.pid_start == _own_start()

    def owner_alive(self) -> bool:
        """Whether the process that wrote it still runs (same pid and start time)."""
        return self.pid_start is not None and proc_start_time(self.pid) == self.pid_start


def _own_start() -> int | None:
    global _OWN
    if _OWN is None or _OWN[0] != os.getpid():  # a forked child is another process
        _OWN = (os.getpid(), proc_start_time(os.getpid()))
    return _OWN[1]


_OWN: tuple[int, int | None] | None = None


def owned(j: Journal) -> Journal:
    """`j`, now owned by this process (recovery takes a dead rollback's journal over)."""
    return replace(j, pid=os.getpid(), pid_start=_own_start())


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
    egress_policy: dict[str, Any] | None = None,
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
        egress_policy=egress_policy,
        pid=os.getpid(),
        pid_start=_own_start(),
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


def sweep_temps(name: str) -> None:
    """Remove the temporary files a killed writer of NAME's journal left (a stage or an atomic
    replace cut short). Only under the container's snapshot lock, where nobody else writes."""
    where = Path(rollback_journal(name)).parent
    # Exactly the names `fsutil` gives them: a container's name may hold dots, so a looser
    # match could take another container's temp file (`foo` and `foo.json.x`).
    ours = re.compile(rf"\.{re.escape(name)}\.json\.[0-9a-f]{{12}}\.tmp\Z")
    try:
        found = [n for n in os.listdir(where) if ours.match(n)]
    except OSError:
        return
    for n in found:
        with contextlib.suppress(OSError):
            os.unlink(where / n)


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
        raw = read_regular(p, MAX_BYTES)
    except NotRegularFile:
        raise _damaged(p, "not a regular file") from None
    except OSError as exc:
        raise LinpodxError(
            f"cannot read the rollback journal {p}: {exc.strerror}",
            "check the permissions of linpodx's state directory",
        ) from None
    if raw is None:
        return None
    if len(raw) > MAX_BYTES:
        raise _damaged(p, "too large")
    try:
        doc = strict_loads(raw)
        if not isinstance(doc, dict) or doc.get("version") != VERSION:
            raise ValueError("not a version 1 journal")
        j = Journal(**doc)
        _check(j, name)
    except (CanonicalError, TypeError, ValueError, binascii.Error) as exc:
        raise _damaged(p, str(exc)) from None
    return j


def _check(j: Journal, name: str) -> None:
    """Every field what a rollback writes: recovery renames and removes paths named here, so
    nothing in it may point anywhere a rollback of `name` would not have touched."""
    def want(ok: bool, what: str) -> None:
        if not ok:
            raise ValueError(what)

    want(j.container == name, "names another container")
    want(isinstance(j.rollback_id, str) and bool(ULID_RE.match(j.rollback_id)),
         "bad rollback id")
    want(isinstance(j.label, str) and bool(LABEL_RE.match(j.label)), "bad label")
    want(j.image == image_ref(name, j.label), "names another image")
    want(isinstance(j.orig_id, str) and bool(_HEX64.match(j.orig_id)), "bad container id")
    want(j.aside == aside_name(name, j.rollback_id), "bad aside name")
    want(isinstance(j.was_running, bool), "bad was_running")
    want(j.spec is None or isinstance(j.spec, str), "bad spec")
    want(j.step in STEPS, "unknown step")
    want(isinstance(j.pid, int) and not isinstance(j.pid, bool) and j.pid > 0, "bad pid")
    want(j.pid_start is None or (isinstance(j.pid_start, int)
                                 and not isinstance(j.pid_start, bool)), "bad pid start")
    want(isinstance(j.mounts, list), "bad mounts")
    for m in j.mounts:
        want(isinstance(m, dict) and set(m) == {"source", "target", "kind", "existed"},
             "a mount entry has other fields")
        src = m["source"]
        want(isinstance(src, str) and os.path.isabs(src) and os.path.normpath(src) == src
             and src != "/", "a mount source is not an absolute, normal path")
        want(isinstance(m["target"], str), "bad mount target")
        want(m["kind"] in (DIR, FILE), "bad mount kind")
        want(isinstance(m["existed"], bool), "bad mount existed flag")
    if j.egress_policy is not None:
        # Recovery writes it as the container's policy: only what `guard.policy_doc` writes.
        egresskeep.check(j.egress_policy)
    j.spec_bytes()


def aside_name(name: str, rollback_id: str) -> str:
    """The name the original container has while a rollback replaces it."""
    return f"{name}-rollback-{rollback_id[-10:].lower()}"


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
            when = "after it was undone" if j.step == "undone" else f"at step {j.step}"
            notes.append(
                f"a rollback of {name} to {j.label} was interrupted {when}; run "
                f"`linpodx snapshot recover {name}`"
            )
    return notes


def check_no_interrupted(name: str) -> None:
    """Refuse to act on container `name` while a rollback of it is running in another process
    or was interrupted and not yet recovered. The rollback itself (this process) passes.

    Cheap when there is no journal (one lstat), so the run paths can afford it.
    """
    try:
        if not rollback_pending(name):
            return
    except OSError as exc:
        # Not "no journal": a state dir we cannot search must not let a command through.
        raise LinpodxError(
            f"cannot check for an interrupted rollback of {name}: {exc.strerror}",
            "check the permissions of linpodx's state directory",
        ) from None
    j = read(name)
    if j is None or j.owned_here():
        return
    if j.owner_alive():
        raise LinpodxError(
            f"a rollback of {name} (to {j.label}) is in progress (pid {j.pid})",
            f"wait for it to finish, then retry; `linpodx ps --all` shows {name}",
        )
    if j.step == "undone":
        raise LinpodxError(
            f"a rollback of {name} to {j.label} was undone, but interrupted before {name} "
            "was started again",
            f"run `linpodx snapshot recover {name}` to start it again",
        )
    raise LinpodxError(
        f"a rollback of {name} to {j.label} was interrupted at step {j.step} and left {name} "
        "half done",
        f"run `linpodx snapshot recover {name}` to put {name} back as it was before the "
        "rollback (or finish it, if it had got that far)",
    )
