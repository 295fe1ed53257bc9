"""`linpodx ps`'s rows, importing only what listing needs (podman's list, the guard's state
files): `linpodx ps` skips typer to stay within 2x `podman ps` (bench/bench_cli.py), and the
rest of the container service (plan, pipeline, profile model) costs more to import than the
listing takes. `linpodx.containers.manage` and the package re-export these."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from linpodx.containers.runner import start_listing
from linpodx.egress import state as egress_state
from linpodx.errors import InvalidInput
from linpodx.fsutil import present
from linpodx.paths import containers_dir
from linpodx.podman.runline import validate_name


def egress_status(name: str) -> str:
    """The guard's view (`none`, `healthy`, `down`), or `unknown` if it cannot say."""
    try:
        return str(egress_state.status(name))
    except Exception:
        return "unknown"


def _renamable(name: str) -> bool:
    """A name linpodx could have given (`podman rename` takes longer ones, which have no state
    dir of their own and must not make `ps` fail)."""
    try:
        validate_name(name)
    except InvalidInput:
        return False
    return True


def revision_of(label: object) -> int | None:
    """The `linpodx.revision` label as the number it is (None if it is not one: anyone with
    podman can set labels)."""
    text = str(label or "")
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def ps(
    all_states: bool, listed: Callable[[], list[dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    """Rows for `linpodx ps`: linpodx containers only. `listed`: podman's listing, already
    started (`runner.start_listing`)."""
    rows = []
    owners: dict[str, list[str]] | None = None  # run specs by container id, read once
    for r in (listed or start_listing(all_states))():
        names = r.get("Names") or []
        name = str(names[0]) if isinstance(names, list) and names else str(r.get("Name", ""))
        labels = r.get("Labels")
        if not isinstance(labels, dict):  # (null for none; anything else is no label either)
            labels = {}
        row: dict[str, Any] = {
            "name": name,
            "container_id": str(r.get("Id", "")),
            "profile": str(labels.get("linpodx.profile", "")),
            # A number, as in `run --json` and `sandbox list`; None for a label that is not one.
            "revision": revision_of(labels.get("linpodx.revision")),
            "state": str(r.get("State", "")),
            "egress": egress_status(name),
            "image": str(r.get("Image", "")),
        }
        # containers_dir()/NAME/spec.json is `state.spec_path` (a valid name: `_renamable`).
        if (
            row["egress"] == "none"
            and _renamable(name)
            and not present(containers_dir() / name / "spec.json")
        ):
            # Renamed with `podman rename`: its guard's state is under the name linpodx gave
            # it, and "none" would hide a guard that runs (or one that is down).
            from linpodx.containers.state import renamed_from, spec_owners

            if owners is None:
                owners = spec_owners()
            was = renamed_from(str(r.get("Id", "")), name, owners)
            if was is not None:
                row["egress"] = egress_status(was)
                row["renamed_from"] = was
        rows.append(row)
    rows.sort(key=lambda x: x["name"])
    return rows
