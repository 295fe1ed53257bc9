"""The container a snapshot operation acts on: what `podman inspect` says of it, read once into
a typed view, and the check that linpodx manages it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from linpodx.errors import NotFound, NotManaged
from linpodx.podman.runline import MANAGED_LABEL
from linpodx.snapshot import runner
from linpodx.suggest import add_to_hint

# The labels that tie a container to its profile revision: a rolled-back one keeps them all.
PROFILE_LABELS = (
    "linpodx.profile",
    "linpodx.profile_id",
    "linpodx.revision",
    "linpodx.audit_hash",
)


@dataclass(frozen=True)
class Container:
    """The facts of one `podman inspect` document that snapshots and rollback go by."""

    id: str
    name: str
    """Without podman's leading `/`."""
    status: str
    """`running`, `paused`, `exited`, … ("" if podman said none)."""
    running: bool
    paused: bool
    """Paused (the freezer), by either of podman's two ways of saying it."""
    auto_remove: bool
    """Run with `--rm`: stopping it removes it."""
    image_name: str
    labels: Mapping[str, str]

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> Container:
        state = info.get("State") or {}
        return cls(
            id=str(info.get("Id", "")),
            name=str(info.get("Name", "")).lstrip("/"),
            status=str(state.get("Status", "")),
            running=bool(state.get("Running")),
            paused=bool(state.get("Paused")) or state.get("Status") == "paused",
            auto_remove=bool((info.get("HostConfig") or {}).get("AutoRemove")),
            image_name=str(info.get("ImageName", "")),
            labels=labels_of(info),
        )

    @property
    def managed(self) -> bool:
        return self.labels.get(MANAGED_LABEL) == "1"


def inspect_container(name: str) -> dict[str, Any]:
    """`podman inspect` of a container; NotFound if it does not exist."""
    return runner.host().inspect_container(name)


def labels_of(info: Mapping[str, Any]) -> dict[str, str]:
    cfg = info.get("Config") or {}
    labels = cfg.get("Labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def require_managed(name: str) -> dict[str, Any]:
    """Inspect `name` and refuse it unless linpodx manages it."""
    try:
        info = inspect_container(name)
    except NotFound as err:
        from linpodx.containers import managed_names  # only on this error's path

        err.hint = add_to_hint(err.hint, name, managed_names())
        raise
    if labels_of(info).get(MANAGED_LABEL) != "1":
        raise NotManaged(
            f"{name} is not a linpodx container (label {MANAGED_LABEL}=1 missing)",
            "linpodx only snapshots and rolls back containers it created (`linpodx ps`)",
        )
    return info
