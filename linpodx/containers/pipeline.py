"""The run pipeline: the plan (`plan.make_spec`, before anything is recorded), then one frame,
`with lock_name(name), recorded("container.run", record) as outcome:`, around one of two bodies:

- created (`_create`): `podman create`, the run spec, `$HOME`, the bring-up. Mode *detached*
  (`run -d`, snapshot rollback) starts it; mode *attached* leaves the start to
  `attached_start`, which gives it this terminal (`run_foreground`).
- relayed (`_relay`): one `podman run --rm --cidfile`, whose output is passed on once the
  container is announced. Mode *one call* (`_run_once`) starts it here; mode *resumed*
  (`run_started`) is the fast path's (`linpodx.fastpath.run`), which took the lock, wrote the record
  and started podman before this package was even imported.

Each step sets `outcome.step`; a failure after the record removes what was made (the error's
hint says so) and records `container.run.failed` with that step.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from linpodx import events, namelock, progress
from linpodx.containers import bringup, request, sessions
from linpodx.containers.bringup import bring_up, cleanup, pin_mounts
from linpodx.containers.plan import (
    fields,
    make_spec,
    needs_guard,
    one_call,
    run_env,
    run_record,
    spec_doc,
)
from linpodx.containers.record import Outcome, emit, recorded
from linpodx.containers.request import Announce, ContainerInfo, RunRequest
from linpodx.containers.runenv import RunEnv, env_fd
from linpodx.containers.runner import podman
from linpodx.containers.state import (
    forget,
    lock_name,
    refuse_if_rolling_back,
    remove_spec,
    save_spec,
    spec_dir,
)
from linpodx.errors import (
    Conflict,
    EngineError,
    LinpodxError,
    NotFound,
)
from linpodx.fastpath import plan as runplan
from linpodx.paths import ensure_dir
from linpodx.podman import engine, mountpin
from linpodx.podman.argv import (
    CreateSpec,
    build_create_argv,
    build_run_argv,
    profile_flags,
)
from linpodx.podman.hints import NAME_IN_USE_HINT
from linpodx.proc import Child, lending
from linpodx.profile.model import BUILTIN_ID, ProfileRef


def save_plan(ref: ProfileRef) -> None:
    """Store this revision's flags on this host for the fast path (`linpodx.fastpath.plan`).
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
            egress_policy=bringup.egress_guard().policy_doc(ref) if guarded else None,
        )


def create_and_start(
    spec: CreateSpec, ref: ProfileRef, *, start: bool = True, env: RunEnv | None = None
) -> ContainerInfo:
    """Create a hardened container for `spec` and start it (or leave it ready for an attached
    start when `start` is False). Audited first; nothing is left behind on failure. The name's
    lock is held throughout (`lock_name`). `env`: the run's own variables (`runenv`)."""
    with (
        lock_name(spec.name),
        recorded("container.run", spec.name, run_record(spec, ref)) as outcome,
    ):
        info = _create(spec, ref, start=start, outcome=outcome, env=env or RunEnv())
    if spec.rm:
        # Such a container's state dir goes with it (`rm_cleanup_flags`), but its hook cannot
        # take the name's lock, so the lock file stays: remove those of earlier ones here.
        namelock.sweep()
    return info


def _create(
    spec: CreateSpec, ref: ProfileRef, *, start: bool, outcome: Outcome, env: RunEnv
) -> ContainerInfo:
    """The body of a created run (detached, or attached by the caller): `podman create`, the
    run spec, `$HOME`, then the bring-up (`bringup.bring_up`, without its start if attached)."""
    guarded = needs_guard(ref)
    gated = bool(ref.profile.mounts)
    outcome.step = "name_check"
    if guarded or gated:
        # prepare() and the mount gate write files under this name: if the name is taken,
        # those belong to the other container, so refuse before touching them (and never
        # detach them). Without a state dir of that name there are no such files: podman
        # alone decides.
        if spec_dir(spec.name).exists() and podman().exists(spec.name):
            raise Conflict(
                f"the container name {spec.name!r} is already in use",
                NAME_IN_USE_HINT,
            )
    if gated:
        # podman create needs the gate to exist; `bring_up`'s start closes it again.
        outcome.step = "mount_check"
        mountpin.open_gate(str(ensure_dir(spec_dir(spec.name))))
    if guarded:
        outcome.step = "egress_guard"
        try:
            resolv = bringup.egress_guard().prepare(spec.name, ref)
        except BaseException:
            with contextlib.suppress(Exception):
                bringup.egress_guard().detach(spec.name)
            raise
        spec = CreateSpec(**{**fields(spec), "resolv_conf": str(resolv)})
    outcome.step = "podman_create"
    try:
        # The run's own values reach podman through a memory file lent to this one create,
        # never on its argv (`linpodx.containers.runenv`).
        with env_fd(env) as fd:
            if fd is not None:
                spec = CreateSpec(**{**fields(spec), "env_file": f"/dev/fd/{fd}"})
            argv = build_create_argv(spec)
            with lending(*(() if fd is None else (fd,))), progress.waiting(_waiting_for(spec)):
                container_id = podman().create(argv)
    except BaseException as exc:
        if guarded:
            with contextlib.suppress(Exception):
                bringup.egress_guard().detach(spec.name)
        if gated:
            mountpin.close_gate(str(spec_dir(spec.name)))
        # podman refused: nothing was created (a name clash leaves the other one alone). Only
        # a Ctrl-C that lands after podman made the container can leave one, without a run
        # spec: not removed here, as the name may have been someone else's (`podman rm` it).
        if isinstance(exc, EngineError) and "already in use" in exc.stderr.lower():
            # The same kind of error (and exit status) as the check above gives.
            raise Conflict(
                f"the container name {spec.name!r} is already in use", NAME_IN_USE_HINT
            ) from None
        raise
    outcome.created = True
    try:
        outcome.step = "run_spec"
        save_spec(spec.name, spec_doc(spec, ref, container_id, events.now_iso()))
        if not spec.rm:
            outcome.step = "home"
            podman().create_home(spec.name)
        bring_up(
            spec.name, ref, start=start, resolv=spec.resolv_conf, rm_cleanup=spec.rm,
            outcome=outcome,
        )  # fmt: skip
    except LinpodxError as err:
        raise cleanup(
            spec.name, err, remove_spec=True, guard_too=guarded, outcome=outcome
        ) from None
    except BaseException as exc:
        # Not one of ours (the state dir failing with an OSError, Ctrl-C): the same clean-up,
        # said on stderr, and the error goes on as it is (the CLI reports it).
        cleanup(spec.name, exc, remove_spec=True, guard_too=guarded, outcome=outcome)
        raise
    state = "running"
    if start and not spec.rm:
        with contextlib.suppress(LinpodxError):
            state = engine.state(podman().inspect(spec.name))
    emit(
        "container.start", name=spec.name, profile=ref.name, revision=ref.revision, image=spec.image
    )
    return ContainerInfo(spec.name, container_id, state, ref.name, ref.revision, spec.image)


def _waiting_for(spec: CreateSpec) -> str:
    """What a person waiting for `podman create`/`run` of `spec` is told (`progress`)."""
    return f"podman is creating {spec.name} from {spec.image} (the first use of an image is slow)"


def run(req: RunRequest) -> tuple[ContainerInfo, CreateSpec]:
    """`linpodx run`: resolve the profile, build the spec, create and (unless it will be attached)
    start. The caller runs `attached_start` for foreground runs."""
    spec, ref, env = _planned(req)
    info = create_and_start(spec, ref, start=req.detach, env=env)
    return info, spec


def _planned(req: RunRequest) -> tuple[CreateSpec, ProfileRef, RunEnv]:
    """The plan of a full-path run: its revision, its own environment, its CreateSpec on this
    host, no rollback of the name under way, then the image pulled if `--pull` says so (all
    before the run is recorded; a pull is recorded on its own, `images.ensure`)."""
    from linpodx.containers import images
    from linpodx.podman.runline import pull_policy

    ref = request.resolve_profile(req.profile)
    env = run_env(req, ref)
    spec = make_spec(req, ref, env=env)
    refuse_if_rolling_back(spec.name)
    images.ensure(spec.image, pull_policy(req.pull))
    return spec, ref, env


def run_foreground(req: RunRequest, announce: Announce) -> int:
    """`linpodx run` without --detach: create, `announce` the container, run it attached to this
    terminal and return its exit status. --rm runs without a TTY take one `podman run`
    (`one_call`); the others create, announce, then `podman start --attach`."""
    spec, ref, env = _planned(req)
    if one_call(spec):
        return _run_once(spec, ref, announce)
    info = create_and_start(spec, ref, start=False, env=env)
    # The mounts were checked and pinned by create_and_start (`bring_up`) just now, and the
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
        info = podman().inspect(name)
    except LinpodxError:
        return
    started = str(info.get("State", {}).get("StartedAt", ""))
    if (not started or started.startswith("0001-01-01")) and podman().remove_quietly(name) is None:
        with contextlib.suppress(OSError):
            remove_spec(name)


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
        while podman().exists(container_id) and time.monotonic() < deadline:
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
    with lock, recorded("container.run", spec.name, run_record(spec, ref)) as outcome:
        rc = _one_call(spec, ref, announce, lock, outcome)
        save_plan(ref)  # the next run of this revision can take the fast path
        return rc


def _one_call(
    spec: CreateSpec,
    ref: ProfileRef,
    announce: Announce,
    lock: namelock.NameLock,
    outcome: Outcome,
) -> int:
    """The body of a one-call run: the name checked, the mounts pinned, the guard launched,
    then `podman run` relayed (`_relay`)."""
    where = spec_dir(spec.name)
    made = not where.exists()
    guarded = needs_guard(ref)
    outcome.step = "name_check"
    if not made and podman().exists(spec.name):
        # The mount pins (and the guard's files) are written under this name: refuse a taken
        # name first, so the other container's files are left as they are.
        raise Conflict(
            f"the container name {spec.name!r} is already in use",
            NAME_IN_USE_HINT,
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
        guard = bringup.egress_guard()
        try:
            resolv = guard.prepare(spec.name, ref)
            hooks = guard.hook_setup(spec.name)
        except BaseException:
            with contextlib.suppress(Exception):
                guard.detach(spec.name)
            raise
        spec = CreateSpec(**{**fields(spec), "resolv_conf": str(resolv)})
        global_flags = (*global_flags, f"--hooks-dir={hooks}")
    # The id file is named for this run: if the name was taken since, podman refuses before
    # writing it.
    outcome.step = "state_dir"
    cidfile = ensure_dir(where) / f"cid-{secrets.token_hex(6)}"
    argv = (*global_flags, *build_run_argv(spec, str(cidfile)))
    return _relay(
        spec, ref, announce, lambda: podman().start_run((podman().podman_bin(), *argv)), cidfile,
        made=made, guarded=guarded, lock=lock, outcome=outcome,
    )  # fmt: skip


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
    """The second half of a run `linpodx.fastpath.run` began: it took the name's `lock`, recorded
    `container.run` and started `podman run` (`start` hands over that process, or raises what
    starting it raised: then `step` names what failed) from a stored plan of revision
    `profile_id`; with `resolv_conf`, it also launched the egress guard and gave podman the OCI
    hook (as `_run_once` does). Loads that revision fully and goes on as `_run_once` (which
    lets the lock go, and records `container.run.failed` if the run fails)."""
    # Its record is in the chain already (the fast path wrote it): the frame only follows.
    with (
        lock if lock is not None else contextlib.nullcontext(),
        recorded("container.run", req.name or "", None, step=step) as outcome,
    ):
        spec, ref = _resumed(req, profile_id, start, cidfile, made, resolv_conf, outcome)
        return _relay(
            spec, ref, announce, start, cidfile, made=made, guarded=resolv_conf is not None,
            lock=lock, outcome=outcome,
        )  # fmt: skip


def _resumed(
    req: RunRequest,
    profile_id: str,
    start: Callable[[], Child],
    cidfile: Path,
    made: bool,
    resolv_conf: str | None,
    outcome: Outcome,
) -> tuple[CreateSpec, ProfileRef]:
    """The plan of a resumed run, made once podman started (the fast path had a stored one);
    if it cannot be made, the started run is stopped and everything removed."""
    guarded = resolv_conf is not None
    try:
        ref = request.profile_by_id(profile_id)
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
            outcome.removed = podman().remove_quietly(req.name or "") is None
        if guarded:
            with contextlib.suppress(Exception):
                bringup.egress_guard().detach(req.name or "")
        if made:
            remove_spec(req.name or "")
        raise
    return spec, ref


def _relay(
    spec: CreateSpec,
    ref: ProfileRef,
    announce: Announce,
    start: Callable[[], Child],
    cidfile: Path,
    *,
    made: bool,
    guarded: bool,
    lock: namelock.NameLock | None,
    outcome: Outcome,
) -> int:
    """Relay a `podman run --cidfile` that `start` starts (see `_run_once`), then clean up.
    The name's `lock` is let go once the container is announced (the caller lets it go after
    a failure, once everything is removed). `outcome` learns how far it got."""
    seen: list[str] = []
    at = outcome
    # Until podman has made the container (the first use of an image can take many seconds);
    # ended before anything is announced.
    waiting = contextlib.ExitStack()
    waiting.enter_context(progress.waiting(_waiting_for(spec)))
    if at.step in ("prepare", "state_dir"):
        at.step = "podman_run"

    def created(container_id: str, running: Callable[[], bool]) -> None:
        waiting.close()
        seen.append(container_id)
        at.created = True
        if guarded:
            at.step = "egress_guard"
            guard = bringup.egress_guard()
            try:
                guard.attach(spec.name, guard.hook_pid(spec.name, running, container_id), ref)
            except BaseException as exc:
                guard.hook_release(spec.name, f"not started: {exc}", running)
                raise
            guard.hook_release(spec.name, "ready", running)
        at.step = "run_spec"
        save_spec(spec.name, spec_doc(spec, ref, container_id, events.now_iso()))
        emit(
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
        with waiting:
            rc = podman().relay_announced(start(), cidfile, created)
    except BaseException as exc:
        ours = cidfile.exists()  # podman created the container: remove it and its spec
        at.created = at.created or ours
        cidfile.unlink(missing_ok=True)
        if ours and isinstance(exc, LinpodxError):
            raise cleanup(
                spec.name, exc, remove_spec=True, guard_too=guarded, outcome=at
            ) from None
        if guarded:
            with contextlib.suppress(Exception):
                bringup.egress_guard().detach(spec.name)
        if ours:
            at.removed = podman().remove_quietly(spec.name) is None
        if ours or made:
            remove_spec(spec.name)
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
        podman().remove_quietly(cid)
    # podman run --rm removed the container before returning; its guard, if any, ends by
    # itself with the container's network namespace. The name is free again, so a new run of
    # it may have begun meanwhile: only this container's state dir goes.
    forget(spec.name, cid, ask_podman=False)
    return rc


def attached_start(
    name: str, interactive: bool, remove_on_failure: bool, global_flags: Sequence[str] = ()
) -> int:
    """Start NAME attached to this terminal and wait; returns the container's exit status.
    `global_flags`: the mount-check hook's (`pin_mounts`), as `bring_up` returned them.

    If podman could not start it at all (it never ran), the container and its spec are removed
    so nothing is left half-created, and the run's outcome is recorded
    (`container.run.failed`, as when `podman start` fails for a detached run).
    """
    with (
        recorded("container.run", name, None, step="podman_start") as outcome,
        sessions.attached(name, "run"),  # a rollback meanwhile sees this terminal, and says why
    ):
        outcome.created = True
        rc = podman().run_inherited(
            engine.start_attach_argv(name, interactive, global_flags),
            stop=lambda: podman().stop_quietly(name),
        )
    if rc != 0 and remove_on_failure:
        try:
            info = podman().inspect(name)
        except NotFound:
            return rc  # --rm containers are gone once they exit
        except LinpodxError:
            return rc
        started = str(info.get("State", {}).get("StartedAt", ""))
        if started.startswith("0001-01-01") or not started:
            outcome.removed = podman().remove_quietly(name) is None
            remove_spec(name)
            outcome.failed(
                EngineError(f"podman start --attach exited {rc} without starting the container")
            )
            from linpodx.output import note

            note(f"error: podman could not start {name}; it was removed again")
    return rc
