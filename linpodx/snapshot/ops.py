"""The container operations a rollback needs, delegated to the containers service.

Creating and starting a linpodx container (same profile revision, mounts, limits, labels and
egress guard) is the containers service's job: rollback never builds podman argv itself, so a
rolled-back container is exactly what `linpodx run`/`linpodx start` would make.
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Any

from linpodx import paths, proc
from linpodx.errors import LinpodxError
from linpodx.fsutil import atomic_write

STOP_TIMEOUT_SECONDS = 10


def spec_path(name: str) -> Path:
    return paths.containers_dir() / name / "spec.json"


def _containers() -> Any:
    try:
        # Imported by name: the containers service lands separately and imports us back.
        containers = importlib.import_module("linpodx.containers")
    except ImportError as exc:
        raise LinpodxError(
            f"the containers service is not available: {exc}",
            "this linpodx build cannot recreate containers",
        ) from None
    return containers


def check_recreatable(name: str) -> None:
    """Refuse (before anything changes) when the container could not be recreated."""
    if not spec_path(name).is_file():
        raise LinpodxError(
            f"no run spec recorded for {name}; it cannot be recreated",
            "containers created by this linpodx version keep one; nothing was changed",
        )
    mod = _containers()
    for fn in ("recreate", "start"):
        if not callable(getattr(mod, fn, None)):
            raise LinpodxError(f"the containers service lacks {fn}(); nothing was changed")


def save_spec(name: str) -> bytes | None:
    """The run spec's bytes, to put back if the rollback is undone."""
    try:
        return spec_path(name).read_bytes()
    except FileNotFoundError:
        return None


def restore_spec(name: str, data: bytes | None) -> None:
    if data is not None:
        atomic_write(spec_path(name), data)


def stop(name: str) -> None:
    """Stop the container (its egress guard ends with it)."""
    proc.run(
        ["podman", "stop", "--time", str(STOP_TIMEOUT_SECONDS), name],
        what="podman stop",
        timeout=STOP_TIMEOUT_SECONDS + 60,
    )


def create_from(name: str, image: str) -> str:
    """Create and start `name` from `image` with its recorded spec; returns the new id."""
    result = _containers().recreate(name, image=image)
    cid = getattr(result, "container_id", None) or (
        result.get("container_id") if isinstance(result, dict) else None
    )
    return str(cid or "")


def start(name: str) -> None:
    """Start an existing linpodx container the linpodx way (egress guard attached)."""
    _containers().start(name)


def remove_new(name: str, container_id: str) -> None:
    """Remove a container the rollback created (and its egress guard)."""
    proc.run(["podman", "rm", "--force", "--time", "0", container_id], what="podman rm")
    with contextlib.suppress(Exception):
        from linpodx.egress import guard

        guard.detach(name)
