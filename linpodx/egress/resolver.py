"""The policy resolver: the container's only DNS server.

Every query is parsed, judged and re-built: nothing the container sends is forwarded as raw
bytes. Plain queries for allowed names (what stub resolvers send) go through the strict codec
in `wire`; everything else is judged by `fallback`, through dnspython (a maintained library
for the odd cases), which answers errors and denials itself. Allowed names are asked upstream
with a fresh query; the addresses in the answer are pushed into the nft sets BEFORE the answer
is sent, so a client never holds an address it cannot reach, and an answer is never sent if
that fails.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from linpodx.egress import wire
from linpodx.egress.policy import Allowlist, IPAddress, answer_refusal, clamp_ttl
from linpodx.egress.wire import Question, Record

log = logging.getLogger(__name__)

# Only what a client needs to connect: A and AAAA questions, answered with their CNAME chain.
# HTTPS/SVCB, MX, TXT, SRV, PTR, ANY, NULL … are refused (by `fallback`): each can carry
# arbitrary bytes back into the container or name more endpoints.
ADDRESS_TYPES = frozenset({wire.TYPE_A, wire.TYPE_AAAA})
MAX_CNAME_CHAIN = 8
UPSTREAM_TIMEOUT = 3.0
CACHE_MAX = 4096

SetUpdater = Callable[[list[tuple[IPAddress, int]]], None]
SetDeleter = Callable[[list[IPAddress]], None]
DeniedHook = Callable[[str, str, str], None]
"""(name, record type, reason)"""
Upstream = Callable[[bytes, Sequence[tuple[str, int]]], bytes]
"""(query bytes, upstreams) -> the matching answer's bytes; UpstreamError if none came."""


@dataclass(frozen=True)
class ResolverPolicy:
    """What the resolver enforces; swapped as a whole on a live update."""

    allowlist: Allowlist
    upstreams: tuple[tuple[str, int], ...]
    allow_private: bool
    host_addrs: frozenset[IPAddress] = frozenset()


@dataclass
class _CacheEntry:
    records: list[Record]
    expires: float
    names: frozenset[str]


@dataclass
class _Granted:
    """An address in the sets: until when and for which looked-up names."""

    expires: float
    names: set[str] = field(default_factory=set)


class UpstreamError(Exception):
    """No upstream answered usably."""


_POOL_MAX = 8
_pool: dict[tuple[str, int], list[socket.socket]] = {}
_pool_lock = threading.Lock()


def _udp_exchange(query: bytes, ip: str, port: int) -> bytes:
    """One UDP round trip on a connected socket (the kernel drops datagrams from anyone else);
    the answer must match our random id and question, or we keep waiting until the timeout.

    Connected sockets are kept in a small pool per upstream and reused one query at a time:
    opening a fresh socket per query cost several ms here (dns.query.udp ~10 ms per call).
    Each pooled socket keeps its own random source port; a socket that timed out or failed
    is closed, never reused, and a late answer to an old query on a reused one is skipped
    because it does not match the current id and question.
    """
    key = (ip, port)
    with _pool_lock:
        free = _pool.setdefault(key, [])
        sock = free.pop() if free else None
    if sock is None:
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect((ip, port))
    ok = False
    try:
        sock.send(query)
        deadline = time.monotonic() + UPSTREAM_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("upstream did not answer in time")
            sock.settimeout(left)
            data = sock.recv(65535)
            if wire.matches(query, data):
                ok = True
                return data
    finally:
        with _pool_lock:
            free = _pool.setdefault(key, [])
            if ok and len(free) < _POOL_MAX:
                free.append(sock)
            else:
                sock.close()


def _tcp_exchange(query: bytes, ip: str, port: int) -> bytes:
    """The same question over TCP (after a truncated UDP answer)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(UPSTREAM_TIMEOUT)
        sock.connect((ip, port))
        sock.sendall(len(query).to_bytes(2, "big") + query)
        head = _recv_exact(sock, 2)
        data = _recv_exact(sock, int.from_bytes(head, "big")) if head else None
    if data is None or not wire.matches(query, data):
        raise OSError("no matching answer over TCP")
    return data


def query_upstream(query: bytes, upstreams: Sequence[tuple[str, int]]) -> bytes:
    """Ask each upstream in turn (UDP, TCP when truncated); the first answer wins."""
    last: Exception | None = None
    for ip, port in upstreams:
        try:
            resp = _udp_exchange(query, ip, port)
            if int.from_bytes(resp[2:4], "big") & wire.FLAG_TC:
                resp = _tcp_exchange(query, ip, port)
            return resp
        except OSError as exc:
            last = exc
    raise UpstreamError(str(last) if last else "no upstream resolver configured")


class PolicyResolver:
    """Decides and answers one DNS query at a time (thread-safe)."""

    def __init__(
        self,
        policy: ResolverPolicy,
        *,
        add_to_sets: SetUpdater,
        delete_from_sets: SetDeleter,
        on_denied: DeniedHook,
        upstream: Upstream = query_upstream,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._add = add_to_sets
        self._delete = delete_from_sets
        self._denied = on_denied
        self._upstream = upstream
        self._clock = clock
        self._lock = threading.Lock()
        # Serializes set updates with policy swaps, so a lookup that raced an update cannot
        # re-add an address the update just removed for a name that is no longer allowed.
        self._set_lock = threading.Lock()
        self._cache: dict[tuple[str, int], _CacheEntry] = {}
        self._granted: dict[IPAddress, _Granted] = {}
        # Query bytes without the id -> (valid until, answer bytes without the id), filled
        # from cache hits only and emptied by every policy change.
        self._fast: dict[bytes, tuple[float, bytes]] = {}

    @property
    def policy(self) -> ResolverPolicy:
        return self._policy

    # -- live update ----------------------------------------------------------------------
    def set_policy(self, policy: ResolverPolicy) -> list[IPAddress]:
        """Swap the policy; drop set entries and cache lines only disallowed names justified.

        Returns the addresses removed from the sets.
        """
        with self._set_lock:
            with self._lock:
                self._policy = policy
                self._fast = {}
                self._cache = {
                    k: v
                    for k, v in self._cache.items()
                    if all(policy.allowlist.allows(n) for n in v.names)
                }
                gone: list[IPAddress] = []
                for addr, g in list(self._granted.items()):
                    g.names = {n for n in g.names if policy.allowlist.allows(n)}
                    if not g.names:
                        gone.append(addr)
                        del self._granted[addr]
            if gone:
                self._delete(gone)
            return gone

    # -- one query ------------------------------------------------------------------------
    def handle(self, data: bytes) -> bytes | None:
        """Answer one query in wire format; None when not even a header could be read."""
        if len(data) > 12:
            fast = self._fast.get(data[2:])
            if fast is not None and self._clock() <= fast[0]:
                return data[:2] + fast[1]
        q = wire.parse_query(data)
        if (
            q is None
            or q.qclass != wire.CLASS_IN
            or q.qtype not in ADDRESS_TYPES
            or not self._policy.allowlist.allows(q.name)
        ):
            return self._handle_other(data)
        # A plain query (header + one question, nothing else) can be answered from the bytes
        # cache next time: same flags, same question bytes -> same answer bytes but the id.
        return self._answer(q, data[2:] if not q.edns else None)

    def _handle_other(self, data: bytes) -> bytes | None:
        """Everything the strict codec did not take: judged through dnspython."""
        from linpodx.egress import fallback

        verdict = fallback.judge(data, self._policy.allowlist, self._denied)
        if isinstance(verdict, Question):
            return self._answer(verdict, None)
        return verdict

    def _answer(self, q: Question, wire_key: bytes | None = None) -> bytes:
        now = self._clock()
        key = (q.name, q.qtype)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit.expires > now:
                ttl = int(hit.expires - now)
                out = wire.build_answer(q, wire.RCODE_NOERROR, hit.records, max(1, ttl))
                if ttl >= 1 and wire_key is not None:
                    # Every TTL in these bytes is <= ttl, which stays <= the time the entry
                    # has left until `hit.expires - ttl`: until then the same bytes are exact.
                    if len(self._fast) >= CACHE_MAX:
                        self._fast.clear()
                    self._fast[wire_key] = (hit.expires - ttl, out[2:])
                return out
        policy = self._policy
        up = wire.build_query(int.from_bytes(os.urandom(2), "big"), q.name, q.qtype)
        try:
            rcode, answer = wire.parse_answer(self._upstream(up, policy.upstreams))
        except (UpstreamError, wire.WireError):
            return wire.build_answer(q, wire.RCODE_SERVFAIL)
        if rcode != wire.RCODE_NOERROR:
            # NXDOMAIN passes through as itself; anything else is a server failure to us.
            return wire.build_answer(
                q, rcode if rcode == wire.RCODE_NXDOMAIN else wire.RCODE_SERVFAIL
            )
        records, addrs, min_ttl, names = _follow_chain(answer, q.name, q.qtype)
        for addr in addrs:
            why = answer_refusal(
                addr, allow_private=policy.allow_private, host_addrs=policy.host_addrs
            )
            if why is not None:
                self._denied(q.name, wire.TYPE_NAMES[q.qtype], f"answer {addr}: {why}")
                return wire.build_answer(q, wire.RCODE_REFUSED)
        ttl = clamp_ttl(min_ttl) if records else 0
        with self._set_lock:
            if not self._policy.allowlist.allows(q.name):
                # The allowlist changed while we asked upstream.
                return wire.build_answer(q, wire.RCODE_NXDOMAIN)
            with self._lock:
                left = {
                    a: (self._granted[a].expires - now if a in self._granted else 0.0)
                    for a in addrs
                }
            life = ttl
            if addrs and min(left.values()) >= ttl / 2:
                # Every address is already in the sets for at least half the TTL: no nft call.
                # The answer and its cache line never outlive the shortest remaining entry.
                life = int(min(left.values()))
            elif addrs:
                # Re-adding resets an element's timeout, so never shorten a longer one.
                entries = [(a, max(ttl, int(left[a]) + 1)) for a in addrs]
                try:
                    self._add(entries)
                except Exception:
                    return wire.build_answer(q, wire.RCODE_SERVFAIL)
                with self._lock:
                    for a, t in entries:
                        g = self._granted.setdefault(a, _Granted(now + t))
                        g.expires = now + t
            with self._lock:
                for a in addrs:
                    self._granted[a].names.add(q.name)
                if len(self._cache) >= CACHE_MAX:
                    self._cache.clear()
                if life:
                    self._cache[key] = _CacheEntry(records, now + life, frozenset(names | {q.name}))
        return wire.build_answer(
            q, wire.RCODE_NOERROR, records, min(life, min_ttl) if records else 0
        )


def _follow_chain(
    answer: list[Record], name: str, rdtype: int
) -> tuple[list[Record], list[IPAddress], int, set[str]]:
    """Keep only the CNAME chain from `name` and the final address records.

    Records for other owners (an upstream stuffing extra names into the answer) are dropped:
    a CNAME target is allowed for this lookup only, because it was reached from `name`.
    """
    current = name
    wanted = {current}
    kept: list[Record] = []
    addrs: list[IPAddress] = []
    ttl = 2**31
    for _ in range(MAX_CNAME_CHAIN + 1):
        step = None
        for rec in answer:
            if rec.owner != current:
                continue
            if rec.rtype == wire.TYPE_CNAME:
                step = rec
                break
            if rec.rtype == rdtype and not isinstance(rec.value, str):
                kept.append(rec)
                ttl = min(ttl, rec.ttl)
                addrs.append(rec.value)
        if step is None:
            break
        kept.append(step)
        ttl = min(ttl, step.ttl)
        current = str(step.value)
        wanted.add(current)
    return kept, addrs, (ttl if kept else 0), wanted


# -- servers -------------------------------------------------------------------------------
MAX_TCP_CLIENTS = 32


UDP_WORKERS = 8


def serve_udp(sock: socket.socket, resolver: PolicyResolver, stop: threading.Event) -> None:
    """Answer datagrams on `sock` until `stop` is set (or the process ends: daemon threads).

    UDP_WORKERS threads each block in recvfrom on the same socket and answer what they
    receive themselves: the kernel wakes exactly one waiting thread per datagram, so there is
    no hand-over between a receiving thread and a worker (a thread wake-up per query, which
    cost more than the codec here). At most UDP_WORKERS lookups wait upstream at once; further
    datagrams queue in the socket buffer, and past it the kernel drops them (clients retry).
    """
    sock.settimeout(None)  # blocking: a timeout would make every thread poll on each datagram
    for i in range(1, UDP_WORKERS):
        threading.Thread(
            target=_udp_loop, args=(sock, resolver, stop), name=f"dns-udp-{i}", daemon=True
        ).start()
    _udp_loop(sock, resolver, stop)


def _udp_loop(sock: socket.socket, resolver: PolicyResolver, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            data, peer = sock.recvfrom(65535)
        except OSError:
            if stop.is_set():
                break
            continue
        try:
            out = resolver.handle(data)
            if out is not None:
                sock.sendto(out, peer)
        except Exception:  # one bad query must not stop the server
            log.exception("dns query failed")


def serve_tcp(sock: socket.socket, resolver: PolicyResolver, stop: threading.Event) -> None:
    """Answer length-prefixed queries on `sock` until `stop` is set."""
    slots = threading.BoundedSemaphore(MAX_TCP_CLIENTS)
    sock.settimeout(0.5)

    def conn_loop(conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            while not stop.is_set():
                head = _recv_exact(conn, 2)
                if head is None:
                    break
                body = _recv_exact(conn, int.from_bytes(head, "big"))
                if body is None:
                    break
                out = resolver.handle(body)
                if out is None:
                    break
                conn.sendall(len(out).to_bytes(2, "big") + out)
        except (OSError, ValueError):
            pass
        finally:
            conn.close()
            slots.release()

    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            if stop.is_set():
                break
            continue
        if not slots.acquire(blocking=False):
            conn.close()
            continue
        threading.Thread(target=conn_loop, args=(conn,), daemon=True).start()


def _recv_exact(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
