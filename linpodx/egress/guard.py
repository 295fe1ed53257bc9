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
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from linpodx import proc
from linpodx.egress import netns
from linpodx.egress.netns import RESOLVER_ADDR
from linpodx.egress.state import EgressState
from linpodx.errors import AuditError, EngineError
from linpodx.fsutil import atomic_write
from linpodx.paths import ensure_dir

if TYPE_CHECKING:
    from linpodx.profile.store import StoredProfile

READY_TIMEOUT = 30.0
WAIT_TIMEOUT = 300.0
"""How long a launched guard waits for its container's pid before it ends by itself."""
UPDATE_TIMEOUT = 5.0
GUARD_COMMAND = "_egress-guard"
GUARD_MODULE = "linpodx.egress.runner"

RESOLV_CONF = (
    "# written by linpodx: the policy resolver is this container's only DNS server\n"
    f"nameserver {RESOLVER_ADDR}\n"
    "options timeout:2 attempts:2\n"
)


def _policy_doc(stored: StoredProfile) -> dict[str, Any]:
    net = stored.profile.network
    return {
        "profile": stored.name,
        "profile_id": stored.profile_id,
        "revision": int(stored.revision),
        "allowlist": list(net.egress_dns_allowlist),
        "upstream_dns": list(net.upstream_dns),
        "allow_private_answers": bool(net.allow_private_answers),
    }


def _write_policy(st: EgressState, stored: StoredProfile, *, force: bool = False) -> None:
    """Write the policy file, unless it already holds a NEWER revision of the same profile.

    A re-apply pushes its revision here (`update_profile`); a later `linpodx start` passes the
    revision the container was created with, and must not silently undo the audited update.
    """
    st.ensure()
    doc = _policy_doc(stored)
    if not force:
        try:
            cur = json.loads(st.policy_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cur = None
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
        same = path.read_bytes() == data
        if same and mode is not None:
            same = (path.stat().st_mode & 0o777) == mode
    except OSError:
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
        pid = int(EgressState(name).init_pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def resolv_conf_path(name: str) -> Path | None:
    """The resolv.conf `prepare` wrote for `name`, or None if there is none."""
    p = EgressState(name).resolv_conf
    return p if p.is_file() else None


CONTROL_FD = 3
"""The guard's end of its control socket (the CLI keeps the other end)."""

# name -> the CLI's end of the control socket of a launched guard still waiting for its pid.
_launched: dict[str, socket.socket] = {}


def guard_argv(name: str) -> list[str]:
    """How the guard is started. Rootless it runs under `podman unshare`, i.e. as uid 0 of
    the rootless user namespace, so it may join the container's netns and run nft there
    (`podman unshare` passes the control socket through like any inherited fd)."""
    argv = [
        sys.executable,
        "-m",
        GUARD_MODULE,
        "--container",
        name,
        "--control-fd",
        str(CONTROL_FD),
        "--wait",
        f"{WAIT_TIMEOUT:g}",
    ]
    if os.geteuid() != 0:
        argv = [proc.which("podman") or "podman", "unshare", *argv]
    return argv


def launch(name: str) -> None:
    """Start `name`'s guard now; it waits (at most WAIT_TIMEOUT) for `attach` to send the pid.

    The guard ends by itself when the control socket closes (this process ended or `detach`
    ran) before a pid came, so a launch that is never attached leaves nothing behind.
    """
    old = _launched.get(name)
    if old is not None and not _hung_up(old):
        return
    _forget_launch(name)
    st = EgressState(name)
    st.ensure()
    ours, theirs = socket.socketpair()
    try:
        _spawn_detached(guard_argv(name), st.guard_log, control=theirs.fileno())
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    _launched[name] = ours


HOOK_SCRIPT = Path(__file__).with_name("hook.py")
HOOK_FILE = "linpodx-egress.json"


def hook_setup(name: str) -> Path:
    """Make `name`'s OCI hooks dir (for `podman --hooks-dir=DIR run`) and the FIFO through
    which its `createRuntime` hook (hook.py) hands over the container's pid; returns the dir.

    For one-call runs (`containers._run_once`): the hook holds the container's command back
    until the guard is ready, so create, init, attach and start need no separate podman calls.
    """
    st = EgressState(name)
    hooks = ensure_dir(st.hooks_dir)
    with contextlib.suppress(FileNotFoundError):
        st.hook_fifo.unlink()
    os.mkfifo(st.hook_fifo, 0o600)
    hook = {
        "version": "1.0.0",
        "hook": {
            "path": sys.executable,
            "args": [
                sys.executable, "-I", "-S", str(HOOK_SCRIPT),
                str(st.hook_fifo), str(st.guard_file), f"{READY_TIMEOUT:g}",
            ],
            # runc ends a hook that outlives this, and the container does not start.
            "timeout": int(READY_TIMEOUT) + 10,
        },
        "when": {"always": True},
        "stages": ["createRuntime"],
    }  # fmt: skip
    atomic_write(hooks / HOOK_FILE, json.dumps(hook).encode(), durable=False)  # one run's
    return hooks


def hook_pid(name: str, running: Callable[[], bool]) -> int:
    """The container pid `name`'s hook hands over; EngineError if podman ends first or none
    comes within READY_TIMEOUT."""
    st = EgressState(name)
    fd = os.open(st.hook_fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        data = b""
        while b"\n" not in data and time.monotonic() < deadline and running():
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                chunk = os.read(fd, 64)
                if not chunk:  # the hook came and went (readable at EOF only after a writer)
                    break
                data += chunk
    finally:
        os.close(fd)
    line = data.split(b"\n", 1)[0]
    if not line.isdigit() or int(line) <= 0:
        raise EngineError(
            f"the egress hook of {name} did not hand over the container's pid",
            "the container was not started; see `linpodx doctor`",
        )
    return int(line)


def _hung_up(sock: socket.socket) -> bool:
    """A waiting guard never writes before it has a pid: readable means it is gone."""
    r, _, _ = select.select([sock], [], [], 0)
    return bool(r)


def _forget_launch(name: str) -> None:
    sock = _launched.pop(name, None)
    if sock is not None:
        sock.close()


def _spawn_detached(argv: list[str], log: Path, control: int | None = None) -> None:
    """Start `argv` in its own session, detached (double fork: no zombie, no parent to wait);
    `control` becomes its fd CONTROL_FD.

    Popen is not enough: the long-lived parent (a test run, a shell) would keep a zombie that
    looks alive to `status`. This module owns the guard's lifetime, hence the raw fork.
    """
    logfd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child side
            try:
                os.setsid()
                if os.fork() != 0:
                    os._exit(0)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.dup2(logfd, 1)
                os.dup2(logfd, 2)
                keep = 3
                if control is not None:
                    os.dup2(control, CONTROL_FD)
                    os.set_inheritable(CONTROL_FD, True)
                    keep = CONTROL_FD + 1
                os.closerange(keep, 65536)
                # Python ignores SIGPIPE and a calling thread may block signals; both would be
                # inherited across exec (pasta refuses to start with them).
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.execv(argv[0], argv)  # noqa: S606 - argv list, no shell wanted
            finally:
                os._exit(127)
        os.waitpid(pid, 0)
    finally:
        os.close(logfd)


def _read_guard(st: EgressState) -> dict[str, Any] | None:
    try:
        data = json.loads(st.guard_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _guard_alive(info: dict[str, Any], name: str) -> bool:
    """The recorded guard pid is alive and really is this container's guard."""
    pid = info.get("guard_pid")
    if not isinstance(pid, int):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    is_guard = GUARD_MODULE.encode() in cmdline or GUARD_COMMAND.encode() in cmdline
    return is_guard and name.encode() in cmdline


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


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
    old = _read_guard(st)
    if old is not None and _guard_alive(old, name):
        _stop_guard(old)
    with contextlib.suppress(FileNotFoundError):
        st.guard_file.unlink()
    ctl = _launched.pop(name)
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
        info = _read_guard(st)
        if info is None:
            continue
        state = info.get("state")
        if state == "filtered" and info.get("helper") == "pasta" and not pasta_started:
            # Rootless pasta must run as the plain user, outside the user namespace; the
            # guard has loaded the filter already and adopts pasta by its pid file.
            pasta_started = True
            _spawn_detached(
                netns.external_pasta_argv(pid, st.pasta_pidfile, int(info["guard_pid"])),
                st.helper_log,
            )
        if state == "ready" and info.get("container_pid") == pid:
            return
        if state in ("failed", "stopped"):
            raise EngineError(
                f"egress filter for {name} could not be set up: {info.get('error', state)}",
                "the container was not started; see `linpodx doctor` "
                f"and the guard log {st.guard_log.name} in the container's state dir",
                stderr=_log_tail(st.guard_log),
            )
    info = _read_guard(st)
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


def status(name: str) -> str:
    """`none` (no egress for this container), `healthy` (guard up, container running) or
    `down` (egress configured but no working guard: the container has no network)."""
    st = EgressState(name)
    if not st.policy_file.exists():
        return "none"
    info = _read_guard(st)
    if info is None or info.get("state") != "ready" or not _guard_alive(info, name):
        return "down"
    cpid = info.get("container_pid")
    if not isinstance(cpid, int) or not Path(f"/proc/{cpid}").exists():
        return "down"
    return "healthy"


def detach(name: str) -> None:
    """Stop the guard of `name` if one runs (or waits for its pid) and forget its files."""
    _forget_launch(name)
    st = EgressState(name)
    info = _read_guard(st)
    if info is not None and _guard_alive(info, name):
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
        st = EgressState(d.name)
        try:
            doc = json.loads(st.policy_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("profile") == profile:
            out.append(d.name)
    return out


def update_profile(stored: StoredProfile) -> list[str]:
    """Push a re-applied profile's allowlist to its running containers; returns names updated.

    Each update is recorded in the admin audit chain (`egress.update`) BEFORE the guard sees
    it; if the record cannot be written nothing changes (AuditError). The guard acknowledges
    by reporting the new revision; a guard that does not within UPDATE_TIMEOUT is an error.
    """
    updated: list[str] = []
    failed: list[str] = []
    doc = _policy_doc(stored)
    for name in _containers_of(stored.name):
        st = EgressState(name)
        info = _read_guard(st)
        running = info is not None and info.get("state") == "ready" and _guard_alive(info, name)
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
                    "allowlist": doc["allowlist"],
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
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(info["guard_pid"]), signal.SIGHUP)
        deadline = time.monotonic() + UPDATE_TIMEOUT
        while time.monotonic() < deadline:
            now = _read_guard(st)
            if now is not None and now.get("policy_revision") == int(stored.revision):
                updated.append(name)
                break
            time.sleep(0.05)
        else:
            failed.append(name)
    if failed:
        raise EngineError(
            f"egress guard did not take the new allowlist: {', '.join(failed)}",
            "restart those containers with `linpodx stop` and `linpodx start`",
        )
    return updated
