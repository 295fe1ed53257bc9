"""The egress guard process (started as `python -m linpodx.egress.guardproc --container NAME
--control-fd 3`, which imports this module at a lower CPU priority and runs `main`).

Launched before the container exists, it waits on its control socket for the container's
init pid (ending by itself if the socket closes or no pid comes in time), then lives exactly
as long as that process: it watches it through a pidfd and, when it ends, stops the network
helper and exits. No daemon, nothing shared between containers. Its state file (`guard.json`)
says `filtered`, `ready`, `failed` or `stopped`; each change is also signalled as one line on
the control socket so the CLI wakes at once.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import ipaddress
import json
import logging
import os
import resource
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linpodx.egress import netns, nfsets, ruleset
from linpodx.egress.budget import DEFAULT_BUDGET, MAX_BUDGET
from linpodx.egress.checker import Bounds, Checker, Leases
from linpodx.egress.denials import DenialRecorder, default_sink
from linpodx.egress.policy import Allowlist, upstreams
from linpodx.egress.resolver import PolicyResolver, ResolverPolicy, serve_tcp, serve_udp
from linpodx.egress.state import EgressState
from linpodx.errors import LinpodxError
from linpodx.fsutil import atomic_write, read_regular_stat

log = logging.getLogger("linpodx.egress.guard")


class Reporter:
    """Writes guard.json and, until the start-up ends, tells the CLI on the control socket."""

    def __init__(self, st: EgressState, control: socket.socket | None) -> None:
        self.st = st
        self.control = control

    def write(self, **data: Any) -> None:
        data.setdefault("guard_pid", os.getpid())
        data.setdefault("ts", time.time())
        text = json.dumps(data, sort_keys=True).encode()
        # Replaced all at once, but not fsynced: it describes this guard process, which a crash
        # ends too, and "ready" is what the container's start waits for.
        if data.get("state") != "stopped":
            atomic_write(self.st.guard_file, text, durable=False)
        else:
            # The last word, when the container is gone: a `--rm` container's state dir may
            # have been removed by its cleanup hook meanwhile (pasta takes longer to stop than
            # slirp4netns), and it must not come back holding only this file.
            with contextlib.suppress(FileNotFoundError):
                atomic_write(self.st.guard_file, text, durable=False, make_dir=False)
        if self.control is not None:
            with contextlib.suppress(OSError):  # the CLI gave up: guard.json still says it
                self.control.sendall(f"{data.get('state')}\n".encode())
            if data.get("state") != "filtered":
                self.control.close()
                self.control = None


def await_order(control: socket.socket, timeout: float) -> tuple[int, str | None] | None:
    """The container pid (and helper choice) the CLI sends; None if it closed or never sent."""
    control.settimeout(timeout)
    buf = b""
    try:
        while not buf.endswith(b"\n") and len(buf) < 4096:
            chunk = control.recv(4096)
            if not chunk:
                return None
            buf += chunk
    except TimeoutError:
        return None
    order = json.loads(buf)
    pid = order.get("pid") if isinstance(order, dict) else None
    helper = order.get("helper") if isinstance(order, dict) else None
    if not isinstance(pid, int) or pid <= 0 or not (helper is None or isinstance(helper, str)):
        raise ValueError(f"bad order from the CLI: {buf[:200]!r}")
    return pid, helper


PolicyVersion = tuple[int, int]
"""Which policy file was read: its inode and mtime (the CLI replaces it by rename, so a new
file is a new inode even within one clock tick)."""

MAX_POLICY_BYTES = 4 << 20
"""A policy file is its allowlist in JSON: far below this unless it is not one we wrote."""


def policy_version(st: EgressState) -> PolicyVersion | None:
    try:
        got = st.policy_file.stat()
    except OSError:
        return None
    return got.st_ino, got.st_mtime_ns


def load_policy(
    st: EgressState, host_addrs: frozenset[Any] | None = None
) -> tuple[ResolverPolicy, dict[str, Any], PolicyVersion]:
    """Read the policy file the CLI wrote (fail closed on anything odd), and which file it was:
    a version taken from the very file read, so a file replaced any time after it differs."""
    # Not open(): a FIFO in its place would hang the guard, a link is not a file we wrote.
    read = read_regular_stat(st.policy_file, MAX_POLICY_BYTES)
    if read is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(st.policy_file))
    data, got = read
    if len(data) > MAX_POLICY_BYTES:
        raise ValueError(f"{st.policy_file} is larger than {MAX_POLICY_BYTES} bytes")
    raw = json.loads(data.decode("utf-8"))
    allow = Allowlist.from_entries(raw["allowlist"])
    try:
        host_conf = Path("/etc/resolv.conf").read_text(encoding="utf-8")
    except OSError:
        host_conf = ""
    ups = tuple(upstreams(raw.get("upstream_dns", []), host_conf))
    host = host_addrs if host_addrs is not None else current_host_addresses()
    return (
        ResolverPolicy(
            allow,
            ups,
            bool(raw.get("allow_private_answers", False)),
            host,
            wildcard_budget(raw),
        ),
        raw,
        (got.st_ino, got.st_mtime_ns),
    )


def wildcard_budget(raw: dict[str, Any]) -> int:
    """The policy file's wildcard budget; the default for a file written before linpodx had
    one (it had no bound at all then, so the default is only stricter). ValueError for
    anything the profile loader would not have let through (the policy is then not loaded)."""
    value = raw.get("wildcard_budget", DEFAULT_BUDGET)
    if type(value) is not int or not 1 <= value <= MAX_BUDGET:
        raise ValueError(f"bad wildcard_budget in the policy file: {value!r}")
    return value


def current_host_addresses() -> frozenset[Any]:
    """This host's addresses, parsed (answers naming them are refused)."""
    return frozenset(ipaddress.ip_address(a) for a in netns.host_addresses())


class _Background:
    """Run `fn(*args)` in a thread now; `wait` joins it and raises what it raised."""

    def __init__(self, fn: Callable[..., object], *args: object) -> None:
        self._error: BaseException | None = None

        def work() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # handed to wait()
                self._error = exc

        self._thread = threading.Thread(target=work, name="nft-load", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error


DNS_WARM_UP_DELAY = 0.5
"""Seconds after `ready` before the guard imports dnspython unasked (see run_guard)."""


def _import_quietly(module: str) -> None:
    """Import `module` in this thread at nice 19 (Linux: niceness is per thread)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    importlib.import_module(module)


def run_guard(name: str, control: socket.socket, wait: float) -> int:
    """Wait for container `name`'s pid on `control`, set up the filter, resolver and helper;
    serve until the container ends."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    st = EgressState(name)
    _more_files()
    # Before the pid comes (podman is still creating the container): nothing here needs it.
    host = current_host_addresses()
    netns.preload_nftables()
    try:
        order = await_order(control, wait)
    except (OSError, ValueError) as exc:
        log.error("egress guard for %s got no usable order: %s", name, exc)
        order = None
    if order is None:
        log.info("egress guard for %s: no container pid came; nothing to do", name)
        return 0
    pid, preferred = order
    report = Reporter(st, control)
    wake = _Wake()
    # A re-apply's SIGHUP may come as soon as `ready` is written, before the serve loop: the
    # default action would end the guard (and with it the container's network). Caught from
    # the start, it only asks for a reload, which the serve loop does. SIGTERM keeps its
    # default until then: a start-up that is told to stop just stops.
    signal.signal(signal.SIGHUP, wake.on_hup)
    stop = threading.Event()
    recorder = DenialRecorder(name, default_sink)
    helpers: list[netns.Helper] = []
    try:
        guard = _start(name, st, pid, preferred, host, report, recorder, stop, helpers)
    except Exception as exc:
        if isinstance(exc, LinpodxError):
            # An expected refusal (no helper, nft refused, …): its message says it all, and
            # the CLI shows this log's tail to the person, who must not get a traceback.
            log.error("egress guard failed to start: %s", exc)
        else:
            log.exception("egress guard failed to start")  # a bug: keep where it happened
        stop.set()
        for helper in helpers[-1:]:
            helper.stop()
        report.write(state="failed", container=name, container_pid=pid, error=str(exc))
        return 1

    signal.signal(signal.SIGTERM, wake.on_term)
    signal.signal(signal.SIGINT, wake.on_term)
    _serve(guard, wake)
    stop.set()
    guard.helper.stop()
    recorder.flush()
    report.write(state="stopped", container=name, container_pid=pid)
    return 0


def _more_files() -> None:
    """The soft file limit up to the hard one (no privilege needed): the checker holds six
    descriptors per connection, and a guard started from a login's shell (soft 1024) ran out
    at ~170 held connections, far below `max_connections` (the next one was closed without
    a record, descriptors being what accept(), the resolver and the records need too). What
    the limit still cannot hold, the checker refuses (`checker.connection_room`)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.warning("could not raise the guard's file limit from %s to %s: %s",
                        soft, hard, exc)  # fmt: skip


class _Wake:
    """SIGHUP (reload the policy) and SIGTERM/SIGINT (stop), as flags and a byte on a pipe
    that wakes the serve loop."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.w, False)
        self.reload = threading.Event()
        self.term = threading.Event()

    def on_hup(self, _s: int, _f: object) -> None:
        self.reload.set()
        os.write(self.w, b"h")

    def on_term(self, _s: int, _f: object) -> None:
        self.term.set()
        os.write(self.w, b"t")


@dataclass
class _Guard:
    """A guard that is up: what the serve loop watches and what a new policy goes to."""

    name: str
    st: EgressState
    pid: int
    pidfd: int
    helper: netns.Helper
    resolver: PolicyResolver
    checking: threading.Thread
    """The connection checker's thread (no checker, no connection)."""
    bounds: list[Bounds]
    """The checker's bounds, [0] replaced when a new policy loads (the checker reads it)."""
    recorder: DenialRecorder
    report: Reporter
    version: PolicyVersion
    """The version of the policy file last read (or tried)."""


def _start(
    name: str,
    st: EgressState,
    pid: int,
    preferred: str | None,
    host: frozenset[Any],
    report: Reporter,
    recorder: DenialRecorder,
    stop: threading.Event,
    helpers: list[netns.Helper],
) -> _Guard:
    """Load the filter, bind the resolver and checker, start the network helper (appended to
    `helpers`, for the caller to stop should a later step fail) and report `ready`."""
    log.info("egress guard starting: container=%s pid=%s", name, pid)
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise RuntimeError(f"the container's process {pid} is gone") from None
    if os.stat(netns.netns_path(pid)).st_ino == os.stat(netns.netns_path(os.getpid())).st_ino:
        # A wrong pid must never make the guard filter (and bind port 53 in) its own netns.
        raise RuntimeError(f"process {pid} is not in a network namespace of its own")
    policy, raw, version = load_policy(st, host)
    if not policy.upstreams:
        raise RuntimeError("no upstream DNS resolver (host has none; set network.upstream_dns)")

    kind = netns.choose_helper(preferred)
    limits = _helper_limits(raw)
    external_pasta = kind == "pasta" and netns.in_user_namespace()
    log.info("loading the nft filter into the netns of pid %s", pid)
    # The filter, the resolver and the helper are independent, so the filter loads while the
    # rest is set up. Nothing in the netns can send a packet before the filter is in: no
    # process of the container runs until this guard reports `ready` (the one-call hook, or
    # `attach` before `podman start`), which it does only after the filter loaded.
    filtering = _Background(netns.load_ruleset, pid, ruleset.build_ruleset())
    log.info("binding the policy resolver")
    udp, tcp = netns.bind_resolver_sockets(pid)
    # Before `ready`: a connection redirected to a port nobody holds gets a reset, so
    # nothing ever leaves unchecked, but the agent's first connection must find it open.
    listener = netns.bind_checker_socket(pid, ruleset.CHECKER_PORT)
    if external_pasta:
        filtering.wait()  # pasta is started by the CLI once this says "filtered"
    else:
        log.info("starting %s", kind)
        helpers.append(
            netns.start_helper(
                kind, pid, st.helper_log, limits, pasta_files=(st.pasta_pidfile, st.pasta_netns)
            )
        )
        filtering.wait()
    sets = nfsets.NftSets(netns.netns_path(pid))
    leases = Leases()
    resolver = PolicyResolver(
        policy,
        add_to_sets=sets.add,
        revoke_in_sets=sets.revoke,
        on_denied=recorder.deny,
        on_new_name=recorder.new_name,
        on_lease=leases.grant,
    )
    bounds = [_bounds(raw)]
    checker = Checker(
        listener,
        netns.netns_path(pid),
        lambda: resolver.policy.allowlist,
        leases,
        recorder.deny_connection,
        lambda: bounds[0],
    )
    for target, sock in ((serve_udp, udp), (serve_tcp, tcp)):
        threading.Thread(target=target, args=(sock, resolver, stop), daemon=True).start()
    checking = threading.Thread(
        target=checker.serve, args=(stop,), name="connection-checker", daemon=True
    )
    checking.start()
    if external_pasta:
        # The CLI starts it from outside the user namespace when it sees this state.
        with contextlib.suppress(FileNotFoundError):
            st.pasta_pidfile.unlink()
        report.write(
            state="filtered", container=name, container_pid=pid, helper=kind,
            helper_max_files=limits.files, helper_max_memory_mib=limits.memory_mib,
        )  # fmt: skip
        helpers.append(netns.wait_external_pasta(pid, st.pasta_pidfile))
    if not helpers:  # pragma: no cover - both branches above start one or raise
        raise RuntimeError("no network helper was started")
    helper = helpers[-1]
    # Its own limits, before `ready` (no connection can reach it before then); one that
    # cannot be applied fails the start like any other step.
    netns.limit_helper(netns.helper_process(helper, st.pasta_pidfile), limits)
    applied = int(raw.get("revision", 0))
    report.write(
        state="ready",
        container=name,
        container_pid=pid,
        helper=kind,
        helper_pid=helper.pid,
        policy_revision=applied,
        policy_mtime=version[1],
    )
    log.info("egress guard ready: container=%s pid=%s helper=%s", name, pid, kind)
    # dnspython (every DNS message goes through it, ~0.1 s to import) is imported by the
    # first query, or else shortly after the container's start, at the lowest CPU priority:
    # right at `ready`, even at nice 19, it slowed the rest of podman's start by ~20 ms.
    warm_up = threading.Timer(DNS_WARM_UP_DELAY, _import_quietly, args=("linpodx.egress.dnsmsg",))
    warm_up.daemon = True
    warm_up.start()
    return _Guard(
        name, st, pid, pidfd, helper, resolver, checking, bounds, recorder, report, version
    )


def _serve(g: _Guard, wake: _Wake) -> None:
    """Until the container's init process ends, a stop is asked for, or a part the container's
    network needs has stopped; a new policy file (or a SIGHUP) is loaded on the way."""
    while True:
        r, _, _ = select.select([g.pidfd, wake.r], [], [], 1.0)
        if g.pidfd in r:
            log.info("container init process %s ended; stopping", g.pid)
            return
        if wake.r in r:
            os.read(wake.r, 64)
        g.recorder.tick()  # summaries of a minute that ended go out now, not at the next lookup
        if wake.term.is_set():
            log.info("asked to stop")
            return
        if not g.checking.is_alive():
            # No checker, no connection: the redirect meets a closed port (reset). Stopping
            # the guard takes the helper with it, and `linpodx ps` shows it down.
            log.error("the connection checker stopped; stopping the guard")
            return
        if not g.helper.alive():
            # Without the helper the container has no network at all: fail closed, and
            # `linpodx ps` shows the guard as down.
            log.error("%s exited; stopping the guard", g.helper.kind)
            return
        # The version of the file read, not of the file there now: a re-apply that replaced
        # it while the guard was starting (after it read the policy) is loaded here.
        now = policy_version(g.st)
        if wake.reload.is_set() or (now is not None and now != g.version):
            wake.reload.clear()
            _reload(g, now)


def _reload(g: _Guard, now: PolicyVersion | None) -> None:
    """Load the policy file there now and report its revision."""
    try:
        new_policy, raw, g.version = load_policy(g.st)
        gone = g.resolver.set_policy(new_policy)
        g.bounds[0] = _bounds(raw)
        log.info(
            "policy revision %s loaded; %d addresses revoked",
            raw.get("revision"),
            len(gone),
        )
        g.report.write(
            state="ready",
            container=g.name,
            container_pid=g.pid,
            helper=g.helper.kind,
            helper_pid=g.helper.pid,
            policy_revision=int(raw.get("revision", 0)),
            policy_mtime=g.version[1],
        )
    except Exception:
        # Keep the previous (already enforced) policy rather than none: the CLI
        # that asked for the update sees the revision did not change and says so.
        # This file is not tried again each second; a new one (or a SIGHUP) is.
        log.exception("could not load the new policy")
        if now is not None:
            g.version = now


def _bounds(raw: dict[str, Any]) -> Bounds:
    """The connection bounds a policy file gives (defaults where it gives none)."""
    conns = raw.get("max_connections")
    rate = raw.get("max_new_connections_per_second")
    return Bounds(
        conns if type(conns) is int and conns > 0 else Bounds.max_connections,
        rate if type(rate) is int and rate > 0 else Bounds.max_new_per_second,
    )


def _helper_limits(raw: dict[str, Any]) -> netns.HelperLimits:
    """The network helper's limits a policy file gives (defaults where it gives none, as in
    files written before they existed). Fixed for the helper's life: a re-apply that changes
    them takes effect at the container's next start (raising a hard limit needs a privilege
    a rootless guard does not have)."""
    files = raw.get("helper_max_files")
    mib = raw.get("helper_max_memory_mib")
    return netns.HelperLimits(
        files if type(files) is int and files > 0 else netns.HELPER_MAX_FILES_DEFAULT,
        mib if type(mib) is int and mib > 0 else netns.HELPER_MAX_MEMORY_MIB_DEFAULT,
    )


def main(argv: list[str] | None = None) -> int:
    """`--container NAME --control-fd FD [--wait SECONDS]` (see `linpodx.egress.guardproc`).

    How `launch` starts the guard: the same as the hidden `linpodx _egress-guard` command, but
    without importing the CLI stack (typer, rich), which halves the guard's start-up time.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="linpodx-egress-guard")
    parser.add_argument("--container", required=True)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--wait", type=float, default=300.0)
    args = parser.parse_args(argv)
    return run_guard(args.container, socket.socket(fileno=args.control_fd), args.wait)


if __name__ == "__main__":
    raise SystemExit(main())
