"""The policy resolver: the container's only DNS server.

dnspython does the wire format (parsing hostile bytes is exactly what a maintained library is
for; it is already a dependency). Every query is parsed, judged and re-built: nothing the
container sends is forwarded as raw bytes. Allowed names are asked upstream with a fresh
query; the addresses in the answer are pushed into the nft sets BEFORE the answer is sent, so
a client never holds an address it cannot reach, and an answer is never sent if that fails.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.query
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from linpodx.egress.policy import Allowlist, IPAddress, answer_refusal, clamp_ttl, normalize_name

log = logging.getLogger(__name__)

# Only what a client needs to connect. HTTPS/SVCB, MX, TXT, SRV, PTR, ANY, NULL … are refused:
# each can carry arbitrary bytes back into the container or name more endpoints.
ANSWERED_TYPES = frozenset({dns.rdatatype.A, dns.rdatatype.AAAA, dns.rdatatype.CNAME})
MAX_CNAME_CHAIN = 8
UPSTREAM_TIMEOUT = 3.0
CACHE_MAX = 4096

SetUpdater = Callable[[list[tuple[IPAddress, int]]], None]
SetDeleter = Callable[[list[IPAddress]], None]
DeniedHook = Callable[[str, str, str], None]
"""(name, record type, reason)"""


@dataclass(frozen=True)
class ResolverPolicy:
    """What the resolver enforces; swapped as a whole on a live update."""

    allowlist: Allowlist
    upstreams: tuple[tuple[str, int], ...]
    allow_private: bool
    host_addrs: frozenset[IPAddress] = frozenset()


@dataclass
class _CacheEntry:
    rrsets: list[dns.rrset.RRset]
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


def _udp_exchange(query: dns.message.Message, ip: str, port: int) -> dns.message.Message:
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
        sock.send(query.to_wire())
        deadline = time.monotonic() + UPSTREAM_TIMEOUT
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise dns.exception.Timeout()  # type: ignore[no-untyped-call]  # dnspython stub
            sock.settimeout(left)
            data = sock.recv(65535)
            try:
                resp = dns.message.from_wire(data)
            except dns.exception.DNSException:
                continue
            if query.is_response(resp):
                ok = True
                return resp
    finally:
        with _pool_lock:
            free = _pool.setdefault(key, [])
            if ok and len(free) < _POOL_MAX:
                free.append(sock)
            else:
                sock.close()


def query_upstream(
    query: dns.message.Message, upstreams: Sequence[tuple[str, int]]
) -> dns.message.Message:
    """Ask each upstream in turn (UDP, TCP when truncated); the first answer wins."""
    last: Exception | None = None
    for ip, port in upstreams:
        try:
            resp = _udp_exchange(query, ip, port)
            if resp.flags & dns.flags.TC:
                resp = dns.query.tcp(query, ip, port=port, timeout=UPSTREAM_TIMEOUT)
            return resp
        except (OSError, dns.exception.DNSException) as exc:
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
        upstream: Callable[
            [dns.message.Message, Sequence[tuple[str, int]]], dns.message.Message
        ] = query_upstream,
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
    def handle(self, wire: bytes) -> bytes | None:
        """Answer one query in wire format; None when not even a header could be read."""
        if len(wire) > 12:
            fast = self._fast.get(wire[2:])
            if fast is not None and self._clock() <= fast[0]:
                return wire[:2] + fast[1]
        try:
            query = dns.message.from_wire(wire)
        except dns.message.ShortHeader:
            return None
        except dns.exception.DNSException:
            return _header_only(wire, dns.rcode.FORMERR)
        if query.flags & dns.flags.QR:
            return None  # a response is never answered (no reflection loops)
        if query.opcode() != dns.opcode.QUERY:
            return _reply(query, dns.rcode.NOTIMP)
        if len(query.question) != 1:
            return _reply(query, dns.rcode.FORMERR)
        q = query.question[0]
        name = normalize_name(q.name.to_text(omit_final_dot=True))
        tname = dns.rdatatype.to_text(q.rdtype)
        policy = self._policy
        if q.rdclass != dns.rdataclass.IN or not policy.allowlist.allows(name):
            self._denied(name, tname, "name not in the allowlist")
            return _reply(query, dns.rcode.NXDOMAIN)
        if q.rdtype not in (dns.rdatatype.A, dns.rdatatype.AAAA):
            # CNAME-only questions are not needed by clients (they ask A/AAAA and get the
            # chain); every other type can carry data: refuse.
            self._denied(name, tname, f"record type {tname} is not answered")
            return _reply(query, dns.rcode.REFUSED)
        # A plain query (header + one question, nothing else) can be answered from the bytes
        # cache next time: same flags, same question bytes -> same answer bytes but the id.
        plain = len(query.additional) == 0 and query.edns < 0 and len(wire) <= 512
        return self._answer(query, name, q.rdtype, wire[2:] if plain else None).to_wire()

    def _answer(
        self,
        query: dns.message.Message,
        name: str,
        rdtype: dns.rdatatype.RdataType,
        wire_key: bytes | None = None,
    ) -> dns.message.Message:
        now = self._clock()
        key = (name, rdtype)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit.expires > now:
                ttl = int(hit.expires - now)
                resp = _build(query, hit.rrsets, max(1, ttl))
                if ttl >= 1 and wire_key is not None:
                    # Every TTL in these bytes is <= ttl, which stays <= the time the entry
                    # has left until `hit.expires - ttl`: until then the same bytes are exact.
                    out = resp.to_wire()
                    if len(self._fast) >= CACHE_MAX:
                        self._fast.clear()
                    self._fast[wire_key] = (hit.expires - ttl, out[2:])
                return resp
        policy = self._policy
        up = dns.message.make_query(name, rdtype)
        try:
            resp = self._upstream(up, policy.upstreams)
        except UpstreamError:
            return _reply_msg(query, dns.rcode.SERVFAIL)
        rcode = resp.rcode()
        if rcode != dns.rcode.NOERROR:
            # NXDOMAIN passes through as itself; anything else is a server failure to us.
            return _reply_msg(query, rcode if rcode == dns.rcode.NXDOMAIN else dns.rcode.SERVFAIL)
        rrsets, addrs, min_ttl, names = _follow_chain(resp, name, rdtype)
        for addr in addrs:
            why = answer_refusal(
                addr, allow_private=policy.allow_private, host_addrs=policy.host_addrs
            )
            if why is not None:
                self._denied(name, dns.rdatatype.to_text(rdtype), f"answer {addr}: {why}")
                return _reply_msg(query, dns.rcode.REFUSED)
        ttl = clamp_ttl(min_ttl) if rrsets else 0
        with self._set_lock:
            if not self._policy.allowlist.allows(name):
                # The allowlist changed while we asked upstream.
                return _reply_msg(query, dns.rcode.NXDOMAIN)
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
                    return _reply_msg(query, dns.rcode.SERVFAIL)
                with self._lock:
                    for a, t in entries:
                        g = self._granted.setdefault(a, _Granted(now + t))
                        g.expires = now + t
            with self._lock:
                for a in addrs:
                    self._granted[a].names.add(name)
                if len(self._cache) >= CACHE_MAX:
                    self._cache.clear()
                if life:
                    self._cache[key] = _CacheEntry(rrsets, now + life, frozenset(names | {name}))
        return _build(query, rrsets, min(life, min_ttl) if rrsets else 0)


def _follow_chain(
    resp: dns.message.Message, name: str, rdtype: dns.rdatatype.RdataType
) -> tuple[list[dns.rrset.RRset], list[IPAddress], int, set[str]]:
    """Keep only the CNAME chain from `name` and the final address records.

    Records for other owners (an upstream stuffing extra names into the answer) are dropped:
    a CNAME target is allowed for this lookup only, because it was reached from `name`.
    """
    wanted = {normalize_name(name)}
    current = normalize_name(name)
    kept: list[dns.rrset.RRset] = []
    addrs: list[IPAddress] = []
    ttl = 2**31
    for _ in range(MAX_CNAME_CHAIN + 1):
        step = None
        for rrset in resp.answer:
            owner = normalize_name(rrset.name.to_text(omit_final_dot=True))
            if owner != current or rrset.rdclass != dns.rdataclass.IN:
                continue
            if rrset.rdtype == dns.rdatatype.CNAME:
                step = rrset
                break
            if rrset.rdtype == rdtype:
                kept.append(rrset)
                ttl = min(ttl, rrset.ttl)
                addrs.extend(ipaddress.ip_address(rd.address) for rd in rrset)
        if step is None:
            break
        kept.append(step)
        ttl = min(ttl, step.ttl)
        current = normalize_name(step[0].target.to_text(omit_final_dot=True))
        wanted.add(current)
    return kept, addrs, (ttl if kept else 0), wanted


def _build(
    query: dns.message.Message, rrsets: list[dns.rrset.RRset], ttl: int
) -> dns.message.Message:
    resp = dns.message.make_response(query)
    resp.flags |= dns.flags.RA
    for rrset in rrsets:
        copy = dns.rrset.RRset(rrset.name, rrset.rdclass, rrset.rdtype)
        copy.update(rrset)  # type: ignore[no-untyped-call]  # dnspython stub
        # Never let a client keep an address longer than the set keeps it.
        copy.ttl = max(0, min(rrset.ttl, ttl))
        resp.answer.append(copy)
    return resp


def _reply_msg(query: dns.message.Message, rcode: dns.rcode.Rcode) -> dns.message.Message:
    resp = dns.message.make_response(query)
    resp.flags |= dns.flags.RA
    resp.set_rcode(rcode)
    return resp


def _reply(query: dns.message.Message, rcode: dns.rcode.Rcode) -> bytes:
    return _reply_msg(query, rcode).to_wire()


def _header_only(wire: bytes, rcode: int) -> bytes:
    """A bare header answer for a query dnspython could not parse past its header."""
    qid = wire[:2]
    flags = 0x8000 | 0x0080 | (rcode & 0xF)  # QR, RA, rcode
    return qid + flags.to_bytes(2, "big") + b"\x00" * 8


# -- servers -------------------------------------------------------------------------------
MAX_TCP_CLIENTS = 32


def serve_udp(sock: socket.socket, resolver: PolicyResolver, stop: threading.Event) -> None:
    """Answer datagrams on `sock` until `stop` is set (a few workers, bounded queue)."""
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="dns-udp")
    pending = threading.BoundedSemaphore(256)
    sock.settimeout(0.5)

    def work(data: bytes, peer: tuple[str, int]) -> None:
        try:
            out = resolver.handle(data)
            if out is not None:
                sock.sendto(out, peer)
        except Exception:  # one bad query must not stop the server
            log.exception("dns query failed")
        finally:
            pending.release()

    while not stop.is_set():
        try:
            data, peer = sock.recvfrom(65535)
        except TimeoutError:
            continue
        except OSError:
            if stop.is_set():
                break
            continue
        if not pending.acquire(blocking=False):
            continue  # overloaded: drop, the client retries
        pool.submit(work, data, peer)
    pool.shutdown(wait=False, cancel_futures=True)


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
