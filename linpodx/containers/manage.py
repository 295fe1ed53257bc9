"""The verbs on existing containers: start, stop, rm, exec, ps, inspect, logs."""

from __future__ import annotations

import contextlib
from typing import Any

from linpodx.containers import bringup, record, request, sessions
from linpodx.containers.bringup import bring_up, say
from linpodx.containers.listing import egress_status as egress_status  # re-exported
from linpodx.containers.listing import ps as ps  # re-exported: the package's API
from linpodx.containers.listing import revision_of as revision_of  # re-exported
from linpodx.containers.plan import check_mount_sources, needs_guard, unapplied_limits
from linpodx.containers.record import audit_stopping, emit, recorded
from linpodx.containers.request import ContainerInfo
from linpodx.containers.runner import podman
from linpodx.containers.state import (
    load_spec,
    lock_name,
    refuse_if_rolling_back,
    remove_spec,
    renamed_from,
    spec_dir,
)
from linpodx.errors import (
    EngineError,
    InvalidInput,
    LinpodxError,
    NotFound,
    NotManaged,
    UsageError,
)
from linpodx.podman import engine
from linpodx.podman.runline import MANAGED_LABEL, validate_name
from linpodx.profile.model import ProfileRef
from linpodx.suggest import add_to_hint


def managed_info(name: str) -> dict[str, Any]:
    """Inspect NAME and refuse containers linpodx did not create."""
    validate_name(name)
    # A rollback that was killed part-way may have renamed NAME aside or left it stopped, and
    # swapped half its workspace: nothing acts on it until `snapshot recover` put it back.
    refuse_if_rolling_back(name)
    try:
        info = podman().inspect(name)
    except NotFound as err:
        err.hint = add_to_hint(err.hint, name, managed_names())
        raise
    if engine.labels_of(info).get(MANAGED_LABEL) != "1":
        raise NotManaged(
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


def managed_names() -> list[str]:
    """The names of every linpodx container (for a did-you-mean; [] if podman cannot say)."""
    try:
        rows = podman().list_managed(True)
    except LinpodxError:
        return []
    return [str(n) for r in rows for n in (r.get("Names") or [])[:1]]


def _ref_for(name: str, info: dict[str, Any]) -> ProfileRef:
    labels = engine.labels_of(info)
    pid = labels.get("linpodx.profile_id", "")
    if not pid:
        raise InvalidInput(
            f"container {name} has no linpodx.profile_id label",
            f"remove it with `linpodx rm {name}`",
        )
    return request.profile_by_id(pid)


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
    check_mount_sources(ref)  # before the record; `bring_up` pins them for podman start
    # A profile's limits this host cannot apply: refused (required) or recorded (best effort).
    unapplied = unapplied_limits(ref)
    try:
        # Before the record too: a start that cannot happen is not recorded as one.
        spec = load_spec(name)
    except NotFound:
        was = renamed_from(str(info.get("Id", "")), name)
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
        raise NotManaged(
            f"container {name} is not the one linpodx created under that name (its id differs "
            "from the run spec's)",
            f"it was created or replaced outside linpodx; remove it with `podman rm {name}` "
            "and create it again with `linpodx run`",
        )
    data: dict[str, Any] = {
        "name": name, "profile_id": ref.profile_id, "revision": labels.get("linpodx.revision")
    }
    if unapplied:
        data["limits_not_applied"] = unapplied
    with recorded("container.start", name, data) as outcome:
        resolv = spec.get("resolv_conf") if needs_guard(ref) else None
        try:
            if engine.state(info) == "initialized":
                # A run or start killed between `podman init` and its start left it so (its
                # command never ran; with an allowlist it has no network). podman refuses to
                # init it again ("container state improper"): take it back to stopped first.
                podman().stop(name, timeout=0)
            bring_up(name, ref, start=True, resolv=resolv, outcome=outcome)
        except BaseException as err:
            # Any failure (also an OSError of the state dir, or Ctrl-C): do not remove a
            # stopped container's state; make sure it is not left running unguarded. The
            # frame records `container.start.failed` once the hint says so.
            with contextlib.suppress(LinpodxError):
                podman().stop(name, timeout=0)
                outcome.removed = True
            with contextlib.suppress(Exception):
                if needs_guard(ref):
                    bringup.egress_guard().detach(name)
            said = (
                f"{name} was left stopped"
                if outcome.removed
                else f"stopping {name} failed too; stop it with `linpodx stop {name}`"
            )
            if isinstance(err, LinpodxError):
                err.hint = (err.hint + "; " if err.hint else "") + said
            else:
                say(f"note: {said}")
            raise
    emit("container.start", name=name, profile=ref.name, revision=ref.revision)
    info = podman().inspect(name)
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
    podman().stop(name, timeout)
    emit("container.stop", name=name)
    return {
        "container_id": str(info.get("Id", "")),
        "name": name,
        "state": engine.state(podman().inspect(name)) if podman().exists(name) else "removed",
    }


def remove(name: str, force: bool = False) -> dict[str, Any]:
    """`linpodx rm NAME`: the container, its guard and its spec dir (audited first), holding
    the name's lock (`lock_name`), so that it never removes the files of a run of that name
    that is under way."""
    with lock_name(name):
        return _remove(name, force)


def _remove(name: str, force: bool) -> dict[str, Any]:
    refuse_if_rolling_back(name)
    present = podman().exists(name)
    container_id: str | None = None  # (one already gone: its id is not known here)
    if present:
        info = managed_info(name)
        container_id = str(info.get("Id", ""))
        if engine.state(info) == "running" and not force:
            raise InvalidInput(
                f"container {name} is running",
                f"stop it first (`linpodx stop {name}`) or use --force",
            )
    elif not spec_dir(name).exists():
        raise NotFound(
            f"container not found: {name}",
            add_to_hint("list linpodx containers with `linpodx ps --all`", name, managed_names()),
        )
    audit_stopping("container.rm", {"name": name, "force": force, "present": present})
    if present:
        try:
            podman().remove(name, force=force)
        except EngineError:
            if podman().exists(name):
                raise
            # Gone meanwhile (a `--rm` container that ended): its state goes all the same.
    with contextlib.suppress(Exception):
        bringup.egress_guard().detach(name)
    remove_spec(name)
    emit("container.rm", name=name)
    if not present:
        # What a `linpodx rm` killed after `podman rm` leaves (or a `--rm` container whose
        # clean-up hook did not run): say so rather than let "removed" suggest a container.
        from linpodx.output import note

        with contextlib.suppress(OSError):
            note(
                f"note: container {name} was already gone (an earlier removal may have been "
                "interrupted); removed the state linpodx kept for it"
            )
    return {"container_id": container_id, "name": name, "removed": True, "present": present}


def exec_in(name: str, command: tuple[str, ...], interactive: bool, tty: bool) -> int:
    """`linpodx exec NAME -- CMD…` (audited with its argv first); returns the command's status."""
    if not command:
        raise UsageError("exec needs a command", f"use `linpodx exec {name} -- CMD ARGS…`")
    info = managed_info(name)
    if engine.state(info) != "running":
        raise InvalidInput(
            f"container {name} is not running", f"start it with `linpodx start {name}`"
        )
    record.audit(
        "container.exec",
        {"name": name, "argv": list(command), "interactive": interactive, "tty": tty},
    )
    emit("container.exec", name=name, argv=list(command))
    return podman().run_inherited(engine.exec_argv(name, command, interactive, tty))


def attach(
    name: str, *, detach_keys: str | None = None, no_stdin: bool = False, sig_proxy: bool = True
) -> int:
    """`linpodx attach NAME`: this terminal to a running linpodx container's (audited first);
    returns podman's status (the container's when it ends, 0 after a detach).

    The name's lock is held for the checks, the record and the session marker (`sessions`),
    not for the session: a rollback or stop of NAME then waits only for those, and finds this
    session marked (a rollback that holds the lock is waited for, and this attaches to the
    container it made)."""
    with contextlib.ExitStack() as session:
        with lock_name(name):
            info = managed_info(name)
            if engine.state(info) != "running":
                raise InvalidInput(
                    f"container {name} is not running",
                    f"start it with `linpodx start {name}` (attach goes to a running container)",
                )
            argv = engine.attach_argv(
                name, detach_keys=detach_keys, no_stdin=no_stdin, sig_proxy=sig_proxy
            )
            record.audit(
                "container.attach",
                {"name": name, "id": info.get("Id"), "no_stdin": no_stdin,
                 "detach_keys": detach_keys, "sig_proxy": sig_proxy},
            )  # fmt: skip
            session.enter_context(sessions.attached(name, "attach"))
        emit("container.attach", name=name)
        return podman().run_inherited(argv)


REDACTED = "(set by run -e/--env-file/--secret; not shown)"


def _secret_variable(secret: str) -> str:
    """The variable a `NAME,type=env[,target=VAR]` secret sets (VAR, else NAME)."""
    name, _, options = secret.partition(",")
    for option in options.split(","):
        if option.startswith("target="):
            return option[len("target=") :]
    return name


def inspect(name: str) -> dict[str, Any]:
    """`podman inspect` of a linpodx container (refuses others), without the values of the
    run's own variables (`run -e`/`--env-file`: their names are in the run spec), which podman
    keeps and shows as it shows the profile's, nor of `--secret …,type=env` variables."""
    info = managed_info(name)
    keys: set[str] | None
    try:
        spec = load_spec(name)
        keys = {str(k) for k in spec.get("env_keys") or ()}
        # podman shows a `type=env` secret's value there too (podman 4.3 does).
        keys |= {_secret_variable(str(s)) for s in spec.get("secrets") or () if ",type=env" in s}
    except LinpodxError:
        keys = None  # which variables were the run's cannot be told: no value is shown
    env = (info.get("Config") or {}).get("Env")
    if isinstance(env, list) and keys != set():
        shown = []
        for entry in env:
            key = str(entry).partition("=")[0]
            shown.append(f"{key}={REDACTED}" if keys is None or key in keys else entry)
        info["Config"]["Env"] = shown
    return info


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

    argv = engine.logs_argv(name, follow)
    rc = podman().stream_chunks(argv, lambda raw: write(escaper.feed(raw)))
    write(escaper.end())
    if last != "\n":
        write("\n")  # the last line ends like every other
    return rc
