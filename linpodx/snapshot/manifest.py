"""The manifest of one snapshot: what was committed and which workspace archives belong to it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from linpodx.canonical import CanonicalError, strict_loads
from linpodx.errors import LinpodxError, NotFound
from linpodx.fsutil import NotRegularFile, atomic_write, read_regular
from linpodx.paths import snapshots_dir
from linpodx.snapshot.names import container_root, snapshot_dir
from linpodx.suggest import add_to_hint

MANIFEST = "manifest.json"
SCHEMA = 1


def write(directory: Path, data: dict[str, Any]) -> None:
    """Write a manifest atomically into `directory`."""
    atomic_write(directory / MANIFEST, (json.dumps(data, indent=1) + "\n").encode())


MAX_BYTES = 1 << 20  # a manifest is a few KiB


def _damaged(path: Path, why: str) -> LinpodxError:
    return LinpodxError(
        f"snapshot manifest is damaged: {path}: {why}",
        "remove the snapshot with `linpodx snapshot rm` and create it again",
    )


def read_dir(directory: Path) -> dict[str, Any]:
    """Read and sanity-check the manifest in `directory`."""
    path = directory / MANIFEST
    try:
        # No links, no FIFOs: a special file in its place must not hang `snapshot list`.
        raw = read_regular(path, MAX_BYTES)
        if raw is None:
            raise NotFound(f"snapshot manifest missing: {path}")
        if len(raw) > MAX_BYTES:
            raise ValueError("too large")
        data = strict_loads(raw.decode("utf-8"))
    except NotRegularFile:
        raise _damaged(path, "not a regular file") from None
    except (CanonicalError, ValueError, OSError) as exc:
        raise _damaged(path, str(exc)) from None
    if (
        not isinstance(data, dict)
        or data.get("schema") != SCHEMA
        or not isinstance(data.get("mounts"), list)
        or not isinstance(data.get("image_id"), str)
    ):
        raise LinpodxError(
            f"snapshot manifest is damaged or of an unknown version: {path}",
            "remove the snapshot with `linpodx snapshot rm` and create it again",
        )
    return data


def not_found(name: str, label: str) -> NotFound:
    hint = f"list the snapshots of {name} with `linpodx snapshot list {name}`"
    try:
        # The labels of NAME's snapshots, or (none there) the containers that have any.
        labels = _entries(container_root(name))
        hint = (
            add_to_hint(hint, label, labels)
            if labels
            else add_to_hint(hint, name, _entries(snapshots_dir()))
        ) or hint
    except OSError:
        pass  # a did-you-mean only words the hint
    return NotFound(f"snapshot not found: {name}, label {label}", hint)


def containers_like(name: str) -> str:
    """`did you mean `agent-1`?` when NAME has no snapshots and a container close to it has
    ("" otherwise): for `snapshot list NAME`, which finds none."""
    from linpodx.suggest import did_you_mean

    try:
        if _entries(container_root(name)):
            return ""
        return did_you_mean(name, _entries(snapshots_dir()))
    except (OSError, LinpodxError):
        return ""  # a did-you-mean only words a note


def _entries(directory: Path) -> list[str]:
    """The names of the directories in `directory` ([] if there is none)."""
    if not os.path.isdir(directory):
        return []
    return [e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith(".")]


def read(name: str, label: str) -> dict[str, Any]:
    """The manifest of snapshot NAME:LABEL; NotFound with a hint if there is none."""
    d = snapshot_dir(name, label)
    if not os.path.lexists(d / MANIFEST):
        raise not_found(name, label)
    return read_dir(d)
