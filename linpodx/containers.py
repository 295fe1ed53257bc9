"""The container service: run, start, stop, rm, exec, with audit before every action.

Sequence for a new container (`create_and_start`):
  audit `container.run` -> [egress: guard.prepare writes resolv.conf] -> `podman create`
  (`--network=none`, argv from the pure builder) -> create `$HOME` in the rootfs ->
  [egress: `podman init` -> guard.attach(name, pid, profile)] -> `podman start`.
Any failure after `podman create` removes what was created and says so. A container is never
started unless its `container.run`/`container.start` record is in the administrative chain.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from linpodx import events, namelock, runplan
from linpodx.canonical import strict_loads
from linpodx.errors import (
    Denied,
    EngineError,
    InvalidInput,
    LinpodxError,
    NotFound,
    UsageError,
)
from linpodx.fsutil import NotRegularFile, atomic_write, present, read_small
from linpodx.output import note
from linpodx.paths import containers_dir, ensure_dir, rollback_pending
from linpodx.podman import engine, flags, mountpin, probe, seccomp
from linpodx.podman.argv import (
    MANAGED_LABEL,
    CreateSpec,
    HostLimits,
    build_create_argv,
    build_run_argv,
    profile_flags,
)
from linpodx.podman.runline import validate_image, validate_name
from linpodx.podman.spawn import Child
from linpodx.profile import hostpaths
from linpodx.profile.model import BUILTIN_ID, ProfileRef, builtin_ref

if TYPE_CHECKING:
    from linpodx.profile.store import StoredProfile

_E = TypeVar("_E", bound=BaseException)

SPEC_VERSION = 1


@dataclass(frozen=True)
class RunRequest:
    """What `linpodx run` was asked for."""

    image: str
    name: str | None = None
    profile: str | None = None
    """Applied profile name; None means the built-in default profile."""
    command: tuple[str, ...] = ()
    interactive: bool = False
    tty: bool = False
    detach: bool = False
    rm: bool = False


@dataclass(frozen=True)
class ContainerInfo:
    """What the CLI prints about a container."""

    name: str
    container_id: str
    state: str
    profile: str
    revision: int
    image: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


# --- profiles -------------------------------------------------------------------------------


def _ref_of(stored: StoredProfile) -> ProfileRef:
    return ProfileRef(
        profile=stored.profile,
        name=stored.name,
        profile_id=stored.profile_id,
        revision=stored.revision,
        audit_hash=stored.audit_hash,
        applied_at=stored.applied_at,
    )


def resolve_profile(name: str | None) -> ProfileRef:
    """An applied profile by name (NotFound otherwise), or the built-in default for None."""
    if name is None:
        return builtin_ref()
    from linpodx.profile import store  # not on every command's path (`ps`, `logs`)

    return _ref_of(store.get(name))


def profile_by_id(profile_id: str) -> ProfileRef:
    """The exact revision a container was created with (from its spec / labels)."""
    if profile_id == BUILTIN_ID:
        return builtin_ref()
    from linpodx.profile import store

    return _ref_of(store.get_by_id(profile_id))


# --- audit ----------------------------------------------------------------------------------


def audit(event_type: str, data: dict[str, Any]) -> None:
    """Append to the administrative chain BEFORE the action; AuditError means: do not act."""
    from linpodx.audit.chain import admin_chain, keep_reserve  # not on the fast run path

    admin_chain().append(event_type, data)
    keep_reserve()


def audit_stopping(event_type: str, data: dict[str, Any]) -> None:
    """`audit` for stop and rm, which go ahead on a full state dir (`append_stopping`), saying
    so on stderr."""
    from linpodx.audit.chain import append_stopping, keep_reserve
    from linpodx.output import note

    warning = append_stopping(event_type, data)
    if warning is None:
        keep_reserve()
        return
    with contextlib.suppress(OSError):
        note(warning)


def _emit(event_type: str, **data: Any) -> None:
    # Events are notifications, not truth (the chain is): a failed emit must not undo an action
    # that is already audited and done.
    with contextlib.suppress(OSError):
        events.emit(event_type, **data)


REASON_MAX = 300
"""Characters of an error message an outcome record keeps."""


class Outcome:
    """How far a recorded run (`container.run`) or start (`container.start`) got, for the
    outcome record it gets if it fails: `container.run.failed` / `container.start.failed`."""

    def __init__(self, record: str, name: str) -> None:
        self.record = record
        self.name = name
        self.step = "prepare"
        """What was being done when it failed (a short constant, e.g. `podman_create`)."""
        self.created = False
        """podman created the container (a run) before the failure."""
        self.removed = False
        """The clean-up removed it again (a run), or stopped it (a start)."""

    def __enter__(self) -> Outcome:
        return self

    def __exit__(self, _typ: object, exc: BaseException | None, _tb: object) -> None:
        """Leaving a `with outcome:` block by an exception records the failure (and lets the
        exception go on)."""
        if exc is not None:
            self.failed(exc)

    def failed(self, exc: BaseException) -> None:
        """Append the `<record>.failed` record for `exc`. It records what already happened and
        cannot undo anything: if it cannot be written, that is a warning on stderr and `exc`
        stays the error reported (with its exit code)."""
        fate: dict[str, bool | str]
        if self.record == "container.start":
            fate = {"stopped": self.removed}
        else:
            container = "removed" if self.removed else "left"
            fate = {"container": container if self.created else "not_created"}
        data = {"name": self.name, "step": self.step, **_reason(exc), **fate}
        try:
            audit(f"{self.record}.failed", data)
        except Exception as err:  # any: it must not replace the error being reported
            said = err.message if isinstance(err, LinpodxError) else type(err).__name__
            with contextlib.suppress(Exception):
                note(
                    f"warning: could not record {self.record}.failed for {self.name} in the "
                    f"audit log: {said}"
                )


def _reason(exc: BaseException) -> dict[str, str]:
    """What an outcome record says about an error: its type and linpodx's own message (never
    podman's stderr, argv or an exception's text, which may hold anything), shortened."""
    if isinstance(exc, LinpodxError):
        message = exc.message.splitlines()[0] if exc.message else ""
        if len(message) > REASON_MAX:
            message = message[: REASON_MAX - 1] + "…"
    elif isinstance(exc, OSError) and exc.strerror:
        message = exc.strerror  # the C library's fixed text ("No space left on device")
    else:
        message = "unexpected error" if isinstance(exc, Exception) else "interrupted"
    return {"error": type(exc).__name__, "reason": message}


# --- egress guard --------------------------------------------------------------------------


def _guard() -> ModuleType:
    # Imported when a container has an allowlist (or its guard is asked about), not for
    # every run.
    from linpodx.egress import guard

    return guard


def needs_guard(ref: ProfileRef) -> bool:
    """A non-empty allowlist means filtered network attached after `podman init`."""
    return bool(ref.profile.network.egress_dns_allowlist)


def egress_status(name: str) -> str:
    """The guard's view (`none`, `healthy`, `down`), or `unknown` if it cannot say."""
    from linpodx.egress import guard

    try:
        return str(guard.status(name))
    except Exception:
        return "unknown"


# --- rollbacks -------------------------------------------------------------------------------


def refuse_if_rolling_back(name: str) -> None:
    """Refuse to act on NAME while a rollback of it runs in another process or was interrupted
    (`linpodx.snapshot.journal.check_no_interrupted`). Without a journal (one lstat,
    `paths.rollback_pending`) the snapshot package is not loaded at all."""
    with contextlib.suppress(OSError):  # cannot tell: the journal's reader says why, and refuses
        if not rollback_pending(name):
            return
    from linpodx.snapshot import journal  # only with a journal there: snapshot sits above us

    journal.check_no_interrupted(name)


# --- specs ----------------------------------------------------------------------------------


def spec_dir(name: str) -> Path:
    """containers_dir()/NAME."""
    return containers_dir() / validate_name(name)


def spec_path(name: str) -> Path:
    """containers_dir()/NAME/spec.json."""
    return spec_dir(name) / "spec.json"


RENAME_SCAN_MAX = 4096
"""Run specs `_renamed_from` reads at most (one per container linpodx keeps state for)."""


def _renamed_from(container_id: str, name: str) -> str | None:
    """The name whose run spec belongs to `container_id`, if it is not `name`: the container
    was renamed with `podman rename`. Damaged or unreadable specs are skipped (this only
    words an error better; it never acts)."""
    if not container_id:
        return None
    try:
        entries = sorted(os.listdir(containers_dir()))[:RENAME_SCAN_MAX]
    except OSError:
        return None
    for entry in entries:
        if entry == name or entry.startswith("."):
            continue
        with contextlib.suppress(LinpodxError, OSError, ValueError):
            if load_spec(entry).get("container_id") == container_id:
                return entry
    return None


def _spec_doc(
    spec: CreateSpec, ref: ProfileRef, container_id: str, created_at: str
) -> dict[str, Any]:
    return {
        "version": SPEC_VERSION,
        **_run_record(spec, ref),
        "hostname": spec.hostname,
        "container_id": container_id,
        "rootless": spec.rootless,
        "resolv_conf": spec.resolv_conf,
        "created_at": created_at,
    }


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


def _remove_spec(name: str) -> None:
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


# --- building ---------------------------------------------------------------------------------


def check_mount_sources(ref: ProfileRef) -> list[mountpin.Pin]:
    """Check every mount source of the profile on the host again, as `sandbox apply` did:
    InvalidInput if one is now missing, sensitive, or a symlink to something sensitive (an
    agent with a writable mount can turn a path into one between two runs). Returns what was
    checked, pinned: (device, inode, target) per mount (`linpodx.podman.mountpin`)."""
    pins: list[mountpin.Pin] = []
    for m in ref.profile.mounts:
        ident, problem, hint = hostpaths.pin_mount_source(m.source)
        if problem or ident is None:
            raise InvalidInput(
                f"profile {ref.name}: {problem}",
                f"{hint + '; ' if hint else ''}it was checked when the profile was applied and is "
                "checked again before every start; fix the path on the host or re-apply",
            )
        pins.append((ident[0], ident[1], m.target))
    return pins


def pin_mounts(name: str, ref: ProfileRef) -> tuple[str, ...]:
    """Check every mount source again (`check_mount_sources`) and write what was checked for
    the mount-check hook, which makes runc refuse to start the container unless each mount is
    that very directory (`linpodx.podman.mountpin`). Returns podman's global flags for every
    call that makes the mounts (`run`, `init`, `start`); none for a profile without mounts."""
    hooks = mountpin.setup(str(ensure_dir(spec_dir(name))), check_mount_sources(ref))
    return tuple(mountpin.hooks_flags(hooks))


def host_limits() -> HostLimits:
    """The host facts a container's argv needs, with linpodx's seccomp profile written
    (`linpodx.podman.seccomp`: once per content)."""
    return replace(probe.host_limits(), seccomp=seccomp.ensure())


def unapplied_limits(ref: ProfileRef) -> list[str]:
    """The cgroup limits of `ref`'s profile that a run on this host goes without (only under
    `resources.enforcement: best_effort`); InvalidInput, before anything is recorded, when the
    profile requires them and this host cannot apply them for this user."""
    return flags.enforceable(
        ref.name, ref.profile.to_dict()["resources"], probe.host_limits().cgroup_limits
    )


def make_spec(req: RunRequest, ref: ProfileRef, *, resolv_conf: str | None = None) -> CreateSpec:
    """The CreateSpec for a run request under a profile revision on this host; the profile's
    mount sources are checked again (`check_mount_sources`)."""
    # An explicit empty --name is a mistake, not a request for a generated name.
    name = f"linpodx-{secrets.token_hex(4)}" if req.name is None else req.name
    validate_name(name)
    validate_image(req.image)
    check_mount_sources(ref)
    unapplied_limits(ref)
    if req.tty and not req.interactive and not req.detach:
        # podman start --attach without -i would leave the terminal without input.
        raise InvalidInput("--tty needs --interactive (or --detach)", "use -it for a terminal")
    return CreateSpec(
        profile=ref.profile,
        profile_name=ref.name,
        profile_id=ref.profile_id,
        revision=ref.revision,
        audit_hash=ref.audit_hash,
        image=req.image,
        name=name,
        command=tuple(req.command),
        interactive=req.interactive,
        tty=req.tty,
        rm=req.rm,
        rootless=probe.rootless(),
        resolv_conf=resolv_conf,
        host=host_limits(),
    )


def _cleanup(
    name: str,
    why: _E,
    *,
    remove_spec: bool,
    guard_too: bool,
    outcome: Outcome | None = None,
) -> _E:
    """Remove what was created for NAME and add what happened to the error's hint (and to
    `outcome`); an error that is not a LinpodxError has no hint, so it is said on stderr."""
    leftover = engine.remove_quietly(name)
    if outcome is not None:
        outcome.removed = leftover is None
    if guard_too:
        with contextlib.suppress(Exception):
            _guard().detach(name)
    if remove_spec:
        _remove_spec(name)
    said = (
        f"the container {name} was removed again (nothing was left half-created)"
        if leftover is None
        else f"removing {name} also failed ({leftover}); remove it with `podman rm -f {name}`"
    )
    if isinstance(why, LinpodxError):
        why.hint = f"{why.hint}; {said}" if why.hint else said
    else:
        _say(f"note: {said}")
    return why


def _say(text: str) -> None:
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


def _rm_cleanup_flags(name: str) -> tuple[str, ...]:
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


def _bring_up(
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
    when podman removes the container (`_rm_cleanup_flags`).
    """
    outcome = outcome or Outcome("", name)
    outcome.step = "state_dir"
    extra = _rm_cleanup_flags(name) if rm_cleanup else ()
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
    """`_bring_up`'s steps (each named in `at`); whether a podman call made the mounts."""
    at.step = "mount_check"
    mounts = (*pin_mounts(name, ref), *extra)
    if needs_guard(ref):
        at.step = "egress_guard"
        guard = _guard()
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
            engine.init(name, mounts)
            pid = guard.init_pid(name) or engine.container_pid(name)
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
        engine.start(name, mounts)
    return start or needs_guard(ref)


def _run_record(spec: CreateSpec, ref: ProfileRef) -> dict[str, Any]:
    """The `container.run` audit record of a new container."""
    return runplan.run_record(
        name=spec.name,
        image=spec.image,
        profile=ref.name,
        profile_id=ref.profile_id,
        revision=ref.revision,
        audit_hash=ref.audit_hash,
        command=spec.command,
        interactive=spec.interactive,
        tty=spec.tty,
        rm=spec.rm,
        limits_not_applied=flags.unenforced(
            ref.profile.to_dict()["resources"], spec.host.cgroup_limits
        ),
    )


def save_plan(ref: ProfileRef) -> None:
    """Store this revision's flags on this host for `linpodx.fastrun` (see `linpodx.runplan`).
    Best effort: without a plan, runs take the full path."""
    if ref.profile_id == BUILTIN_ID:
        return
    with contextlib.suppress(LinpodxError, OSError):
        spec = make_spec(RunRequest(image="plan", name="plan", rm=True), ref)
        guarded = needs_guard(ref)
        runplan.save(
            profile=ref.name,
            profile_id=ref.profile_id,
            revision=ref.revision,
            audit_hash=ref.audit_hash,
            guarded=guarded,
            flags=profile_flags(spec),
            mounts=[[m.source, m.target] for m in ref.profile.mounts],
            egress_policy=_guard().policy_doc(ref) if guarded else None,
        )


def create_and_start(spec: CreateSpec, ref: ProfileRef, *, start: bool = True) -> ContainerInfo:
    """Create a hardened container for `spec` and start it (or leave it ready for an attached
    start when `start` is False). Audited first; nothing is left behind on failure. The name's
    lock is held throughout (`lock_name`)."""
    with lock_name(spec.name):
        info = _create_and_start(spec, ref, start=start)
    if spec.rm:
        # Such a container's state dir goes with it (`_rm_cleanup_flags`), but its hook cannot
        # take the name's lock, so the lock file stays: remove those of earlier ones here.
        namelock.sweep()
    return info


def _create_and_start(spec: CreateSpec, ref: ProfileRef, *, start: bool) -> ContainerInfo:
    audit("container.run", _run_record(spec, ref))
    with Outcome("container.run", spec.name) as outcome:
        return _create_and_start_recorded(spec, ref, start=start, outcome=outcome)


def _create_and_start_recorded(
    spec: CreateSpec, ref: ProfileRef, *, start: bool, outcome: Outcome
) -> ContainerInfo:
    """`create_and_start` after its record; `outcome` follows along."""
    guarded = needs_guard(ref)
    gated = bool(ref.profile.mounts)
    outcome.step = "name_check"
    if guarded or gated:
        # prepare() and the mount gate write files under this name: if the name is taken,
        # those belong to the other container, so refuse before touching them (and never
        # detach them). Without a state dir of that name there are no such files: podman
        # alone decides.
        if spec_dir(spec.name).exists() and engine.exists(spec.name):
            raise EngineError(
                f"the container name {spec.name!r} is already in use",
                engine.NAME_IN_USE_HINT,
            )
    if gated:
        # podman create needs the gate to exist; `_bring_up`'s start closes it again.
        outcome.step = "mount_check"
        mountpin.open_gate(str(ensure_dir(spec_dir(spec.name))))
    if guarded:
        outcome.step = "egress_guard"
        try:
            resolv = _guard().prepare(spec.name, ref)
        except BaseException:
            with contextlib.suppress(Exception):
                _guard().detach(spec.name)
            raise
        spec = CreateSpec(**{**_fields(spec), "resolv_conf": str(resolv)})
    argv = build_create_argv(spec)
    outcome.step = "podman_create"
    try:
        container_id = engine.create(argv)
    except BaseException:
        if guarded:
            with contextlib.suppress(Exception):
                _guard().detach(spec.name)
        if gated:
            mountpin.close_gate(str(spec_dir(spec.name)))
        # podman refused: nothing was created (a name clash leaves the other one alone). Only
        # a Ctrl-C that lands after podman made the container can leave one, without a run
        # spec: not removed here, as the name may have been someone else's (`podman rm` it).
        raise
    outcome.created = True
    try:
        outcome.step = "run_spec"
        save_spec(spec.name, _spec_doc(spec, ref, container_id, events.now_iso()))
        if not spec.rm:
            outcome.step = "home"
            engine.create_home(spec.name)
        _bring_up(
            spec.name, ref, start=start, resolv=spec.resolv_conf, rm_cleanup=spec.rm,
            outcome=outcome,
        )  # fmt: skip
    except LinpodxError as err:
        raise _cleanup(
            spec.name, err, remove_spec=True, guard_too=guarded, outcome=outcome
        ) from None
    except BaseException as exc:
        # Not one of ours (the state dir failing with an OSError, Ctrl-C): the same clean-up,
        # said on stderr, and the error goes on as it is (the CLI reports it).
        _cleanup(spec.name, exc, remove_spec=True, guard_too=guarded, outcome=outcome)
        raise
    state = "running"
    if start and not spec.rm:
        with contextlib.suppress(LinpodxError):
            state = engine.state(engine.inspect(spec.name))
    _emit(
        "container.start", name=spec.name, profile=ref.name, revision=ref.revision, image=spec.image
    )
    return ContainerInfo(spec.name, container_id, state, ref.name, ref.revision, spec.image)


def _fields(spec: CreateSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


def run(req: RunRequest) -> tuple[ContainerInfo, CreateSpec]:
    """`linpodx run`: resolve the profile, build the spec, create and (unless it will be attached)
    start. The caller runs `attached_start` for foreground runs."""
    ref = resolve_profile(req.profile)
    spec = make_spec(req, ref)
    refuse_if_rolling_back(spec.name)
    info = create_and_start(spec, ref, start=req.detach)
    return info, spec


Announce = Callable[[ContainerInfo, CreateSpec], None]


def one_call(spec: CreateSpec) -> bool:
    """Whether a foreground run can be one `podman run`: a --rm container (its `$HOME` is a
    tmpfs, nothing to create first) without a TTY (the id is printed while podman already
    runs; on a terminal in raw mode it would not be a clean line). An egress guard is attached
    by an OCI hook inside that one call (see `_run_once`)."""
    return spec.rm and not spec.tty


def run_foreground(req: RunRequest, announce: Announce) -> int:
    """`linpodx run` without --detach: create, `announce` the container, run it attached to this
    terminal and return its exit status. --rm runs without a TTY take one `podman run`
    (`one_call`); the others create, announce, then `podman start --attach`."""
    ref = resolve_profile(req.profile)
    spec = make_spec(req, ref)
    refuse_if_rolling_back(spec.name)
    if one_call(spec):
        return _run_once(spec, ref, announce)
    info = create_and_start(spec, ref, start=False)
    # The mounts were checked and pinned by create_and_start (`_bring_up`) just now, and the
    # gate left open for this start (its hook closes it; closed here too, whatever happened).
    mounts = mountpin.flags_of(str(spec_dir(info.name)))
    try:
        announce(info, spec)
        rc = attached_start(
            info.name, req.interactive, remove_on_failure=not req.rm, global_flags=mounts
        )
    except BaseException:
        # A signal (SIGTERM, Ctrl-C) or a failure before `podman start` took over: the
        # container exists and never ran. Nothing is left half-made (podman 5's timing
        # landed a SIGTERM here).
        _remove_if_never_started(info.name)
        raise
    finally:
        mountpin.close_gate(str(spec_dir(info.name)))
    if req.rm:
        _wait_removed(info.container_id)
        forget(info.name, info.container_id)
    return rc


def _remove_if_never_started(name: str) -> None:
    """Remove NAME and its spec if its command never ran (best effort: called on the way out
    of an interrupted run, whose own error is what the person sees)."""
    try:
        info = engine.inspect(name)
    except LinpodxError:
        return
    started = str(info.get("State", {}).get("StartedAt", ""))
    if (not started or started.startswith("0001-01-01")) and engine.remove_quietly(name) is None:
        with contextlib.suppress(OSError):
            _remove_spec(name)


RM_WAIT_SECONDS = 10.0
"""How long an attached `--rm` run waits for podman to remove the container after it ended."""


def _wait_removed(container_id: str, timeout: float = RM_WAIT_SECONDS) -> None:
    """Return once podman has removed the container (at most `timeout` seconds).

    podman 5 can return from `podman start --attach` of a `--rm` container before it has
    removed it (podman 4.3 never did here); `forget` then found the container still there and
    kept its state dir for good. A container still there after the wait keeps its state, as
    before (`linpodx rm` removes both)."""
    deadline = time.monotonic() + timeout
    with contextlib.suppress(LinpodxError):
        while engine.exists(container_id) and time.monotonic() < deadline:
            time.sleep(0.05)


def _run_once(spec: CreateSpec, ref: ProfileRef, announce: Announce) -> int:
    """Audit, then one `podman run --rm --cidfile`: once the id is known, the run spec is saved
    and the container announced before any of its output is passed on.

    With an allowlist, the guard is launched first (`guard.prepare`) and podman gets a hooks
    dir whose `createRuntime` hook hands the container's pid over and holds its command back
    until the guard is ready; the id is announced only after that. If the guard fails, the hook
    fails, runc never starts the command, and everything is removed.

    The name's lock (`lock_name`) is held from before the record until the container is
    announced or everything is removed again, not while the container runs.
    """
    lock = lock_name(spec.name)
    try:
        return _run_once_locked(spec, ref, announce, lock)
    finally:
        lock.release()


def _run_once_locked(
    spec: CreateSpec, ref: ProfileRef, announce: Announce, lock: namelock.NameLock
) -> int:
    audit("container.run", _run_record(spec, ref))
    with Outcome("container.run", spec.name) as outcome:
        return _run_once_recorded(spec, ref, announce, lock, outcome)


def _run_once_recorded(
    spec: CreateSpec,
    ref: ProfileRef,
    announce: Announce,
    lock: namelock.NameLock,
    outcome: Outcome,
) -> int:
    """`_run_once` after its record; `outcome` follows along."""
    where = spec_dir(spec.name)
    made = not where.exists()
    guarded = needs_guard(ref)
    outcome.step = "name_check"
    if not made and engine.exists(spec.name):
        # The mount pins (and the guard's files) are written under this name: refuse a taken
        # name first, so the other container's files are left as they are.
        raise EngineError(
            f"the container name {spec.name!r} is already in use",
            engine.NAME_IN_USE_HINT,
        )
    outcome.step = "mount_check"
    try:
        global_flags = pin_mounts(spec.name, ref)
    except LinpodxError:
        if made:
            shutil.rmtree(where, ignore_errors=True)
        raise
    if guarded:
        outcome.step = "egress_guard"
        guard = _guard()
        try:
            resolv = guard.prepare(spec.name, ref)
            hooks = guard.hook_setup(spec.name)
        except BaseException:
            with contextlib.suppress(Exception):
                guard.detach(spec.name)
            raise
        spec = CreateSpec(**{**_fields(spec), "resolv_conf": str(resolv)})
        global_flags = (*global_flags, f"--hooks-dir={hooks}")
    # The id file is named for this run: if the name was taken since, podman refuses before
    # writing it.
    outcome.step = "state_dir"
    cidfile = ensure_dir(where) / f"cid-{secrets.token_hex(6)}"
    argv = (*global_flags, *build_run_argv(spec, str(cidfile)))
    rc = _relay_run(
        spec, ref, announce, lambda: engine.start_run((engine.podman_bin(), *argv)), cidfile,
        made=made, guarded=guarded, lock=lock, outcome=outcome,
    )  # fmt: skip
    save_plan(ref)  # the next run of this revision can take the fast path
    return rc


def run_started(
    req: RunRequest,
    profile_id: str,
    start: Callable[[], Child],
    cidfile: Path,
    *,
    made: bool,
    announce: Announce,
    resolv_conf: str | None = None,
    lock: namelock.NameLock | None = None,
    step: str = "podman_run",
) -> int:
    """The second half of a run `linpodx.fastrun` began: it took the name's `lock`, recorded
    `container.run` and started `podman run` (`start` hands over that process, or raises what
    starting it raised: then `step` names what failed) from a stored plan of revision
    `profile_id`; with `resolv_conf`, it also launched the egress guard and gave podman the OCI
    hook (as `_run_once` does). Loads that revision fully and goes on as `_run_once` (which
    lets the lock go, and records `container.run.failed` if the run fails)."""
    outcome = Outcome("container.run", req.name or "")
    outcome.step = step
    try:
        with outcome:
            return _run_started(
                req, profile_id, start, cidfile, made=made, announce=announce,
                resolv_conf=resolv_conf, lock=lock, outcome=outcome,
            )  # fmt: skip
    finally:
        if lock is not None:
            lock.release()


def _run_started(
    req: RunRequest,
    profile_id: str,
    start: Callable[[], Child],
    cidfile: Path,
    *,
    made: bool,
    announce: Announce,
    resolv_conf: str | None,
    lock: namelock.NameLock | None,
    outcome: Outcome,
) -> int:
    guarded = resolv_conf is not None
    try:
        ref = profile_by_id(profile_id)
        spec = make_spec(req, ref, resolv_conf=resolv_conf)
    except BaseException:
        # The plan matched this revision byte for byte, so this is not expected; the container
        # must not run on without its spec all the same.
        outcome.step = "profile"
        with contextlib.suppress(Exception):
            child = start()
            child.terminate()
            child.wait()
            child.close()
        if cidfile.exists():
            outcome.created = True
            cidfile.unlink(missing_ok=True)
            outcome.removed = engine.remove_quietly(req.name or "") is None
        if guarded:
            with contextlib.suppress(Exception):
                _guard().detach(req.name or "")
        if made:
            _remove_spec(req.name or "")
        raise
    return _relay_run(
        spec, ref, announce, start, cidfile, made=made, guarded=guarded, lock=lock,
        outcome=outcome,
    )  # fmt: skip


def _relay_run(
    spec: CreateSpec,
    ref: ProfileRef,
    announce: Announce,
    start: Callable[[], Child],
    cidfile: Path,
    *,
    made: bool,
    guarded: bool,
    lock: namelock.NameLock | None = None,
    outcome: Outcome | None = None,
) -> int:
    """Relay a `podman run --cidfile` that `start` starts (see `_run_once`), then clean up.
    The name's `lock` is let go once the container is announced (the caller lets it go after
    a failure, once everything is removed). `outcome` learns how far it got."""
    seen: list[str] = []
    at = outcome or Outcome("", spec.name)
    if at.step in ("prepare", "state_dir"):
        at.step = "podman_run"

    def created(container_id: str, running: Callable[[], bool]) -> None:
        seen.append(container_id)
        at.created = True
        if guarded:
            at.step = "egress_guard"
            guard = _guard()
            try:
                guard.attach(spec.name, guard.hook_pid(spec.name, running, container_id), ref)
            except BaseException as exc:
                guard.hook_release(spec.name, f"not started: {exc}", running)
                raise
            guard.hook_release(spec.name, "ready", running)
        at.step = "run_spec"
        save_spec(spec.name, _spec_doc(spec, ref, container_id, events.now_iso()))
        _emit(
            "container.start",
            name=spec.name, profile=ref.name, revision=ref.revision, image=spec.image,
        )  # fmt: skip
        info = ContainerInfo(spec.name, container_id, "running", ref.name, ref.revision,
                             spec.image)  # fmt: skip
        at.step = "announce"
        announce(info, spec)
        if lock is not None:
            # The container has the name and its spec: whoever comes next finds it taken.
            # Held on while it runs, it would keep `linpodx rm -f` waiting for it to end.
            lock.release()

    try:
        rc = engine.relay_announced(start(), cidfile, created)
    except BaseException as exc:
        ours = cidfile.exists()  # podman created the container: remove it and its spec
        at.created = at.created or ours
        cidfile.unlink(missing_ok=True)
        if ours and isinstance(exc, LinpodxError):
            raise _cleanup(
                spec.name, exc, remove_spec=True, guard_too=guarded, outcome=at
            ) from None
        if guarded:
            with contextlib.suppress(Exception):
                _guard().detach(spec.name)
        if ours:
            at.removed = engine.remove_quietly(spec.name) is None
        if ours or made:
            _remove_spec(spec.name)
        raise
    if lock is not None:
        lock.release()  # (already, once announced); `forget` takes it again
    cid = seen[0] if seen else engine.read_cid(cidfile)
    if rc < 0:
        forget(spec.name, cid)  # podman itself was killed: the container may still be there
        return 128 - rc  # as a shell reports it (an exit status cannot be negative)
    if rc != 0 and cid is not None:
        # podman 4.3 interrupted (Ctrl-C) between creating and starting the container exits 1
        # and leaves it behind, created or initialized: its command never ran. Remove it by
        # its id (seen here; a container that did run and fail is gone already: --ignore).
        engine.remove_quietly(cid)
    # podman run --rm removed the container before returning; its guard, if any, ends by
    # itself with the container's network namespace. The name is free again, so a new run of
    # it may have begun meanwhile: only this container's state dir goes.
    forget(spec.name, cid, ask_podman=False)
    return rc


def attached_start(
    name: str, interactive: bool, remove_on_failure: bool, global_flags: Sequence[str] = ()
) -> int:
    """Start NAME attached to this terminal and wait; returns the container's exit status.
    `global_flags`: the mount-check hook's (`pin_mounts`), as `_bring_up` returned them.

    If podman could not start it at all (it never ran), the container and its spec are removed
    so nothing is left half-created, and the run's outcome is recorded
    (`container.run.failed`, as when `podman start` fails for a detached run).
    """
    outcome = Outcome("container.run", name)
    outcome.step = "podman_start"
    outcome.created = True
    with outcome:
        rc = engine.run_inherited(
            engine.start_attach_argv(name, interactive, global_flags),
            stop=lambda: engine.stop_quietly(name),
        )
    if rc != 0 and remove_on_failure:
        try:
            info = engine.inspect(name)
        except NotFound:
            return rc  # --rm containers are gone once they exit
        except LinpodxError:
            return rc
        started = str(info.get("State", {}).get("StartedAt", ""))
        if started.startswith("0001-01-01") or not started:
            outcome.removed = engine.remove_quietly(name) is None
            _remove_spec(name)
            outcome.failed(
                EngineError(f"podman start --attach exited {rc} without starting the container")
            )
            from linpodx.output import note

            note(f"error: podman could not start {name}; it was removed again")
    return rc


# --- lifecycle --------------------------------------------------------------------------------


def managed_info(name: str) -> dict[str, Any]:
    """Inspect NAME and refuse containers linpodx did not create."""
    validate_name(name)
    # A rollback that was killed part-way may have renamed NAME aside or left it stopped, and
    # swapped half its workspace: nothing acts on it until `snapshot recover` put it back.
    refuse_if_rolling_back(name)
    info = engine.inspect(name)
    if engine.labels_of(info).get(MANAGED_LABEL) != "1":
        raise Denied(
            f"container {name} is not managed by linpodx",
            "linpodx acts only on containers it created (label linpodx.managed=1); "
            "use podman directly",
        )
    if info.get("Name") != name:
        # podman also resolves ids and id prefixes; the lock, the run spec and the records go
        # by name, so acting on an id would lock, record and clean up the wrong name.
        raise InvalidInput(
            f"{name} is not a container name (podman resolves it to {info.get('Name')!r})",
            "give the container's name (`linpodx ps --all` lists them)",
        )
    return info


def _ref_for(name: str, info: dict[str, Any]) -> ProfileRef:
    labels = engine.labels_of(info)
    pid = labels.get("linpodx.profile_id", "")
    if not pid:
        raise InvalidInput(
            f"container {name} has no linpodx.profile_id label",
            f"remove it with `linpodx rm {name}`",
        )
    return profile_by_id(pid)


def start(name: str) -> ContainerInfo:
    """`linpodx start NAME`: init -> guard attach -> start, like run (audited first), holding
    the name's lock (`lock_name`): a second start at once then finds it running."""
    with lock_name(name):
        return _start(name)


def _start(name: str) -> ContainerInfo:
    info = managed_info(name)
    ref = _ref_for(name, info)
    labels = engine.labels_of(info)
    if engine.state(info) == "running":
        if egress_status(name) == "down":
            # Its guard died (or was killed): the container has no network at all, and a
            # guard cannot be given to a running container's namespace again. Saying "running"
            # and exit 0 here read as "egress restored", which the docs promise `start` does.
            raise EngineError(
                f"container {name} is running, but its egress guard is down: it has no network",
                f"run `linpodx stop {name}` and then `linpodx start {name}` to start it again "
                "with its egress filter",
            )
        return ContainerInfo(
            name,
            str(info.get("Id", "")),
            "running",
            ref.name,
            ref.revision,
            str(info.get("ImageName", "")),
        )
    if engine.state(info) == "paused":
        # podman cannot start a paused container, and `linpodx stop` refuses one too: say what
        # works, before anything is recorded (a snapshot worker that died can leave it so).
        raise InvalidInput(
            f"container {name} is paused",
            f"run `podman unpause {name}` to let it go on (or `linpodx snapshot job-status` "
            "of the snapshot job that paused it)",
        )
    check_mount_sources(ref)  # before the record; `_bring_up` pins them for podman start
    # A profile's limits this host cannot apply: refused (required) or recorded (best effort).
    unapplied = unapplied_limits(ref)
    try:
        # Before the record too: a start that cannot happen is not recorded as one.
        spec = load_spec(name)
    except NotFound:
        was = _renamed_from(str(info.get("Id", "")), name)
        if was is not None:
            # `podman rename` outside linpodx: the run spec, the mount gate and the egress
            # guard's files all live under the name linpodx created it with.
            raise NotFound(
                f"container {name} was renamed outside linpodx (linpodx created it as {was}, "
                "and keeps its run spec, mount checks and egress state under that name)",
                f"rename it back with `podman rename {name} {was}`, then "
                f"`linpodx start {was}`",
            ) from None
        # Ours (labelled) but without a spec: its `linpodx run` was killed before it finished
        # (the spec is written last); such a container may also lack its $HOME.
        raise NotFound(
            f"container {name} has no linpodx run spec: its `linpodx run` did not finish",
            f"remove it with `linpodx rm {name}` and run it again",
        ) from None
    if spec.get("container_id") != info.get("Id"):
        # Labels are only labels: anyone with podman can put linpodx's on a container created
        # with other flags (privileged, the host's network, host paths). Only the container
        # linpodx's own run created is started, audited and given an egress guard.
        raise Denied(
            f"container {name} is not the one linpodx created under that name (its id differs "
            "from the run spec's)",
            f"it was created or replaced outside linpodx; remove it with `podman rm {name}` "
            "and create it again with `linpodx run`",
        )
    record: dict[str, Any] = {
        "name": name, "profile_id": ref.profile_id, "revision": labels.get("linpodx.revision")
    }
    if unapplied:
        record["limits_not_applied"] = unapplied
    audit("container.start", record)
    resolv = spec.get("resolv_conf") if needs_guard(ref) else None
    outcome = Outcome("container.start", name)
    try:
        if engine.state(info) == "initialized":
            # A run or start killed between `podman init` and its start left it so (its
            # command never ran; with an allowlist it has no network). podman refuses to init
            # it again ("container state improper"): take it back to stopped first.
            engine.stop(name, timeout=0)
        _bring_up(name, ref, start=True, resolv=resolv, outcome=outcome)
    except BaseException as err:
        # Any failure (also an OSError of the state dir, or Ctrl-C): do not remove a stopped
        # container's state; make sure it is not left running unguarded.
        with contextlib.suppress(LinpodxError):
            engine.stop(name, timeout=0)
            outcome.removed = True
        with contextlib.suppress(Exception):
            if needs_guard(ref):
                _guard().detach(name)
        said = (
            f"{name} was left stopped"
            if outcome.removed
            else f"stopping {name} failed too; stop it with `linpodx stop {name}`"
        )
        if isinstance(err, LinpodxError):
            err.hint = (err.hint + "; " if err.hint else "") + said
        else:
            _say(f"note: {said}")
        outcome.failed(err)
        raise
    _emit("container.start", name=name, profile=ref.name, revision=ref.revision)
    info = engine.inspect(name)
    return ContainerInfo(
        name,
        str(info.get("Id", "")),
        engine.state(info),
        ref.name,
        ref.revision,
        str(info.get("ImageName", "")),
    )


STOP_TIME_MAX = 86_400
"""The longest `stop --time` (a day): podman refuses a negative one, and Python's own
timeouts overflow on huge ones, both after the stop would have been recorded."""


def stop(name: str, timeout: int = 10) -> dict[str, Any]:
    """`linpodx stop NAME` (audited first), holding the name's lock: a snapshot rollback of
    NAME in another process holds it too, so a stop waits for it rather than slip in between
    the rollback's checks and its journal."""
    if not 0 <= timeout <= STOP_TIME_MAX:
        raise UsageError(
            f"--time must be between 0 and {STOP_TIME_MAX} seconds, not {timeout}",
            "give the seconds podman waits after SIGTERM before it sends SIGKILL",
        )
    with lock_name(name):
        return _stop(name, timeout)


def _stop(name: str, timeout: int) -> dict[str, Any]:
    info = managed_info(name)
    audit_stopping("container.stop", {"name": name, "id": info.get("Id")})
    engine.stop(name, timeout)
    _emit("container.stop", name=name)
    return {
        "name": name,
        "state": engine.state(engine.inspect(name)) if engine.exists(name) else "removed",
    }


def remove(name: str, force: bool = False) -> dict[str, Any]:
    """`linpodx rm NAME`: the container, its guard and its spec dir (audited first), holding
    the name's lock (`lock_name`), so that it never removes the files of a run of that name
    that is under way."""
    with lock_name(name):
        return _remove(name, force)


def _remove(name: str, force: bool) -> dict[str, Any]:
    refuse_if_rolling_back(name)
    present = engine.exists(name)
    if present:
        info = managed_info(name)
        if engine.state(info) == "running" and not force:
            raise InvalidInput(
                f"container {name} is running",
                f"stop it first (`linpodx stop {name}`) or use --force",
            )
    elif not spec_dir(name).exists():
        raise NotFound(
            f"container not found: {name}", "list linpodx containers with `linpodx ps --all`"
        )
    audit_stopping("container.rm", {"name": name, "force": force, "present": present})
    if present:
        try:
            engine.remove(name, force=force)
        except EngineError:
            if engine.exists(name):
                raise
            # Gone meanwhile (a `--rm` container that ended): its state goes all the same.
    with contextlib.suppress(Exception):
        _guard().detach(name)
    _remove_spec(name)
    _emit("container.rm", name=name)
    if not present:
        # What a `linpodx rm` killed after `podman rm` leaves (or a `--rm` container whose
        # clean-up hook did not run): say so rather than let "removed" suggest a container.
        from linpodx.output import note

        with contextlib.suppress(OSError):
            note(
                f"note: container {name} was already gone (an earlier removal may have been "
                "interrupted); removed the state linpodx kept for it"
            )
    return {"name": name, "removed": True, "present": present}


def exec_in(name: str, command: tuple[str, ...], interactive: bool, tty: bool) -> int:
    """`linpodx exec NAME -- CMD…` (audited with its argv first); returns the command's status."""
    if not command:
        raise InvalidInput("exec needs a command", f"use `linpodx exec {name} -- CMD ARGS…`")
    info = managed_info(name)
    if engine.state(info) != "running":
        raise InvalidInput(
            f"container {name} is not running", f"start it with `linpodx start {name}`"
        )
    audit(
        "container.exec",
        {"name": name, "argv": list(command), "interactive": interactive, "tty": tty},
    )
    _emit("container.exec", name=name, argv=list(command))
    return engine.run_inherited(engine.exec_argv(name, command, interactive, tty))


def _renamable(name: str) -> bool:
    """A name linpodx could have given (`podman rename` takes longer ones, which have no state
    dir of their own and must not make `ps` fail)."""
    try:
        validate_name(name)
    except InvalidInput:
        return False
    return True


def ps(all_states: bool) -> list[dict[str, Any]]:
    """Rows for `linpodx ps`: linpodx containers only."""
    rows = []
    for r in engine.list_managed(all_states):
        names = r.get("Names") or []
        name = str(names[0]) if isinstance(names, list) and names else str(r.get("Name", ""))
        labels = r.get("Labels") or {}
        row = {
            "name": name,
            "profile": str(labels.get("linpodx.profile", "")),
            "revision": str(labels.get("linpodx.revision", "")),
            "state": str(r.get("State", "")),
            "egress": egress_status(name),
            "image": str(r.get("Image", "")),
        }
        if row["egress"] == "none" and _renamable(name) and not present(spec_path(name)):
            # Renamed with `podman rename`: its guard's state is under the name linpodx gave
            # it, and "none" would hide a guard that runs (or one that is down).
            was = _renamed_from(str(r.get("Id", "")), name)
            if was is not None:
                row["egress"] = egress_status(was)
                row["renamed_from"] = was
        rows.append(row)
    rows.sort(key=lambda x: x["name"])
    return rows


def inspect(name: str) -> dict[str, Any]:
    """`podman inspect` of a linpodx container (refuses others)."""
    return managed_info(name)


def spec_from_record(
    doc: dict[str, Any], ref: ProfileRef, *, image: str, name: str, hostname_of: str
) -> CreateSpec:
    """The create spec that brings back a recorded container (its run spec `doc`) under the
    profile revision `ref`, from `image`, as `name`; the hostname stays the recorded one (or
    the one `hostname_of` would get). Used by snapshot rollback."""
    check_mount_sources(ref)
    unapplied_limits(ref)
    return CreateSpec(
        profile=ref.profile,
        profile_name=ref.name,
        profile_id=ref.profile_id,
        revision=ref.revision,
        audit_hash=ref.audit_hash,
        image=image,
        name=name,
        hostname=doc.get("hostname") or _hostname(hostname_of),
        command=tuple(str(c) for c in doc.get("command") or ()),
        interactive=bool(doc.get("interactive")),
        tty=bool(doc.get("tty")),
        rm=False,
        rootless=probe.rootless(),
        resolv_conf=doc.get("resolv_conf"),
        host=host_limits(),
    )


def _hostname(name: str) -> str:
    from linpodx.podman.runline import hostname_for

    return hostname_for(name)


def forget(name: str, container_id: str | None = None, *, ask_podman: bool = True) -> None:
    """Drop the state dir of a `--rm` container that podman already removed, holding the
    name's lock; not if a container of that name exists (`ask_podman`), nor if the run spec
    there is another container's than `container_id` (a run of the name that came after)."""
    with contextlib.suppress(LinpodxError), lock_name(name):
        if ask_podman and engine.exists(name):
            return
        if container_id is not None and _spec_container_id(name) not in (None, container_id):
            return
        _remove_spec(name)


def _spec_container_id(name: str) -> str | None:
    """The container id in NAME's run spec, or None if it has no readable one."""
    try:
        raw = read_small(spec_path(name), MAX_SPEC_BYTES)
        doc = json.loads(raw) if raw is not None else None
    except (OSError, ValueError, NotRegularFile):
        return None
    cid = doc.get("container_id") if isinstance(doc, dict) else None
    return cid if isinstance(cid, str) else None


def logs(name: str, follow: bool) -> int:
    """Print NAME's output with control characters escaped (it is untrusted: an agent could
    write terminal escape sequences into it), piece by piece: a line of any length costs no
    more memory than a piece (`engine.stream_chunks`)."""
    import sys

    from linpodx.output import StreamEscaper

    managed_info(name)
    escaper = StreamEscaper()
    last = "\n"

    def write(text: str) -> None:
        nonlocal last
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            last = text[-1]

    rc = engine.stream_chunks(engine.logs_argv(name, follow), lambda raw: write(escaper.feed(raw)))
    write(escaper.end())
    if last != "\n":
        write("\n")  # the last line ends like every other
    return rc
