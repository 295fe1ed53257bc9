"""The egress guard API the container lifecycle calls.

    prepare(name, stored)      before `podman create`: writes resolv.conf + policy file and
                               launches the guard process, which waits for the container's pid
    attach(name, pid, stored)  after `podman init`: hands the guard the pid, waits until ready
    status(name)               "none" | "healthy" | "down" (for `linpodx ps`)
    update_profile(stored)     after a re-apply: pushes the new allowlist to running guards
    detach(name)               on removal: stops the guard, forgets the files

Everything fails closed: `attach` raises EngineError unless the filter, the resolver and the
network helper are all up, and the caller then removes the container.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import signal
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linpodx import namelock
from linpodx.egress import launch as launcher
from linpodx.egress import netns
from linpodx.egress.launch import (
    READY_TIMEOUT,
    RESOLV_CONF,
    guard_argv,
    launch,
)
from linpodx.egress.state import EgressState, guard_alive, read_guard, read_json
from linpodx.errors import AuditError, EngineError
from linpodx.fsutil import NotRegularFile, atomic_write, read_small
from linpodx.podman.flags import egress_policy

if TYPE_CHECKING:
    from linpodx.profile.store import StoredProfile

UPDATE_TIMEOUT = 5.0



def policy_doc(stored: StoredProfile) -> dict[str, Any]:
    net = stored.profile.network
    return egress_policy(
        stored.name,
        stored.profile_id,
        int(stored.revision),
        {
            "egress_dns_allowlist": net.egress_dns_allowlist,
            "upstream_dns": net.upstream_dns,
            "allow_private_answers": net.allow_private_answers,
            "wildcard_budget": net.wildcard_budget,
            "max_connections": net.max_connections,
            "max_new_connections_per_second": net.max_new_connections_per_second,
            "helper_max_files": net.helper_max_files,
            "helper_max_memory_mib": net.helper_max_memory_mib,
        },
    )


def _write_policy(st: EgressState, stored: StoredProfile, *, force: bool = False) -> None:
    """Write the policy file, unless it already holds a NEWER revision of the same profile.

    A re-apply pushes its revision here (`update_profile`); a later `linpodx start` passes the
    revision the container was created with, and must not silently undo the audited update.
    """
    st.ensure()
    doc = policy_doc(stored)
    if not force:
        cur = read_json(st.policy_file)
        if (
            isinstance(cur, dict)
            and cur.get("profile") == doc["profile"]
            and isinstance(cur.get("revision"), int)
            and cur["revision"] > doc["revision"]
        ):
            return
    _write_if_changed(st.policy_file, json.dumps(doc, sort_keys=True).encode())


def _write_if_changed(
    path: Path, data: bytes, mode: int | None = None, *, durable: bool = True
) -> None:
    """atomic_write unless `path` already holds exactly `data` (with the wanted mode).

    A guarded start calls prepare() up to three times with the same content; each
    atomic_write costs two fsyncs.
    """
    try:
        same = read_small(path, len(data)) == data
        if same and mode is not None:
            same = (path.stat().st_mode & 0o777) == mode
    except (OSError, NotRegularFile):
        same = False
    if not same:
        if mode is None:
            atomic_write(path, data, durable=durable)
        else:
            atomic_write(path, data, mode=mode, durable=durable)


def prepare(name: str, stored: StoredProfile) -> Path:
    """Write `name`'s resolv.conf and policy file and launch its guard; returns the resolv.conf
    to bind-mount.

    The file must exist before `podman create` (a bind mount needs its source). It is 0644 so
    whatever user the container runs as can read it. The guard is launched here, before
    `podman create`/`podman init`, so its interpreter start-up and imports overlap with
    podman's work instead of adding to it; it waits for `attach` to send the pid.
    """
    st = EgressState(name)
    _write_policy(st, stored)
    # Not fsynced: constant content, rewritten at every bring-up. The policy file is (a
    # re-apply's revision in it must survive a crash).
    _write_if_changed(st.resolv_conf, RESOLV_CONF.encode(), mode=0o644, durable=False)
    launch(name)
    return st.resolv_conf


def init_pid(name: str) -> int | None:
    """The init pid `podman init` wrote for `name` (containers created with the `--pidfile`
    beside their resolv.conf), or None: the caller then asks podman."""
    try:
        raw = read_small(EgressState(name).init_pidfile, 64)
        pid = int(raw.decode().strip()) if raw is not None else 0
    except (OSError, ValueError, NotRegularFile):
        return None
    return pid if pid > 0 else None


def resolv_conf_path(name: str) -> Path | None:
    """The resolv.conf `prepare` wrote for `name`, or None if there is none."""
    p = EgressState(name).resolv_conf
    return p if p.is_file() else None


def hook_setup(name: str) -> Path:
    """`launch.hook_setup`: the OCI hooks dir of `name`'s one-call run."""
    return Path(launcher.hook_setup(name))


MAX_HOOK_STATE = 1 << 20
"""Bytes of OCI state the hook may hand over (runc's is a few hundred)."""


def hook_pid(name: str, running: Callable[[], bool], container_id: str | None = None) -> int:
    """The pid of the container whose OCI state `name`'s hook hands over: the state must be
    JSON for the container `container_id` (when given) being created, with a positive pid.
    EngineError otherwise, or if podman ends first or nothing comes within READY_TIMEOUT (the
    caller then answers the hook with the failure: `hook_release`)."""
    st = EgressState(name)
    fd = os.open(st.hook_fifo, os.O_RDONLY | os.O_NONBLOCK)
    data = b""
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline and running() and len(data) <= MAX_HOOK_STATE:
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:  # the hook closed its end (readable at EOF only after a writer)
                    break
                data += chunk
    finally:
        os.close(fd)
    try:
        state = json.loads(data)
        pid = state["pid"]
        ok = (
            type(pid) is int
            and pid > 0
            and state.get("status", "creating") == "creating"
            and (container_id is None or state.get("id") == container_id)
        )
    except (ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise EngineError(
            f"the egress hook of {name} did not hand over this container's state",
            "the container was not started; see `linpodx doctor`",
        )
    return int(pid)


def hook_release(name: str, answer: str, running: Callable[[], bool]) -> None:
    """Answer `name`'s waiting hook: `ready` lets the container's command start, anything else
    (said on its stderr) keeps it from ever starting. EngineError if `ready` cannot be told."""
    st = EgressState(name)
    deadline = time.monotonic() + READY_TIMEOUT
    line = (answer.replace("\n", " ")[:4000] + "\n").encode()
    while True:
        try:
            fd = os.open(st.hook_answer_fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            # ENXIO: the hook has not opened its end yet (it first writes the state out).
            if exc.errno != errno.ENXIO or time.monotonic() >= deadline or not running():
                if answer == "ready":
                    raise EngineError(
                        f"the egress hook of {name} could not be told to go on: {exc}",
                        "the container was not started; see `linpodx doctor`",
                    ) from None
                return
            time.sleep(0.001)
            continue
        try:
            os.set_blocking(fd, True)
            os.write(fd, line)
        finally:
            os.close(fd)
        return


_LOG_TAIL_BYTES = 64 << 10


def _log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of the guard's log, for an error message. Only a regular file, read
    without following a link or blocking (a FIFO there must not hang a command holding the
    container's lock), and only its last 64 KiB."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        data = os.pread(fd, _LOG_TAIL_BYTES, max(0, st.st_size - _LOG_TAIL_BYTES))
    except OSError:
        return ""
    finally:
        os.close(fd)
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def attach(name: str, pid: int, stored: StoredProfile) -> None:
    """Start the egress guard for `name` (init PID `pid`); raises EngineError on failure.

    Returns only when nft rules, the policy resolver and the network helper are all up. On
    any failure the guard is stopped and EngineError raised; the caller removes the container.
    """
    if not stored.profile.network.egress_dns_allowlist:
        raise EngineError(
            "egress guard asked for a profile without an allowlist",
            "a container without an allowlist has no network; do not attach a guard",
        )
    st = EgressState(name)
    prepare(name, stored)
    old = read_guard(st)
    if old is not None and guard_alive(old, name):
        _stop_guard(old)
    with contextlib.suppress(FileNotFoundError):
        st.guard_file.unlink()
    ctl = launcher.take_launched(name)
    try:
        _send_order(ctl, pid)
        _await_ready(name, pid, st, ctl)
    finally:
        ctl.close()


def _send_order(ctl: socket.socket, pid: int) -> None:
    """Hand the waiting guard its container's pid (and the helper choice, read now)."""
    order = {"pid": pid, "helper": os.environ.get("LINPODX_EGRESS_HELPER") or None}
    with contextlib.suppress(OSError):  # a guard that is gone shows up as EOF below
        ctl.sendall(json.dumps(order).encode() + b"\n")


def _await_ready(name: str, pid: int, st: EgressState, ctl: socket.socket) -> None:
    """Wait until the guard reports `ready` for `pid`; raise EngineError if it fails or ends.

    The guard writes a line on the control socket after each state change, so this wakes at
    once instead of polling; guard.json stays the one source of what the state is.
    """
    deadline = time.monotonic() + READY_TIMEOUT
    pasta_started = False
    ended = False
    while not ended:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        r, _, _ = select.select([ctl], [], [], left)
        if r:
            try:
                ended = not ctl.recv(4096)
            except OSError:
                ended = True
        info = read_guard(st)
        if info is None:
            continue
        state = info.get("state")
        if state == "filtered" and info.get("helper") == "pasta" and not pasta_started:
            # Rootless pasta must run as the plain user, outside the user namespace; the
            # guard has loaded the filter already and adopts pasta by its pid file.
            pasta_started = True
            files, mib = info.get("helper_max_files"), info.get("helper_max_memory_mib")
            if type(files) is not int or type(mib) is not int:
                # The guard checks them on pasta before `ready` anyway; without them, no
                # pasta is started and the guard fails to see one (fail closed).
                continue
            launcher.spawn_detached(
                netns.external_pasta_argv(
                    pid, st.pasta_pidfile, int(info["guard_pid"]),
                    netns.HelperLimits(files, mib),
                ),
                str(st.helper_log),
            )  # fmt: skip
        if state == "ready" and info.get("container_pid") == pid:
            return
        if state in ("failed", "stopped"):
            raise EngineError(
                f"egress filter for {name} could not be set up: {info.get('error', state)}",
                "the container was not started; see `linpodx doctor` "
                f"and the guard log {st.guard_log.name} in the container's state dir",
                stderr=_log_tail(st.guard_log),
            )
    info = read_guard(st)
    if info is not None:
        _stop_guard(info)
    why = "ended before it was ready"
    if not ended:
        why = f"did not become ready within {READY_TIMEOUT:g}s"
    raise EngineError(
        f"egress filter for {name} {why}",
        "the container was not started; see `linpodx doctor`",
        argv=guard_argv(name),
        stderr=_log_tail(st.guard_log),
    )


def _stop_guard(info: dict[str, Any], timeout: float = 5.0) -> None:
    pid = info.get("guard_pid")
    if not isinstance(pid, int):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def detach(name: str) -> None:
    """Stop the guard of `name` if one runs (or waits for its pid) and forget its files."""
    launcher.forget_launch(name)
    st = EgressState(name)
    info = read_guard(st)
    if info is not None and guard_alive(info, name):
        _stop_guard(info)
    shutil.rmtree(st.dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        st.dir.parent.rmdir()  # only if nothing else of this container's is left there


def _containers_of(profile: str) -> list[str]:
    from linpodx.paths import containers_dir

    out: list[str] = []
    base = containers_dir()
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        if d.name.startswith("."):
            continue  # .locks and the like, not containers
        doc = read_json(EgressState(d.name).policy_file)
        if isinstance(doc, dict) and doc.get("profile") == profile:
            out.append(d.name)
    return out


def update_profile(stored: StoredProfile, *, only_stale: bool = False) -> list[str]:
    """Push a re-applied profile's allowlist to its running containers; returns names updated.

    Each update is recorded in the admin audit chain (`egress.update`) BEFORE the guard sees
    it; if the record cannot be written nothing changes (AuditError). The guard acknowledges
    by reporting the new revision; a guard that does not within UPDATE_TIMEOUT is an error.

    `only_stale`: only containers whose policy file or running guard is not at `stored`'s
    revision (an unchanged re-apply finishing the push of an apply that was cut short).
    """
    updated: list[str] = []
    failed: list[str] = []
    for name in _containers_of(stored.name):
        # The container's name lock: a run or start of it that is bringing its guard up
        # finishes first (its guard is then `ready` and takes the update), and never writes
        # its creation revision over this one in the middle.
        with namelock.acquire(name):
            if only_stale and not _stale(name, stored):
                continue
            outcome = _push_one(name, stored)
        if outcome == "updated":
            updated.append(name)
        elif outcome == "failed":
            failed.append(name)
    if failed:
        raise EngineError(
            f"egress guard did not take the new allowlist: {', '.join(failed)}",
            "restart those containers with `linpodx stop` and `linpodx start`",
        )
    return updated


def _stale(name: str, stored: StoredProfile) -> bool:
    """Container `name`'s policy file, or its running guard, is not at `stored`'s revision."""
    st = EgressState(name)
    cur = read_json(st.policy_file)
    if not isinstance(cur, dict) or cur.get("revision") != int(stored.revision):
        return True
    info = read_guard(st)
    if info is None or info.get("state") != "ready" or not guard_alive(info, name):
        return False  # no guard runs: the file is what its next start takes
    return bool(info.get("policy_revision") != int(stored.revision))


def _push_one(name: str, stored: StoredProfile) -> str:
    """Record and push `stored` to container `name`'s guard (its name lock held):
    "updated" once the guard took it, "stopped" if no guard runs (the file waits for the next
    start), "failed" if the guard did not take it in time."""
    st = EgressState(name)
    info = read_guard(st)
    running = info is not None and info.get("state") == "ready" and guard_alive(info, name)
    # An empty allowlist is enforced too: every name denied, every set entry flushed;
    # the next `linpodx start` creates the container without any network.
    try:
        from linpodx.audit.chain import admin_chain

        admin_chain().append(
            "egress.update",
            {
                "container": name,
                "profile": stored.name,
                "profile_id": stored.profile_id,
                "revision": int(stored.revision),
                "allowlist": list(stored.profile.network.egress_dns_allowlist),
                "wildcard_budget": stored.profile.network.wildcard_budget,
                "running": running,
            },
        )
    except AuditError:
        raise
    except Exception as exc:
        raise AuditError(
            f"could not record the egress update for {name}: {exc}",
            "nothing was changed; check the audit log with `linpodx audit verify`",
        ) from exc
    _write_policy(st, stored, force=True)
    if not running or info is None:
        return "stopped"
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(int(info["guard_pid"]), signal.SIGHUP)
    deadline = time.monotonic() + UPDATE_TIMEOUT
    while time.monotonic() < deadline:
        now = read_guard(st)
        if now is not None and now.get("policy_revision") == int(stored.revision):
            return "updated"
        time.sleep(0.05)
    return "failed"
