"""Stopping, starting, removing and recreating a container for snapshots and rollback, through
the containers service.

Creating and starting a linpodx container (same profile revision, mounts, limits, labels and
egress guard) is the containers service's job: rollback never builds podman argv itself, so a
rolled-back container is exactly what `linpodx run`/`linpodx start` would make.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from linpodx import containers, paths
from linpodx.containers.runenv import RunEnv
from linpodx.errors import LinpodxError
from linpodx.fsutil import atomic_write, present
from linpodx.namelock import NameLock
from linpodx.podman import engine
from linpodx.snapshot import egresskeep

STOP_TIMEOUT_SECONDS = 5  # the state is being replaced; the grace only matters for an undo


def spec_path(name: str) -> Path:
    return paths.containers_dir() / name / "spec.json"


def check_recreatable(name: str, profile_id: str) -> None:
    """Refuse (before anything changes) when the container could not be recreated."""
    # Anything there (a FIFO, a link) is not "none": `load_spec` below calls it damaged.
    if not present(spec_path(name)):
        raise LinpodxError(
            f"no run spec recorded for {name}; it cannot be recreated",
            "containers created by this linpodx version keep one; nothing was changed",
        )
    containers.load_spec(name)  # a damaged spec is refused here, not halfway through
    if not profile_id:
        raise LinpodxError(
            f"container {name} has no linpodx.profile_id label; it cannot be recreated",
            "nothing was changed",
        )
    containers.profile_by_id(profile_id)  # the revision must still be known to the store


def save_spec(name: str) -> bytes | None:
    """The run spec's bytes, to put back if the rollback is undone."""
    return containers.read_spec_bytes(name)


def restore_spec(name: str, data: bytes | None) -> None:
    """Put the run spec back as it was before the rollback."""
    if data is not None:
        atomic_write(spec_path(name), data)


def detach_guard(name: str) -> None:
    with contextlib.suppress(Exception):
        from linpodx.egress import guard

        guard.detach(name)


def stop(name: str, egress_policy: dict[str, Any] | None = None) -> None:
    """Stop the container the linpodx way (audited) and let go of its egress guard; its policy
    `egress_policy` (`egresskeep`) is put back at once, so the name's policy file is never
    older than what the container had been given (a re-apply meanwhile finds it too)."""
    keep = egresskeep.newest(egress_policy, egresskeep.current_or_none(name))
    containers.stop(name, timeout=STOP_TIMEOUT_SECONDS)
    detach_guard(name)
    egresskeep.put_back(name, keep)


def create_from(
    name: str,
    image: str,
    profile_id: str,
    *,
    start: bool,
    egress_policy: dict[str, Any] | None = None,
    env_from: str | None = None,
) -> str:
    """Create `name` from `image` under profile revision `profile_id` with its recorded run spec
    (command, hostname, tty) and start it; returns the new container id.

    The containers service's `create_and_start` builds the argv, audits `container.run`,
    prepares and attaches the egress guard and creates `$HOME`, exactly as for `linpodx run`.
    `egress_policy`, the policy the original had been given, is put in place first: the
    guard's `prepare` keeps a newer revision than `profile_id`'s, as at a `linpodx start`, so
    the new guard enforces it from its first lookup (never the creation revision's allowlist).
    `env_from`: the container (the original) whose values of the run's own variables the new
    one gets (`run_env_of`).
    """
    doc = containers.load_spec(name)
    ref = containers.profile_by_id(profile_id)
    spec = containers.spec_from_record(doc, ref, image=image, name=name, hostname_of=name)
    keys = tuple(str(k) for k in doc.get("env_keys") or ())  # (checked by spec_from_record)
    env = run_env_of(env_from, keys) if env_from and keys else None
    egresskeep.put_back(name, egress_policy)
    info = containers.create_and_start(spec, ref, start=True, env=env)
    if not start:
        # Left as `linpodx stop` leaves a container: with its policy file, for the next start.
        keep = egresskeep.newest(egress_policy, egresskeep.current_or_none(name))
        containers.stop(name, timeout=STOP_TIMEOUT_SECONDS)
        detach_guard(name)
        egresskeep.put_back(name, keep)
    return info.container_id


def run_env_of(container_id: str, keys: tuple[str, ...]) -> RunEnv:
    """The values of a run's own variables `keys` as container `container_id` holds them: a
    snapshot image keeps their names only (`engine.commit`), so the container a rollback makes
    gets them from the original, as `linpodx run` gave them (a memory file, never argv)."""
    env = (engine.inspect(container_id).get("Config") or {}).get("Env") or []
    values: dict[str, str] = {}
    for entry in env:
        key, eq, value = str(entry).partition("=")
        if eq and key in keys:
            values[key] = value
    kept = tuple(k for k in keys if k in values)
    content = "".join(f"{k}={values[k]}\n" for k in kept).encode()
    return RunEnv(keys=kept, content=content)


def hold_name(name: str) -> NameLock:
    """The container name's lock of the containers service (`lock_name`), for the whole of a
    rollback or a recovery: `linpodx start/stop/rm/run` of NAME in another process wait for
    it instead of acting between the rollback's checks and its journal. The service's own
    calls made meanwhile (stop, create, start, remove) take it again without waiting."""
    return containers.lock_name(name)


def start(name: str) -> None:
    """Start an existing linpodx container the linpodx way (egress guard attached)."""
    containers.start(name)


def remove_new(name: str, container_id: str) -> None:
    """Remove a container the rollback created (its guard and spec dir go too; the caller puts
    the original spec back)."""
    try:
        containers.remove(name, force=True)
    except LinpodxError:
        engine.remove(container_id, force=True)
        detach_guard(name)
