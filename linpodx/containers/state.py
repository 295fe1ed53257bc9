"""What linpodx keeps per container under `containers_dir()/NAME`: the run spec, the name's
lock, their removal; and the refusal to act on a container a rollback is replacing."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from linpodx import namelock
from linpodx.canonical import strict_loads
from linpodx.containers.runner import podman
from linpodx.errors import (
    InvalidInput,
    LinpodxError,
    NotFound,
)
from linpodx.fsutil import NotRegularFile, atomic_write, read_small
from linpodx.paths import containers_dir, rollback_pending
from linpodx.podman.runline import validate_name

SPEC_VERSION = 1
"""The run spec's format (`load_spec` refuses any other)."""


def refuse_if_rolling_back(name: str) -> None:
    """Refuse to act on NAME while a rollback of it runs in another process or was interrupted
    (`linpodx.snapshot.journal.check_no_interrupted`). Without a journal (one lstat,
    `paths.rollback_pending`) the journal's module (and the workspace and egress modules it
    checks a journal with) is not loaded at all."""
    with contextlib.suppress(OSError):  # cannot tell: the journal's reader says why, and refuses
        if not rollback_pending(name):
            return
    from linpodx.snapshot import journal  # only with a journal there

    journal.check_no_interrupted(name)


def spec_dir(name: str) -> Path:
    """containers_dir()/NAME."""
    return containers_dir() / validate_name(name)


def spec_path(name: str) -> Path:
    """containers_dir()/NAME/spec.json."""
    return spec_dir(name) / "spec.json"


RENAME_SCAN_MAX = 4096
"""Run specs `spec_owners` reads at most (one per container linpodx keeps state for)."""


def spec_owners() -> dict[str, list[str]]:
    """Container id -> the names whose run specs hold it (sorted), for the run specs linpodx
    keeps (at most RENAME_SCAN_MAX read). Damaged or unreadable specs are skipped: this only
    words an error or a note better; it never acts."""
    owners: dict[str, list[str]] = {}
    try:
        entries = sorted(os.listdir(containers_dir()))[:RENAME_SCAN_MAX]
    except OSError:
        return owners
    for entry in entries:
        if entry.startswith("."):
            continue
        with contextlib.suppress(LinpodxError, OSError, ValueError):
            cid = load_spec(entry).get("container_id")
            if isinstance(cid, str) and cid:
                owners.setdefault(cid, []).append(entry)
    return owners


def renamed_from(
    container_id: str, name: str, owners: dict[str, list[str]] | None = None
) -> str | None:
    """The name whose run spec belongs to `container_id`, if it is not `name`: the container
    was renamed with `podman rename`. `owners`: `spec_owners()`, read once for many rows."""
    if not container_id:
        return None
    found = (spec_owners() if owners is None else owners).get(container_id, [])
    return next((entry for entry in found if entry != name), None)


def save_spec(name: str, doc: dict[str, Any]) -> None:
    """Write the run spec atomically (0600 in a 0700 dir)."""
    atomic_write(spec_path(name), json.dumps(doc, indent=2, sort_keys=True).encode() + b"\n")


MAX_SPEC_BYTES = 1 << 20
"""A run spec is a few KiB; anything near this is not one linpodx wrote."""


def read_spec_bytes(name: str) -> bytes | None:
    """The bytes of NAME's run spec, None if there is none. Read as the store reads its files
    (`fsutil.read_regular`): a FIFO in its place must not hang a command holding the name's
    lock, a link is not a file linpodx wrote. InvalidInput if it is not a regular file of at
    most MAX_SPEC_BYTES (damaged, as bad JSON in it is)."""
    try:
        return read_small(spec_path(name), MAX_SPEC_BYTES)
    except NotRegularFile as exc:
        raise _damaged_spec(name, f"not a regular file of at most {MAX_SPEC_BYTES} bytes") from exc
    except OSError as exc:
        raise _damaged_spec(name, exc.strerror or str(exc)) from None


def _damaged_spec(name: str, why: str) -> InvalidInput:
    return InvalidInput(
        f"run spec of {name} is damaged: {why}", f"remove it with `linpodx rm {name}`"
    )


def load_spec(name: str) -> dict[str, Any]:
    """The run spec of NAME (NotFound if linpodx has none; InvalidInput if it is damaged)."""
    raw = read_spec_bytes(name)
    if raw is None:
        raise NotFound(
            f"no linpodx run spec for container {name}",
            "it was not created by `linpodx run` (see `linpodx ps --all`)",
        ) from None
    try:
        doc = strict_loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise InvalidInput(
            f"run spec of {name} is damaged: {exc}", f"remove it with `linpodx rm {name}`"
        ) from exc
    if not isinstance(doc, dict) or doc.get("version") != SPEC_VERSION:
        raise InvalidInput(
            f"run spec of {name} has an unknown format", f"remove it with `linpodx rm {name}`"
        )
    for key, kinds in _SPEC_FIELDS.items():
        value = doc.get(key, ...)
        ok = isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool))
        if ok and key == "command":
            ok = all(isinstance(c, str) for c in value)
        if not ok:
            what = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise InvalidInput(
                f"run spec of {name} is damaged: {key!r} is missing or not a {what}",
                f"remove it with `linpodx rm {name}`",
            )
    return doc


_SPEC_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,), "hostname": (str, type(None)), "container_id": (str,), "image": (str,),
    "profile": (str,), "profile_id": (str,), "revision": (int,), "audit_hash": (str,),
    "command": (list,), "interactive": (bool,), "tty": (bool,), "rm": (bool,),
}  # fmt: skip
"""What every run spec of this version has held from the start, and what `start` and snapshot
rollback read from it: a spec without one of them was not written by linpodx."""


def remove_spec(name: str) -> None:
    """Remove NAME's state dir (run spec, pins, the guard's files)."""
    where = spec_dir(name)
    # An egress guard's last status write ("stopped") can land while the tree is removed: its
    # file appears after rmtree listed the directory, and the rmdir then fails (seen with
    # pasta, which stops later than slirp4netns). The guard writes nothing after that and never
    # makes the directory again (`Reporter.write`), so another pass finishes the job.
    for _ in range(REMOVE_PASSES):
        shutil.rmtree(where, ignore_errors=True)
        if not os.path.lexists(where):
            return
        time.sleep(0.05)


REMOVE_PASSES = 3


def lock_name(name: str) -> namelock.NameLock:
    """Take NAME's lock (`linpodx.namelock`): held while a command writes or removes what lives
    under `containers_dir()/NAME`, so that a second run of the name finds it taken and leaves
    the first one's files alone."""
    try:
        return namelock.acquire(validate_name(name))
    except OSError as exc:
        raise LinpodxError(
            f"could not lock the container name {name}: {exc.strerror or exc}",
            f"check that linpodx's state dir ({containers_dir()}) is writable",
        ) from exc


def forget(name: str, container_id: str | None = None, *, ask_podman: bool = True) -> None:
    """Drop the state dir of a `--rm` container that podman already removed, holding the
    name's lock; not if a container of that name exists (`ask_podman`), nor if the run spec
    there is another container's than `container_id` (a run of the name that came after)."""
    with contextlib.suppress(LinpodxError), lock_name(name):
        if ask_podman and podman().exists(name):
            return
        if container_id is not None and _spec_container_id(name) not in (None, container_id):
            return
        remove_spec(name)


def _spec_container_id(name: str) -> str | None:
    """The container id in NAME's run spec, or None if it has no readable one."""
    try:
        raw = read_small(spec_path(name), MAX_SPEC_BYTES)
        doc = json.loads(raw) if raw is not None else None
    except (OSError, ValueError, NotRegularFile):
        return None
    cid = doc.get("container_id") if isinstance(doc, dict) else None
    return cid if isinstance(cid, str) else None
