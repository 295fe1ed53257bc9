"""`linpodx run --rm --profile NAME …` without a terminal: podman first, the rest while it works.

`podman run --rm IMAGE true` takes ~0.3 s here, and Python needs ~20 ms to start plus ~100 ms
to import what a full `linpodx run` uses (the profile model and loader, the argv builder,
dataclasses, pathlib, subprocess, …). Most of podman's 0.3 s is spent waiting (on runc, conmon,
the storage), so the work linpodx must do before podman starts is kept to what cannot wait,
and everything else happens while podman runs:

before podman starts (only the kernel `linpodx.fastpath.KERNEL` names; checked by
tests/unit/test_fastrun.py):
  1. the stored plan of the profile's current revision (`linpodx.fastpath.plan`: the podman flags
     the full path built for it on this host, used only if everything they came from is
     unchanged);
  2. the profile's mount sources checked on the host again, the name's lock taken
     (`linpodx.namelock`: held until the container is announced, so that a second run of the
     name waits and then finds it taken) and the sources pinned for runc's mount-check hook
     (`linpodx.podman.mountpin`), as the full path does;
  3. the `container.run` record, appended to the admin chain and fsynced: audited before it
     takes effect, as always;
  4. with an egress allowlist, the guard's policy file and resolv.conf, the guard launched
     (waiting for the container's pid) and the OCI hook that holds the command back until the
     guard is ready (`linpodx.egress.launch`), as the full path does;
  5. `podman run --cidfile` started with its output in pipes.
then, while podman works: the full modules are imported (in a thread of lower CPU priority,
`linpodx.yielding`), the revision is loaded and checked as the full path does, and
`containers.run_started` goes on exactly like a full run: the guard is given the pid, the run
spec is saved and the container announced before any of its output is passed on.

Whenever something is not plain (no plan, or not a current one; an audit log that needs a
first record or a repair; with an allowlist, a name that already has a state dir; anything
that would be an error), this returns None before doing anything, and the full path runs
instead and says what is wrong.
"""

from __future__ import annotations

import os

from linpodx import namelock, paths, proc
from linpodx.audit import writer
from linpodx.errors import LinpodxError
from linpodx.fastpath import plan as plans
from linpodx.output import envelope, note, print_error, print_json, print_lines, print_status
from linpodx.podman import mountpin, runline, spawn

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from typing import Any

    from linpodx.containers import Announce, ContainerInfo
    from linpodx.fastpath.argv import PlainRun
    from linpodx.podman.argv import CreateSpec

finished = False
"""True once a run that took this path has ended (`cli.main.entry` then skips the interpreter's
teardown)."""


def main(fields: PlainRun) -> int | None:
    """`linpodx run` of what `linpodx.fastpath.argv.parse_fields` read, if it can take the fast
    path: its exit status (linpodx's own, with the error printed, on a failure after it took
    it); None, with nothing done, if the full path must run it."""
    try:
        return run(fields, announce)
    except LinpodxError as err:
        return fail(False, err)


def fail(json_mode: bool, err: LinpodxError) -> int:
    """Print a failed run's error (and its envelope with --json); its exit status."""
    if json_mode:
        print_json(envelope("run", error=err))
    print_error(err)
    return err.exit_code


def announce(
    info: ContainerInfo, spec: CreateSpec, json_mode: bool = False, detached: bool = False
) -> None:
    """Notes about clamped limits on stderr, then the container's id, name and state (on both
    paths: `linpodx.cli.runcmd` announces the full path's run with this too).

    stdout is data: a detached run prints the bare id there (as `podman run -d` does, so
    `id=$(linpodx run -d …)` works) or, with `--json`, the envelope; a foreground run's stdout
    is the container's own output, so its `container_id:`/`name:`/`state:` go to stderr."""
    from linpodx.podman.argv import limit_notes

    for line in limit_notes(spec):
        note(f"note: {line}")
    result = {"container_id": info.container_id, "name": info.name, "state": info.state}
    if json_mode:
        print_json(envelope("run", {**result, **info.to_dict()}))
    elif detached:
        print_lines([info.container_id])
        print_status({"name": info.name, "state": info.state})
    else:
        print_status(result)  # flushed before the container's output or terminal follows


class _Taken:
    """A run the fast path has taken (its name's lock held): what every step after that reads."""

    __slots__ = ("announce", "fields", "lock", "name", "plan")

    def __init__(
        self,
        fields: PlainRun,
        plan: plans.Plan,
        name: str,
        announce: Announce,
        lock: namelock.NameLock,
    ) -> None:
        self.fields = fields
        self.plan = plan
        self.name = name
        self.announce = announce
        self.lock = lock


def run(fields: PlainRun, announce: Announce) -> int | None:
    """Run the request if it can take the fast path and return the exit status; None, with
    nothing done, if the full path must run it."""
    if not fields.rm or fields.tty or fields.detach or fields.profile is None:
        return None
    try:
        pull = runline.pull_policy(fields.pull)
    except LinpodxError:
        return None  # the full path refuses it with the same words
    if runline.create_pull(pull) != pull:
        # `always`/`newer`: linpodx pulls first, with podman's progress on stderr (the full
        # path). With `missing`, podman's run pulls an image it does not have by itself.
        return None
    profile = fields.profile
    fields = fields.replace(pull=pull)
    plan = plans.load(profile)
    podman = proc.which("podman")
    if plan is None or podman is None:
        return None
    name = f"linpodx-{os.urandom(4).hex()}" if fields.name is None else fields.name
    try:
        head = runline.head(name, None)
        runline.validate_image(fields.image)
    except LinpodxError:
        return None  # the full path refuses it with the same words
    from linpodx.profile import hostpaths

    pins: list[mountpin.Pin] = []
    for source, target in plan.mounts:
        ident = hostpaths.pin_mount_source(source)[0]
        if ident is None:
            return None  # a mount source is no longer fine: the full path refuses and says why
        pins.append((ident[0], ident[1], target))
    where = os.path.join(paths.containers_root(), name)
    try:
        # Held until the container is announced (or everything is removed again): another run
        # of this name waits, then finds the name taken (`linpodx.namelock`).
        lock = namelock.acquire(name)
    except OSError:
        return None  # the full path takes it again and says what is wrong
    try:
        rc = _locked(_Taken(fields, plan, name, announce, lock), podman, head, pins, where)
    finally:
        lock.release()
    return rc


def _rollback_pending(name: str) -> bool:
    """Whether a rollback journal of NAME is there, or might be (anything but "no such file":
    the full path then looks, and refuses if it cannot)."""
    try:
        return paths.rollback_pending(name)
    except OSError:
        return True


def _locked(
    taken: _Taken, podman: str, head: list[str], pins: list[mountpin.Pin], where: str
) -> int | None:
    """`run` from the name's lock on: None (nothing done) if the full path must run it."""
    fields, plan, name = taken.fields, taken.plan, taken.name
    if os.path.exists(where) or _rollback_pending(name):
        # The pins (and the guard's files) would be another's, or a rollback of that name was
        # interrupted: the full path checks and refuses with the right words.
        return None
    record = plans.run_record(
        name=name,
        image=fields.image,
        profile=plan.profile,
        profile_id=plan.profile_id,
        revision=plan.revision,
        audit_hash=plan.audit_hash,
        command=fields.command,
        interactive=fields.interactive,
        tty=False,
        rm=True,
        limits_not_applied=plan.limits_not_applied,
    )
    if not writer.append_simple(paths.admin_log(), "container.run", record):
        return None
    # Recorded: from here on this run happens (or fails) like a full one.
    cidfile = os.path.join(where, f"cid-{os.urandom(6).hex()}")
    child: proc.Child | None = None
    failed: BaseException | None = None
    held: spawn.Held | None = None
    resolv = pidfile = None
    what = "the run's state dir"
    try:
        paths.ensure_dir_str(where)
        # What the mount sources were just checked to be, for runc's mount-check hook.
        global_flags = mountpin.hooks_flags(mountpin.setup(where, pins))
        if plan.egress_policy is not None:
            what = "the egress guard"
            resolv, pidfile, guard_flags = _guard_first(name, plan.egress_policy)
            global_flags += guard_flags
        tail = runline.tail(
            mount_gate=mountpin.gate_path(where) if pins else None,
            resolv_conf=resolv,
            pidfile=pidfile,
            pull=fields.pull or runline.PULL_DEFAULT,  # settled by `run`: never or missing
            rm=True,
            interactive=fields.interactive,
            tty=False,
            image=fields.image,
            command=fields.command,
        )
        run_argv = runline.run_form([*head, *plan.flags, *tail], cidfile)
        what = "podman run"
        child = proc.Child([podman, *global_flags, *run_argv])
        # As `engine.relay_announced` does while it waits (until `_go_on` is done): a Ctrl-C
        # reaches podman too (same process group), SIGTERM and SIGHUP are passed on to it, and
        # either ends the run; this process then cleans up after it instead of leaving in the
        # middle.
        held = spawn.hold_signals(child.signal)
    except (OSError, LinpodxError) as exc:
        failed = exc
    try:
        return _go_on(taken, child, (what, failed), cidfile, resolv)
    finally:
        if held is not None:
            spawn.restore_signals(held)


def _guard_first(name: str, policy: dict[str, Any]) -> tuple[str, str, list[str]]:
    """What a guarded one-call run needs before podman starts (as `containers.pipeline`
    does through `guard.prepare` and `guard.hook_setup`): the guard's policy file and
    resolv.conf, the guard itself (waiting for the container's pid), and the OCI hook that
    holds the container's command back until the guard is ready. Returns the resolv.conf, the
    pid file `podman run` writes for the guard, and podman's global flags."""
    from linpodx.egress import launch

    resolv = launch.write_new_run_files(name, policy)
    launch.launch(name)
    hooks = launch.hook_setup(name)
    pidfile = os.path.join(os.path.dirname(resolv), runline.INIT_PIDFILE)
    return resolv, pidfile, [f"--hooks-dir={hooks}"]


def _go_on(
    taken: _Taken,
    child: proc.Child | None,
    failure: tuple[str, BaseException | None],
    cidfile: str,
    resolv: str | None,
) -> int:
    """The part that runs while podman works: the full modules, then `containers.run_started`."""
    # Most of what this process does while podman creates the container, none of it what
    # podman waits for: at a lower CPU priority (a filtered run took ~30 ms longer without).
    from linpodx.yielding import import_yielding

    heavy = ("linpodx.containers.pipeline", "linpodx.profile.store", "linpodx.podman.engine")
    import_yielding((*heavy, "linpodx.egress.guard") if resolv else heavy)
    from pathlib import Path

    from linpodx import containers
    from linpodx.errors import EngineError
    from linpodx.podman.hints import PODMAN_HINT

    def start() -> proc.Child:
        what, failed = failure
        if isinstance(failed, LinpodxError):
            raise failed
        if child is None:
            hint = PODMAN_HINT if what == "podman run" else "see `linpodx doctor`"
            raise EngineError(f"{what} could not be started: {failed}", hint) from failed
        return child

    fields = taken.fields
    req = containers.RunRequest(
        image=fields.image,
        name=taken.name,
        profile=fields.profile,
        command=fields.command,
        interactive=fields.interactive,
        tty=False,
        detach=False,
        rm=True,
        pull=fields.pull,
    )
    global finished
    what, failed = failure
    steps = {"the run's state dir": "state_dir", "the egress guard": "egress_guard"}
    rc = containers.run_started(
        req, taken.plan.profile_id, start, Path(cidfile), made=True, announce=taken.announce,
        resolv_conf=resolv, lock=taken.lock,
        step=steps.get(what, "podman_run") if failed is not None else "podman_run",
    )  # fmt: skip
    finished = True
    return rc
