"""The connection checker: egress bound to names and ports, checked against what each
connection carries (see docs/egress.md, "Connections: names, not addresses").

The container's nft `nat` chain redirects every new TCP connection to an allowed address to
the checker's socket inside the container's netns (`ruleset.CHECKER_PORT`). For each one the
checker, in the guard process (out of the agent's reach):
1. takes the original destination (SO_ORIGINAL_DST);
2. bounds: at most `max_connections` open at once, `max_new_per_second` new per second;
3. reads the first bytes within FIRST_BYTES_TIMEOUT and finds the name the connection is for:
   the TLS ClientHello's server name, or (on `/http` ports) the request's Host; a `/tcp`
   entry whose name the address was resolved for needs no bytes (address-bound, weaker);
4. allows it only if that name is allowlisted for that port and kind, and the destination is
   an address the policy resolver returned *for that name* in this container (its lease,
   renewed by each lookup, kept while a connection to it is open);
5. connects onward from a socket made inside the netns and marked `ruleset.GUARD_MARK` (the
   filter lets only those out), and relays both ways (os.splice through a pipe, in the
   kernel); plain HTTP keeps being read by h11, so every request's Host is checked.
A refusal resets the connection and is recorded (`egress.denied`, events and audit).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import logging
import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from linpodx.egress import inspect
from linpodx.egress.policy import Allowlist, IPAddress, normalize_name
from linpodx.egress.ruleset import CHECKER_PORT, GUARD_MARK

log = logging.getLogger(__name__)

SO_ORIGINAL_DST = 80
SO_MARK = getattr(socket, "SO_MARK", 36)
F_SETPIPE_SZ = 1031
PIPE_SIZE = 1 << 20
FIRST_BYTES_TIMEOUT = 3.0
"""Seconds a new connection has to deliver its ClientHello (or first request head)."""
CONNECT_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_MAX_NEW_PER_SECOND = 100
THREAD_STACK = 256 * 1024
"""Each open connection holds two threads; their stacks need little (the default is 8 MiB
of address space each)."""

FILES_PER_CONNECTION = 6
"""Descriptors the guard holds for one relayed connection: both legs, a splice pipe each way."""
FILES_KEPT = 256
"""Descriptors kept for the rest of the guard (the resolver's sockets, records, nft)."""


def connection_room() -> int:
    """How many connections the guard's file limit lets the checker hold while the resolver
    and the records keep descriptors of their own: past it, accept(), the resolver's upstream
    sockets and the audit appends would fail instead (the bound is then this, said so)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(0, (soft - FILES_KEPT) // FILES_PER_CONNECTION)


Denied = Callable[[str, str, str], None]
"""(what was tried, e.g. `evil.test:443`, destination address, reason)"""


class Leases:
    """Which addresses the policy resolver returned for which name, until when; an address
    stays usable for its name while a connection to it through the checker is open."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[tuple[str, IPAddress], float] = {}
        self._open: dict[tuple[str, IPAddress], int] = {}

    def grant(self, name: str, addrs: list[tuple[IPAddress, float]]) -> None:
        n = normalize_name(name)
        with self._lock:
            now = self._clock()
            if len(self._until) > 200_000:  # bounded like the resolver's grants
                self._until = {k: v for k, v in self._until.items() if v > now}
            for addr, until in addrs:
                # A new lookup renews (never shortens) the lease.
                key = (n, addr)
                self._until[key] = max(until, self._until.get(key, 0.0))

    def holds(self, name: str, addr: IPAddress) -> bool:
        key = (name, addr)
        with self._lock:
            return self._until.get(key, 0.0) > self._clock() or self._open.get(key, 0) > 0

    def names(self, addr: IPAddress) -> list[str]:
        """Names `addr` is currently leased for (sorted)."""
        now = self._clock()
        with self._lock:
            return sorted(
                n
                for (n, a), t in self._until.items()
                if a == addr and (t > now or self._open.get((n, a), 0) > 0)
            )

    def opened(self, name: str, addr: IPAddress) -> None:
        with self._lock:
            self._open[(name, addr)] = self._open.get((name, addr), 0) + 1

    def closed(self, name: str, addr: IPAddress) -> None:
        with self._lock:
            left = self._open.get((name, addr), 0) - 1
            if left > 0:
                self._open[(name, addr)] = left
            else:
                self._open.pop((name, addr), None)


@dataclass(frozen=True)
class Bounds:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_new_per_second: int = DEFAULT_MAX_NEW_PER_SECOND


class _Rate:
    """A token bucket: `rate` per second, bursts up to `rate`."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate)
        self.tokens = float(rate)
        self.clock = clock
        self.last = clock()
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            now = self.clock()
            self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            return False


class _Pool:
    """Threads that joined the container's netns once and wait for work: starting a thread
    (and joining the netns) per connection cost ~0.2 ms of each connection's set-up here. A
    task never waits for a thread: when none is idle, a new one starts; idle ones beyond
    IDLE_MAX end."""

    IDLE_MAX = 16

    def __init__(self, netns_fd: int) -> None:
        self._netns_fd = netns_fd
        self._lock = threading.Lock()
        self._tasks: list[tuple[Callable[..., None], tuple[object, ...]]] = []
        self._ready = threading.Condition(self._lock)
        self._idle = 0

    def submit(self, fn: Callable[..., None], *args: object) -> None:
        task = (fn, args)
        with self._lock:
            self._tasks.append(task)
            if self._idle > 0:
                self._idle -= 1
                self._ready.notify()
                return
        try:
            threading.Thread(target=self._work, name="checker", daemon=True).start()
        except RuntimeError:
            # The caller fails (its connection ends, its sockets close): the task must not
            # stay queued for the next thread, which would run it on that connection's
            # sockets, closed or (in the moment before) being torn down under it.
            with self._lock, contextlib.suppress(ValueError):
                self._tasks.remove(task)
            raise

    def _work(self) -> None:
        from linpodx.egress.netns import CLONE_NEWNET, setns

        # Sockets this thread creates (the onward ones) belong to the container's netns.
        setns(self._netns_fd, CLONE_NEWNET)
        while True:
            with self._lock:
                while not self._tasks:
                    if self._idle >= self.IDLE_MAX:
                        return
                    self._idle += 1
                    if not self._ready.wait(60.0):
                        # Timed out: nobody counted this thread down.
                        self._idle -= 1
                        if not self._tasks:
                            return
                fn, args = self._tasks.pop(0)
            try:
                fn(*args)
            except Exception:
                log.exception("connection checker task failed")


class Refusal(Exception):
    """A connection the checker does not let through: (what was tried, why)."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(reason)
        self.target = target
        self.reason = reason


def original_destination(conn: socket.socket) -> tuple[IPAddress, int]:
    """Where the client meant to connect before the nat redirect (IPv4 only: the helpers
    give the container no IPv6 route, and the filter rejects IPv6)."""
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack("!2xH4s8x", raw)
    return ipaddress.IPv4Address(packed), port


def judge(
    allow: Allowlist, leases: Leases, addr: IPAddress, port: int, name: str, kind: str
) -> None:
    """Raise Refusal unless `name` may be reached on `port` as `kind` at `addr`."""
    target = f"{name}:{port}"
    kinds = allow.kinds(name, port)
    if kind not in kinds:
        if not allow.allows(name):
            what = "server name" if kind == "tls" else "host"
            why = f"{what} not in the allowlist"
        elif kinds:
            why = f"{name}:{port} is allowed as {'/'.join(sorted(kinds))}, not {kind}"
        else:
            why = f"port {port} is not allowed for {name}"
        raise Refusal(target, _with_owners(why, leases, addr))
    if not leases.holds(name, addr):
        raise Refusal(target, _with_owners(f"address not resolved for {name}", leases, addr))


def _with_owners(why: str, leases: Leases, addr: IPAddress) -> str:
    names = leases.names(addr)
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"{why}; address resolved for {shown}"
    return why


class Checker:
    """Accepts the redirected connections on `listener` (bound inside the container's netns)
    until `stop` is set; one thread per direction of each allowed connection."""

    def __init__(
        self,
        listener: socket.socket,
        netns_path: str,
        allowlist: Callable[[], Allowlist],
        leases: Leases,
        denied: Denied,
        bounds: Callable[[], Bounds] = Bounds,
    ) -> None:
        self._listener = listener
        self._netns_fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        self._allowlist = allowlist
        self._leases = leases
        self._denied = denied
        self._bounds = bounds
        self._open = 0
        self._lock = threading.Lock()
        self._rate = _Rate(bounds().max_new_per_second)
        self._pool = _Pool(self._netns_fd)
        self._waiting = 0
        """Acceptor threads in (or on their way to) accept()."""
        self._failed = threading.Event()
        self._room = connection_room()
        self.stats = {"accepted": 0, "refused": 0}

    ACCEPTORS_MIN = 4
    """Acceptors kept waiting: a new one starts when fewer wait, so connections that arrive
    one after another (the usual case) never wait for a thread to start."""
    ACCEPTORS_IDLE_MAX = 16

    @property
    def open_connections(self) -> int:
        return self._open

    def serve(self, stop: threading.Event) -> None:
        """Start the acceptors and wait for `stop`, then wake them to end. The connection
        that an acceptor takes is handled by that same thread: handing it to another thread
        cost a wake-up on every connection's set-up (~60 us here, far more on a busy host)."""
        threading.stack_size(THREAD_STACK)
        # Blocking accept(): the kernel wakes exactly one waiting thread per connection (with
        # a timeout, Python polls first, and every waiting thread would wake).
        self._listener.settimeout(None)
        with self._lock:
            self._waiting = self.ACCEPTORS_MIN
        for _ in range(self.ACCEPTORS_MIN):
            threading.Thread(target=self._accepting, args=(stop,), name="checker",
                             daemon=True).start()  # fmt: skip
        while not stop.wait(0.5):
            if self._failed.is_set():
                # An acceptor could not join the netns: end, and the guard ends with it
                # (fail closed) rather than leave connections unanswered behind a healthy one.
                break
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # accept() fails in every acceptor

    def _accepting(self, stop: threading.Event) -> None:
        from linpodx.egress.netns import CLONE_NEWNET, setns

        # The onward sockets this thread creates belong to the container's netns.
        try:
            setns(self._netns_fd, CLONE_NEWNET)
        except OSError:
            log.exception("a connection checker thread could not join the container's netns")
            self._failed.set()
            return
        while not stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if stop.is_set():
                    break
                time.sleep(0.01)  # EMFILE and the like: do not spin
                continue
            with self._lock:
                self._waiting -= 1
                more = self._waiting < self.ACCEPTORS_MIN // 2
                if more:
                    self._waiting += 1
            if more:
                try:
                    threading.Thread(target=self._accepting, args=(stop,), name="checker",
                                     daemon=True).start()  # fmt: skip
                except RuntimeError:
                    # No thread to be had (the guard at its process or memory limit): this
                    # one still handles the connection it took and waits again after, and is
                    # not counted twice; ending here left the connection unanswered and, two
                    # such later, no acceptor at all behind a guard that looked healthy.
                    log.warning("the connection checker could not start another acceptor")
                    with self._lock:
                        self._waiting -= 1
            try:
                self._one(conn)
            except Exception:
                log.exception("connection checker task failed")
            with self._lock:
                if self._waiting >= self.ACCEPTORS_IDLE_MAX:
                    return
                self._waiting += 1
        with self._lock:
            self._waiting -= 1

    # -- one connection --------------------------------------------------------------------
    def _one(self, conn: socket.socket) -> None:
        addr: IPAddress | None = None
        port = 0
        counted = False
        leased: tuple[str, IPAddress] | None = None
        try:
            addr, port = original_destination(conn)
            if addr.is_loopback and port == CHECKER_PORT:
                raise Refusal(f"{addr}:{port}", "the checker's own socket")
            bounds = self._bounds()
            with self._lock:
                if self._open >= bounds.max_connections:
                    raise Refusal(
                        f"{addr}:{port}", f"more than {bounds.max_connections} connections open"
                    )
                if self._open >= self._room:
                    raise Refusal(f"{addr}:{port}", f"more than {self._room} connections open "
                                  "(all the guard's file limit allows)")  # fmt: skip
                if self._rate.rate != bounds.max_new_per_second:
                    self._rate = _Rate(bounds.max_new_per_second)
                if not self._rate.take():
                    raise Refusal(
                        f"{addr}:{port}",
                        f"more than {bounds.max_new_per_second} new connections per second",
                    )
                self._open += 1
                counted = True
            allow = self._allowlist()
            name, kind, first, http = self._identify(conn, allow, addr, port)
            leased = (name, addr)
            self._leases.opened(name, addr)
            # Judged again after the bytes came (a policy reload may have happened).
            judge(self._allowlist(), self._leases, addr, port, name, kind)
            onward = self._connect(addr, port)
            self.stats["accepted"] += 1
            with onward:
                if kind == "tls":
                    first = self._retry_checked(conn, onward, first, name, port)
                self._relay(conn, onward, first, http, allow, addr, port)
        except Refusal as r:
            self.stats["refused"] += 1
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._denied(r.target, str(addr) if addr else "?", r.reason)
        except OSError as exc:
            log.debug("connection to %s:%s ended: %s", addr, port, exc)
        except Exception:
            log.exception("connection checker failed on a connection to %s:%s", addr, port)
        finally:
            if leased is not None:
                self._leases.closed(*leased)
            if counted:
                with self._lock:
                    self._open -= 1
            conn.close()

    def _identify(
        self, conn: socket.socket, allow: Allowlist, addr: IPAddress, port: int
    ) -> tuple[str, str, bytes, inspect.HttpRequests | None]:
        """(name, kind, bytes read so far, the HTTP reader for /http) or Refusal."""
        # A /tcp entry whose name this address was resolved for: nothing to read (a server
        # may speak first), the address and port are all that is checked.
        # (The leases are looked through only if some /tcp entry names this port.)
        if any(r.port == port and r.kind == "tcp" for r in allow.rules):
            for name in self._leases.names(addr):
                if "tcp" in allow.kinds(name, port):
                    return name, "tcp", b"", None
        if not any(r.port == port for r in allow.rules):
            raise Refusal(f"{addr}:{port}", _with_owners(f"port {port} is not in the allowlist",
                                                          self._leases, addr))
        deadline = time.monotonic() + FIRST_BYTES_TIMEOUT
        buf = b""
        http: inspect.HttpRequests | None = None
        while True:
            chunk = _recv_before(
                conn, deadline, f"{addr}:{port}",
                f"no complete ClientHello or request head in {FIRST_BYTES_TIMEOUT:g} s",
                "closed before saying which name it is for",
            )  # fmt: skip
            buf += chunk
            try:
                if buf[0] == inspect.TLS_HANDSHAKE:
                    hello = inspect.client_hello(buf)
                    if hello is None:
                        continue
                    judge(allow, self._leases, addr, port, hello.server_name, "tls")
                    return hello.server_name, "tls", buf, None
                if http is None:
                    http = inspect.HttpRequests()
                    hosts = http.feed(buf)
                else:
                    hosts = http.feed(chunk)
            except inspect.Refused as exc:
                raise Refusal(f"{addr}:{port}", str(exc)) from None
            if hosts:
                for host in hosts:
                    judge(allow, self._leases, addr, port, host, "http")
                return hosts[0], "http", buf, http
            if len(buf) > inspect.MAX_HEAD + inspect.MAX_RECORD:
                raise Refusal(f"{addr}:{port}", "first bytes too long")

    def _connect(self, addr: IPAddress, port: int) -> socket.socket:
        """A socket made inside the container's netns (pool threads joined it: a socket belongs
        to the netns it was created in), marked so the filter lets it out."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, SO_MARK, GUARD_MARK)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(CONNECT_TIMEOUT)
            s.connect((str(addr), port))
            s.settimeout(None)
        except BaseException:
            s.close()
            raise
        return s

    def _retry_checked(
        self, conn: socket.socket, onward: socket.socket, first: bytes, name: str, port: int
    ) -> bytes:
        """Pass the ClientHello on and the server's answer back; if that is a
        HelloRetryRequest, the client's second ClientHello (sent in the clear, and what a
        server routes by) must name the same server. Returns the client's bytes still to send.
        The client's bytes after its first ClientHello are held until the server answered,
        so a second ClientHello sent at once is checked too."""
        hello = inspect.client_hello(first)
        if hello is None:  # _identify returned only a complete one
            raise Refusal(f"{name}:{port}", "ClientHello is incomplete")
        onward.sendall(first[: hello.length])
        held = first[hello.length :]
        reply = b""
        onward.settimeout(CONNECT_TIMEOUT)
        try:
            while (retry := inspect.server_asks_retry(reply)) is None:
                chunk = onward.recv(65536)
                if not chunk:
                    break
                reply += chunk
        finally:
            onward.settimeout(None)
        conn.sendall(reply)
        if not retry:
            return held
        deadline = time.monotonic() + FIRST_BYTES_TIMEOUT
        try:
            late = f"no complete second ClientHello in {FIRST_BYTES_TIMEOUT:g} s"
            while (again := inspect.retried_hello(held)) is None:
                if len(held) > inspect.MAX_RECORD + 64:
                    raise Refusal(f"{name}:{port}", late)
                held += _recv_before(
                    conn, deadline, f"{name}:{port}", late, "closed before its second ClientHello"
                )
        except inspect.Refused as exc:
            _reset(onward)
            raise Refusal(f"{name}:{port}", str(exc)) from None
        except Refusal:
            _reset(onward)
            raise
        if again.server_name != name:
            _reset(onward)
            raise Refusal(f"{again.server_name}:{port}", "second ClientHello (after a "
                          f"HelloRetryRequest) names another server than {name}")
        return held

    def _relay(
        self,
        conn: socket.socket,
        onward: socket.socket,
        first: bytes,
        http: inspect.HttpRequests | None,
        allow: Allowlist,
        addr: IPAddress,
        port: int,
    ) -> None:
        conn.settimeout(None)
        with contextlib.suppress(OSError):
            # Both legs without Nagle (the onward one has it off from its start): a relay's
            # small writes (a TLS handshake message, a short answer) go on at once.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        held = b""
        if http is not None and http.unjudged:
            # A next request's head begun in the first bytes: it goes on once judged.
            first, held = first[: len(first) - http.unjudged], first[len(first) - http.unjudged :]
        if first:
            onward.sendall(first)
        if http is not None and http.upgraded:
            # A protocol switch (WebSocket) as the first request: nothing more from the client
            # until the server answered; 101 -> raw both ways, anything else -> closed.
            if not _switched(onward, conn):
                return
            http = None
        if http is None:
            # TLS and TCP: the client speaks next (its handshake after the server's hello),
            # so this thread, already running, carries the client's bytes.
            self._both_ways(lambda: _pump(onward, conn), lambda: _pump(conn, onward))
            return
        # HTTP: the server's answer comes next, so this thread carries it back, and the
        # client's next request goes to a pool thread: waking one for the answer put a
        # thread's wake-up on every request's path.
        self._both_ways(
            lambda: self._pump_http(conn, onward, http, addr, port, held),
            lambda: _pump(onward, conn),
        )

    def _both_ways(self, elsewhere: Callable[[], None], here: Callable[[], None]) -> None:
        """Run `elsewhere` in a pool thread and `here` in this one, and return when both
        ended; a Refusal (or other error) `elsewhere` raised is raised here, for `_one` to
        record."""
        done = threading.Event()
        failed: list[BaseException] = []

        def other() -> None:
            try:
                elsewhere()
            except BaseException as exc:  # handed to the connection's thread, raised there
                failed.append(exc)
            finally:
                done.set()

        self._pool.submit(other)
        try:
            here()
        finally:
            done.wait()
        if failed:
            raise failed[0]

    def _pump_http(
        self,
        conn: socket.socket,
        onward: socket.socket,
        http: inspect.HttpRequests,
        addr: IPAddress,
        port: int,
        held: bytes = b"",
    ) -> None:
        """Client to server on an /http connection: every request's Host is judged before its
        bytes go on, none of a head's bytes go on before it is complete (`held`: those of
        one begun); a refused one ends the connection (both ways)."""
        while True:
            data = conn.recv(262144)
            if not data:
                # What is held is a head the client never ended: it goes nowhere.
                with contextlib.suppress(OSError):
                    onward.shutdown(socket.SHUT_WR)
                return
            try:
                hosts = http.feed(data)
                for host in hosts:
                    judge(self._allowlist(), self._leases, addr, port, host, "http")
            except inspect.Refused as exc:
                _reset(onward)
                raise Refusal(f"{addr}:{port}", str(exc)) from None
            except Refusal:
                _reset(onward)
                raise
            data = held + data
            keep = http.unjudged
            data, held = data[: len(data) - keep], data[len(data) - keep :]
            if data:
                onward.sendall(data)


def _switched(onward: socket.socket, conn: socket.socket) -> bool:
    """Pass the server's answer to a protocol switch request on; True if it was 101."""
    head = b""
    onward.settimeout(CONNECT_TIMEOUT)
    while b"\r\n\r\n" not in head and len(head) < inspect.MAX_HEAD:
        chunk = onward.recv(65536)
        if not chunk:
            break
        head += chunk
    onward.settimeout(None)
    conn.sendall(head)
    return head.startswith((b"HTTP/1.1 101 ", b"HTTP/1.1 101\r"))


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes from `src` to `dst` until EOF, in the kernel (splice through a pipe); then
    pass the EOF on (half-close), or a reset as a reset."""
    r, w = os.pipe2(os.O_CLOEXEC)
    reset = False
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_SIZE)
        sfd, dfd = src.fileno(), dst.fileno()
        while True:
            n = os.splice(sfd, w, PIPE_SIZE, flags=os.SPLICE_F_MOVE)
            if n == 0:
                break
            while n:
                n -= os.splice(r, dfd, n, flags=os.SPLICE_F_MOVE)
    except OSError:
        reset = True  # ECONNRESET, EPIPE, …: the other side must fail the same way
    finally:
        os.close(r)
        os.close(w)
    if reset:
        _reset(dst)
    else:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _recv_before(
    conn: socket.socket, deadline: float, target: str, late: str, closed: str
) -> bytes:
    """The next bytes `conn` sends before `deadline` (monotonic); Refusal(target, late) once it
    has passed, Refusal(target, closed) if the peer closes first."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refusal(target, late)
        conn.settimeout(left)
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            raise Refusal(target, closed)
        return chunk


def _reset(sock: socket.socket) -> None:
    """Make `sock`'s close a TCP reset (SO_LINGER 0), so the peer fails at once and clearly,
    and wake whoever reads it (SHUT_RD sends nothing). Not closed here: another thread may
    still be using its file descriptor, which must not be reused under it; its owner closes
    it (and that close sends the reset)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
