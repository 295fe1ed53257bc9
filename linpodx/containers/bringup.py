"""Bringing a created container up: mount pins, (egress guard) -> `podman init` -> guard attach
-> `podman start`, and the clean-up after a failure."""

from __future__ import annotations

import contextlib
import json
import os
import time
from types import ModuleType
from typing import TypeVar

from linpodx.containers import state
from linpodx.containers.plan import check_mount_sources, needs_guard
from linpodx.containers.record import Outcome
from linpodx.containers.runner import podman
from linpodx.containers.state import spec_dir
from linpodx.errors import (
    EngineError,
    LinpodxError,
)
from linpodx.fsutil import atomic_write
from linpodx.output import note
from linpodx.paths import ensure_dir
from linpodx.podman import mountpin
from linpodx.profile.model import ProfileRef

_E = TypeVar("_E", bound=BaseException)


def egress_guard() -> ModuleType:
    # Imported when a container has an allowlist (or its guard is asked about), not for
    # every run.
    from linpodx.egress import guard

    return guard


def pin_mounts(name: str, ref: ProfileRef) -> tuple[str, ...]:
    """Check every mount source again (`check_mount_sources`) and write what was checked for
    the mount-check hook, which makes runc refuse to start the container unless each mount is
    that very directory (`linpodx.podman.mountpin`). Returns podman's global flags for every
    call that makes the mounts (`run`, `init`, `start`); none for a profile without mounts."""
    hooks = mountpin.setup(str(ensure_dir(spec_dir(name))), check_mount_sources(ref))
    return tuple(mountpin.hooks_flags(hooks))


def cleanup(
    name: str,
    why: _E,
    *,
    remove_spec: bool,
    guard_too: bool,
    outcome: Outcome | None = None,
) -> _E:
    """Remove what was created for NAME and add what happened to the error's hint (and to
    `outcome`); an error that is not a LinpodxError has no hint, so it is said on stderr."""
    leftover = podman().remove_quietly(name)
    if outcome is not None:
        outcome.removed = leftover is None
    if guard_too:
        with contextlib.suppress(Exception):
            egress_guard().detach(name)
    if remove_spec:
        state.remove_spec(name)
    said = (
        f"the container {name} was removed again (nothing was left half-created)"
        if leftover is None
        else f"removing {name} also failed ({leftover}); remove it with `podman rm -f {name}`"
    )
    if isinstance(why, LinpodxError):
        why.hint = f"{why.hint}; {said}" if why.hint else said
    else:
        say(f"note: {said}")
    return why


def say(text: str) -> None:
    with contextlib.suppress(Exception):  # stderr gone: nothing more to do
        note(text)


def _pid_alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


# A `poststop` OCI hook for `--rm` containers: podman removes such a container when it ends
# (also when it exits on its own, long after `linpodx run -d --rm` returned), and runc runs
# this at that removal. It removes the container's state dir (run spec, mount pins), but only
# if the spec there is still this container's (same id): never a newer container's files.
_RM_HOOK_SCRIPT = (
    "PATH=/usr/bin:/bin; IFS= read -r state; id=${state#*'\"id\":\"'}; id=${id%%'\"'*}; "
    "case $id in ''|*[!0-9a-f]*) exit 0 ;; esac; "
    "grep -qF \"\\\"container_id\\\": \\\"$id\\\"\" \"$1/spec.json\" && rm -rf -- \"$1\"; exit 0"
)


def rm_cleanup_flags(name: str) -> tuple[str, ...]:
    """podman's global flags for the `--rm` cleanup hook of NAME (written under its state dir)."""
    where = spec_dir(name)
    hooks = ensure_dir(where / "rm-hooks")
    hook = {
        "version": "1.0.0",
        "hook": {"path": "/bin/sh", "args": ["/bin/sh", "-c", _RM_HOOK_SCRIPT, "sh", str(where)]},
        "when": {"always": True},
        "stages": ["poststop"],
    }
    atomic_write(hooks / "linpodx-rm.json", json.dumps(hook).encode(), durable=False)
    return (f"--hooks-dir={hooks}",)


def bring_up(
    name: str,
    ref: ProfileRef,
    *,
    start: bool,
    resolv: str | None = None,
    rm_cleanup: bool = False,
    outcome: Outcome | None = None,
) -> None:
    """(guard.prepare) -> init -> guard attach (when the profile has an allowlist) -> start
    (unless `start` is False, when the caller starts it attached to a terminal).

    prepare() runs again on every bring-up: it rewrites the resolv.conf the container bind-mounts
    (a detach may have removed it) and must hand back the path the container was created with.

    The mount sources are checked and pinned first (`pin_mounts`, which opens the mount
    gate): `podman init` (or `start`) makes the mounts, and the hook it is given checks them
    and closes the gate. It is closed here too once that call returned (or anything failed),
    so that only linpodx's own starts ever find it open. When nothing here makes the mounts
    (`start` False and no guard, so no `podman init`), the gate stays open for the caller's
    `attached_start`, whose hook closes it.

    `rm_cleanup` (a `--rm` container): podman also gets the hook that removes the state dir
    when podman removes the container (`rm_cleanup_flags`).
    """
    outcome = outcome or Outcome("", name)
    outcome.step = "state_dir"
    extra = rm_cleanup_flags(name) if rm_cleanup else ()
    try:
        mounted = _bring_up_gated(name, ref, start=start, resolv=resolv, extra=extra, at=outcome)
    except BaseException:
        mountpin.close_gate(str(spec_dir(name)))
        raise
    if mounted:
        mountpin.close_gate(str(spec_dir(name)))


def _bring_up_gated(
    name: str,
    ref: ProfileRef,
    *,
    start: bool,
    resolv: str | None,
    extra: tuple[str, ...],
    at: Outcome,
) -> bool:
    """`bring_up`'s steps (each named in `at`); whether a podman call made the mounts."""
    at.step = "mount_check"
    mounts = (*pin_mounts(name, ref), *extra)
    if needs_guard(ref):
        at.step = "egress_guard"
        guard = egress_guard()
        got = str(guard.prepare(name, ref))
        if resolv and got != resolv:
            raise EngineError(
                f"the egress guard's resolv.conf moved ({got}); the container mounts {resolv}",
                f"recreate the container (`linpodx rm {name}` then `linpodx run`)",
            )
        # podman 4.3: right after a stop, the previous run's late exit cleanup can undo a fresh
        # `podman init` (seen about 1 in 6 quick stop/start cycles here); the guard then finds
        # the container's process gone and fails closed. One more init after a pause is safe:
        # nothing has run yet, and a second failure is reported as it is.
        for attempt in (1, 2):
            if attempt == 2:
                # Check again, and reopen the gate the hook closed.
                at.step = "mount_check"
                mounts = (*pin_mounts(name, ref), *extra)
            at.step = "podman_init"
            podman().init(name, mounts)
            pid = guard.init_pid(name) or podman().container_pid(name)
            at.step = "egress_guard"
            try:
                guard.attach(name, pid, ref)
                break
            except Exception as exc:  # any guard failure means: do not start
                if attempt == 1 and pid > 0 and not _pid_alive(pid):
                    time.sleep(1.0)
                    continue
                if isinstance(exc, LinpodxError):
                    raise
                raise EngineError(
                    f"egress guard failed: {type(exc).__name__}: {exc}", "see `linpodx doctor`"
                ) from exc
    if start:
        at.step = "podman_start"
        podman().start(name, mounts)
    return start or needs_guard(ref)
