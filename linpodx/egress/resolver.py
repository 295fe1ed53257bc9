"""The policy resolver: the container's only DNS server.

Every query is parsed, judged and re-built: nothing the container sends is forwarded as raw
bytes, and nothing an upstream sends is passed on as raw bytes. dnspython reads and writes
every message (`linpodx.egress.dnsmsg`, imported on first use); this module decides. Allowed
names are asked upstream with a fresh query; the addresses in the answer are pushed into the
nft sets BEFORE the answer is sent, so a client never holds an address it cannot reach, and
an answer is never sent if that fails.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from linpodx.egress.budget import DEFAULT_BUDGET, WildcardBudget, window_text
from linpodx.egress.policy import Allowlist, IPAddress, answer_refusal, clamp_ttl

if TYPE_CHECKING:
    from linpodx.egress.dnsmsg import Outgoing, Query, Record, Reply

log = logging.getLogger(__name__)

_V = TypeVar("_V")

# Only what a client needs to connect: A and AAAA questions (dns.rdatatype.A, AAAA), answered
# with their CNAME chain. HTTPS/SVCB, MX, TXT, SRV, PTR, ANY, NULL … are refused: each can
# carry arbitrary bytes back into the container or name more endpoints.
ADDRESS_TYPES = frozenset({1, 28})
MAX_CNAME_CHAIN = 8
MAX_ANSWER_ADDRS = 32
"""Addresses of one answer kept, granted and handed on, at most (the first ones; clients use
one or a few). An upstream answer over TCP may carry ~4,000: each kept in memory took
~1.3 MB, so a zone answering every name so could grow the guard by gigabytes (4096 lines of
memory, or more under a large wildcard budget)."""
UPSTREAM_TIMEOUT = 3.0
CACHE_MAX = 4096
GRANTED_MAX = 65536
"""Addresses granted and not yet expired, at most: the guard's memory and the nft sets stay
bounded even when an allowed wildcard's upstream hands out a new address for every name
asked (past it, a lookup needing a new address fails, recorded, until some expire). Expired
entries are kept below it, so that a policy change also cuts the open flows to them."""
NEGATIVE_TTL = 30
"""Seconds a lookup that gave no address (NXDOMAIN, no record of that type, an answer the
policy refuses) is answered again from memory, without asking upstream. Without it every
repeat went upstream: a channel out of the container as wide as the upstream's query rate
(which names were asked, how often, when), even for one exact allowed name."""
FAILURE_TTL = 5
"""The same for a failure (SERVFAIL, no answer in time): short, so a resolver that comes
back is used soon (RFC 9520 asks for at least 1 s)."""
SERVFAIL_RCODE = 2  # dns.rcode.SERVFAIL, without importing dnspython here
RECORD_WAIT = 10.0
"""Seconds a lookup of a name waits for the record another lookup of it is writing (past
it: REFUSED, never asked unrecorded)."""
NAMES_PER_ADDRESS_MAX = 64
"""Names remembered per granted address (a CDN address serves many). Forgetting one only
means a policy change may revoke the address though that name is still allowed: it fails
closed, and the next lookup of the name grants the address again."""

SetUpdater = Callable[[list[tuple[IPAddress, int]]], None]
SetRevoker = Callable[[list[IPAddress]], None]
"""Takes addresses away: out of the allowed sets, and established flows to them stopped."""
DeniedHook = Callable[[str, str, str], None]
"""(name, record type, reason)"""
NewNameHook = Callable[[str, str, int, int, str], bool]
"""(name, the wildcard entry that allows it, names in the window with it, the budget, the
window for people): a name under a wildcard is about to be asked upstream for the first time
in the window. False: it could not be recorded, and is refused."""
Upstream = Callable[["Outgoing", Sequence[tuple[str, int]]], "Reply"]
"""(our query, upstreams) -> the parsed answer to it; UpstreamError if none came."""


@dataclass(frozen=True)
class ResolverPolicy:
    """What the resolver enforces; swapped as a whole on a live update."""

    allowlist: Allowlist
    upstreams: tuple[tuple[str, int], ...]
    allow_private: bool
    host_addrs: frozenset[IPAddress] = frozenset()
    wildcard_budget: int = DEFAULT_BUDGET
    """Distinct new names allowed by wildcards alone, at most, per `budget.WINDOW`."""


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


def _udp_exchange(sent: Outgoing, ip: str, port: int) -> Reply:
    """One UDP round trip on a connected socket (the kernel drops datagrams from anyone else);
    the answer must parse and match our random id and question, or we keep waiting until the
    timeout.

    Connected sockets are kept in a small pool per upstream and reused one query at a time:
    opening a fresh socket per query cost several ms here (dns.query.udp ~10 ms per call).
    Each pooled socket keeps its own random source port; a socket that timed out or failed
    is closed, never reused, and a late answer to an old query on a reused one is skipped
    because it does not match the current id and question.

    The sockets block, with the kernel's receive timeout (SO_RCVTIMEO) as the deadline: a
    Python socket timeout would cost two fcntl calls and a poll around every recv.
    """
    from linpodx.egress.dnsmsg import read_reply

    key = (ip, port)
    with _pool_lock:
        free = _pool.setdefault(key, [])
        sock = free.pop() if free else None
    if sock is None:
        sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect((ip, port))
        _recv_timeout(sock, UPSTREAM_TIMEOUT)
    ok = False
    shortened = False
    try:
        sock.send(sent.wire)
        deadline = time.monotonic() + UPSTREAM_TIMEOUT
        while True:
            try:
                data = sock.recv(65535)
            except BlockingIOError:  # EAGAIN: the receive timeout ran out
                raise TimeoutError("upstream did not answer in time") from None
            resp = read_reply(sent, data)
            if resp is not None:
                if shortened:
                    _recv_timeout(sock, UPSTREAM_TIMEOUT)
                ok = True
                return resp
            left = deadline - time.monotonic()  # not ours: wait out the rest of the time
            if left <= 0:
                raise TimeoutError("upstream did not answer in time")
            _recv_timeout(sock, left)
            shortened = True
    finally:
        with _pool_lock:
            free = _pool.setdefault(key, [])
            if ok and len(free) < _POOL_MAX:
                free.append(sock)
            else:
                sock.close()


_TIMEVAL = struct.Struct("@ll")


def _recv_timeout(sock: socket.socket, seconds: float) -> None:
    """Set SO_RCVTIMEO (at least 1 µs: zero would mean wait forever)."""
    whole = int(seconds)
    micro = int((seconds - whole) * 1_000_000)
    if whole == 0 and micro == 0:
        micro = 1
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TIMEVAL.pack(whole, micro))


def _tcp_exchange(sent: Outgoing, ip: str, port: int) -> Reply:
    """The same question over TCP (after a truncated UDP answer)."""
    from linpodx.egress.dnsmsg import read_reply

    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(UPSTREAM_TIMEOUT)
        sock.connect((ip, port))
        sock.sendall(len(sent.wire).to_bytes(2, "big") + sent.wire)
        head = _recv_exact(sock, 2)
        data = _recv_exact(sock, int.from_bytes(head, "big")) if head else None
    resp = read_reply(sent, data) if data is not None else None
    if resp is None:
        raise OSError("no matching answer over TCP")
    return resp


def query_upstream(sent: Outgoing, upstreams: Sequence[tuple[str, int]]) -> Reply:
    """Ask each upstream in turn (UDP, TCP when truncated); the first answer wins."""
    last: Exception | None = None
    for ip, port in upstreams:
        try:
            resp = _udp_exchange(sent, ip, port)
            if resp.truncated:
                resp = _tcp_exchange(sent, ip, port)
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
        revoke_in_sets: SetRevoker,
        on_denied: DeniedHook,
        on_new_name: NewNameHook | None = None,
        upstream: Upstream = query_upstream,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policy = policy
        self._add = add_to_sets
        self._revoke = revoke_in_sets
        self._denied = on_denied
        self._new_name = on_new_name
        self._upstream = upstream
        self._clock = clock
        self._lock = threading.Lock()
        # Serializes set updates with policy swaps, so a lookup that raced an update cannot
        # re-add an address the update just removed for a name that is no longer allowed.
        self._set_lock = threading.Lock()
        self._cache: dict[tuple[str, int], _CacheEntry] = {}
        # (name, type) -> (valid until, rcode) of lookups that gave no address; emptied by
        # every policy change (a refused answer may be allowed now, and the other way round).
        # The refusal's reason is kept, so a repeat is recorded as the first one was.
        self._negative: dict[tuple[str, int], tuple[float, int, str | None]] = {}
        # (name, type) -> set once the one upstream query for it in flight has been answered.
        self._inflight: dict[tuple[str, int], threading.Event] = {}
        self._granted: dict[IPAddress, _Granted] = {}
        # Query bytes without the id -> (valid until, answer bytes without the id), filled
        # from cache hits only and emptied by every policy change.
        self._fast: dict[bytes, tuple[float, bytes]] = {}
        # Address -> why it is refused (None: fine), with the policy it was judged under: the
        # ipaddress range checks cost ~10 us per address, and CDN answers repeat the same few.
        self._refusals: tuple[ResolverPolicy, dict[IPAddress, str | None]] = (policy, {})
        # Names asked upstream under wildcards in the last 10 minutes. Kept across policy
        # changes: a re-apply is no fresh budget (a new one applies to the next new name).
        self._budget = WildcardBudget(clock=clock)

    @property
    def policy(self) -> ResolverPolicy:
        return self._policy

    # -- live update ----------------------------------------------------------------------
    def set_policy(self, policy: ResolverPolicy) -> list[IPAddress]:
        """Swap the policy; drop the set entries and cache lines that only names it no longer
        allows justified, and those of addresses it refuses (a private answer once
        `allow_private_answers` is turned off, a new host address).

        Those addresses are revoked, not just deleted from the sets: the ruleset accepts the
        packets of established flows before it looks at the allowed sets, so a connection
        opened while an address was allowed would otherwise go on for as long as it lasts.
        (A set entry that merely lapses by its TTL is not revoked: its open flows go on.) A
        later lookup of a name allowed again grants the address afresh (`_answer` finds it
        no longer granted and adds it, which also ends the revocation).

        Cache lines that hold a revoked address go too, even for a name still allowed (its
        address may have been justified by names no longer remembered, see
        NAMES_PER_ADDRESS_MAX): its next lookup goes upstream and grants the address again.

        If the revocation fails (raises), the addresses stay granted here, with no allowed
        name left, so the next policy load revokes them again.

        Returns the addresses revoked.
        """
        with self._set_lock:
            with self._lock:
                self._policy = policy
                self._fast = {}
                self._negative = {}
                self._refusals = (policy, {})
                gone: list[IPAddress] = []
                for addr, g in self._granted.items():
                    g.names = {n for n in g.names if policy.allowlist.allows(n)}
                    if not g.names or self._refusal(policy, addr) is not None:
                        gone.append(addr)
                taken = set(gone)
                self._cache = {
                    k: v
                    for k, v in self._cache.items()
                    if all(policy.allowlist.allows(n) for n in v.names)
                    and not any(
                        r.address in taken or self._refusal(policy, r.address)
                        for r in v.records
                        if r.address is not None
                    )
                }
            if gone:
                self._revoke(gone)
                with self._lock:
                    for addr in gone:
                        del self._granted[addr]
            return gone

    # -- one query ------------------------------------------------------------------------
    def handle(self, data: bytes) -> bytes | None:
        """Answer one query in wire format; None when not even a header could be read."""
        if len(data) > 12:
            fast = self._fast.get(data[2:])
            if fast is not None and self._clock() <= fast[0]:
                return data[:2] + fast[1]
        from linpodx.egress import dnsmsg

        q = dnsmsg.read_query(data)
        if not isinstance(q, dnsmsg.Query):
            return q
        # One read of the policy for the whole lookup: `_answer` compares it with the one in
        # force when it grants, and judges again if a re-apply came in between.
        policy = self._policy
        if q.rdclass != dnsmsg.IN or not policy.allowlist.allows(q.name):
            self._denied(q.name, q.type_text, "name not in the allowlist")
            return dnsmsg.answer(q, dnsmsg.NXDOMAIN)
        if q.rdtype not in ADDRESS_TYPES:
            # CNAME-only questions are not needed by clients (they ask A/AAAA and get the
            # chain); every other type can carry data: refuse.
            self._denied(q.name, q.type_text, f"record type {q.type_text} is not answered")
            return dnsmsg.answer(q, dnsmsg.REFUSED)
        if not q.is_host_name:
            # Allowed by a wildcard, but no host has such a name (an escaped space, a dot or
            # a NUL inside a label): never asked upstream, never echoed into a CNAME chain.
            self._denied(q.name, q.type_text, "not a host name (letters, digits, '-', '_')")
            return dnsmsg.answer(q, dnsmsg.REFUSED)
        # A plain query (header + one question, nothing else) can be answered from the bytes
        # cache next time: same flags, same question bytes -> same answer bytes but the id.
        plain = q.plain and len(data) <= 512
        return self._answer(q, data[2:] if plain else None, policy)

    def _refusal(self, policy: ResolverPolicy, addr: IPAddress) -> str | None:
        judged_under, refusals = self._refusals
        if judged_under is not policy:  # swapped while we asked upstream: judge afresh
            refusals = {}
        if addr in refusals:
            return refusals[addr]
        why = answer_refusal(addr, allow_private=policy.allow_private, host_addrs=policy.host_addrs)
        if len(refusals) >= CACHE_MAX:
            refusals.clear()
        refusals[addr] = why
        return why

    def _answer(
        self, q: Query, wire_key: bytes | None, policy: ResolverPolicy, waited: bool = False
    ) -> bytes:
        from linpodx.egress import dnsmsg

        now = self._clock()
        key = (q.name, q.rdtype)
        mine: threading.Event | None = None
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit.expires > now:
                ttl = int(hit.expires - now)
                out = dnsmsg.answer(q, dnsmsg.NOERROR, hit.records, max(1, ttl))
                if ttl >= 1 and wire_key is not None:
                    # Every TTL in these bytes is <= ttl, which stays <= the time the entry
                    # has left until `hit.expires - ttl`: until then the same bytes are exact.
                    if len(self._fast) >= CACHE_MAX:
                        self._fast.clear()
                    self._fast[wire_key] = (hit.expires - ttl, out[2:])
                return out
            neg = self._negative.get(key)
            other = None
            if neg is None or neg[0] <= now:
                # One upstream query per name and type at a time: the same lookups arriving
                # together wait for the first one's answer (then in the caches) instead of
                # each going upstream, which would let their number carry data out.
                other = self._inflight.get(key)
                if other is None:
                    mine = self._inflight[key] = threading.Event()
        if neg is not None and neg[0] > now:
            if neg[2] is not None:
                self._denied(q.name, q.type_text, neg[2])
            return dnsmsg.answer(q, neg[1])
        if mine is None:
            # The same lookup is with the upstream: wait for it once, then answer from what
            # it left in the caches (or, if it left nothing, ask ourselves, one at a time).
            if waited or other is None:
                # Still one with the upstream after all that wait (an upstream slower than
                # its timeout, a TCP retry): a query of our own beside it would let the
                # number of lookups at once carry data out. Fail; the client asks again.
                return dnsmsg.answer(q, dnsmsg.SERVFAIL)
            other.wait(UPSTREAM_TIMEOUT * max(1, len(policy.upstreams)) + 1)
            return self._answer(q, wire_key, policy, waited=True)
        try:
            return self._ask_upstream(q, key, policy, now)
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            mine.set()

    def _ask_upstream(
        self, q: Query, key: tuple[str, int], policy: ResolverPolicy, now: float
    ) -> bytes:
        from linpodx.egress import dnsmsg

        refused = self._over_budget(q, policy)
        if refused is not None:
            return refused
        # The name as linpodx normalized it (lower case), never as the client spelled it:
        # the letter case of an allowed name would otherwise carry a bit per letter upstream.
        sent = dnsmsg.upstream_query(
            int.from_bytes(os.urandom(2), "big"), q.qname.canonicalize(), q.rdtype
        )
        try:
            resp = self._upstream(sent, policy.upstreams)
        except UpstreamError:
            return self._negative_answer(q, key, dnsmsg.SERVFAIL, policy, now)
        rcode = resp.rcode
        if rcode != dnsmsg.NOERROR:
            # NXDOMAIN passes through as itself; anything else is a server failure to us.
            failed = dnsmsg.NXDOMAIN if rcode == dnsmsg.NXDOMAIN else dnsmsg.SERVFAIL
            return self._negative_answer(q, key, failed, policy, now)
        chain = dnsmsg.follow_chain(resp, q.name, q.rdtype, MAX_CNAME_CHAIN, MAX_ANSWER_ADDRS)
        for addr in chain.addrs:
            why = self._refusal(policy, addr)
            if why is not None:
                said = f"answer {addr}: {why}"
                self._denied(q.name, q.type_text, said)
                return self._negative_answer(q, key, dnsmsg.REFUSED, policy, now, said)
        if not chain.addrs:
            # No address of that type (NODATA), perhaps after a CNAME chain: remembered like
            # NXDOMAIN. The chain itself is still handed out this time.
            self._remember_negative(key, dnsmsg.NOERROR, policy, now)
        ttl = clamp_ttl(chain.ttl) if chain.records else 0
        with self._set_lock:
            now_policy = self._policy
            if now_policy is not policy:
                # The policy changed while we asked upstream: the answer is judged again under
                # the one now in force, which may refuse the name or an address the old one
                # took (`allow_private_answers` turned off).
                if not now_policy.allowlist.allows(q.name):
                    return dnsmsg.answer(q, dnsmsg.NXDOMAIN)
                for addr in chain.addrs:
                    why = self._refusal(now_policy, addr)
                    if why is not None:
                        self._denied(q.name, q.type_text, f"answer {addr}: {why}")
                        return dnsmsg.answer(q, dnsmsg.REFUSED)
            with self._lock:
                left = {
                    a: (self._granted[a].expires - now if a in self._granted else 0.0)
                    for a in chain.addrs
                }
            life = ttl
            if chain.addrs and min(left.values()) >= ttl / 2:
                # Every address is already in the sets for at least half the TTL: no nft call.
                # The answer and its cache line never outlive the shortest remaining entry.
                life = int(min(left.values()))
            elif chain.addrs:
                if not self._room_for(chain.addrs, now):
                    self._denied(
                        q.name, q.type_text, f"more than {GRANTED_MAX} addresses granted at once"
                    )
                    return dnsmsg.answer(q, dnsmsg.SERVFAIL)
                # Re-adding resets an element's timeout, so never shorten a longer one.
                entries = [(a, max(ttl, int(left[a]) + 1)) for a in chain.addrs]
                try:
                    self._add(entries)
                except Exception:
                    return dnsmsg.answer(q, dnsmsg.SERVFAIL)
                with self._lock:
                    for a, t in entries:
                        g = self._granted.setdefault(a, _Granted(now + t))
                        g.expires = now + t
            with self._lock:
                for a in chain.addrs:
                    names = self._granted[a].names
                    if len(names) < NAMES_PER_ADDRESS_MAX:
                        names.add(q.name)
                if len(self._cache) >= self._memory_max(policy):
                    self._cache = self._keep(self._cache, policy, now, lambda v: v.expires)
                if life:
                    self._cache[key] = _CacheEntry(chain.records, now + life, chain.names)
        ttl = min(life, chain.ttl) if chain.records else 0
        return dnsmsg.answer(q, dnsmsg.NOERROR, chain.records, ttl)


    def _over_budget(self, q: Query, policy: ResolverPolicy) -> bytes | None:
        """REFUSED for a new name under a wildcard once the window holds the budget's worth;
        None (go ahead) otherwise, recording a name that is new.

        Here, right before the upstream query, because that query is what carries the name
        out: cached and remembered answers cost nothing, and so does a name refused before
        (not allowed, a refused type, not a host name). Counted whatever the upstream then
        says: NXDOMAIN or a refused answer come after the name has left. The key is
        `q.name`, the lower-case text of the parsed labels, which is what the upstream is
        asked: spellings that reach the upstream as one name (letter case, escapes, the
        trailing dot) count once, and A and AAAA of one name count once.

        REFUSED, not NXDOMAIN: the name may well exist, and be allowed again once the window
        moves on. An NXDOMAIN would be a false statement that caches in the container may
        keep (RFC 8020 even lets them treat every name below it as missing); REFUSED is
        DNS's "not for policy reasons", as for refused record types, and is never cached.
        Not remembered either: the next lookup is judged afresh.
        """
        from linpodx.egress import dnsmsg

        wildcard = policy.allowlist.wildcard_for(q.name)
        if wildcard is None:
            return None  # exact names are never counted
        got = self._budget.admit(q.name, policy.wildcard_budget)
        if got.recording is not None:
            # Another lookup of this name (its A beside this AAAA) is having the name
            # recorded: nothing of the name goes upstream before its record exists.
            got.recording.wait(RECORD_WAIT)
            got = self._budget.admit(q.name, policy.wildcard_budget)
            if got.recording is not None:
                self._denied(q.name, q.type_text, "the new name could not be recorded in time")
                return dnsmsg.answer(q, dnsmsg.REFUSED)
        if not got.allowed:
            self._denied(
                q.name,
                q.type_text,
                f"wildcard budget: {got.budget} new names per "
                f"{window_text(self._budget.window)}, all used",
            )
            return dnsmsg.answer(q, dnsmsg.REFUSED)
        if got.new:
            window = window_text(self._budget.window)
            hook = self._new_name
            try:
                recorded = hook is None or hook(q.name, wildcard, got.used, got.budget, window)
            except BaseException:
                self._budget.forget(q.name)
                raise
            if not recorded:
                # An allow that cannot be recorded does not happen (and costs nothing).
                self._budget.forget(q.name)
                self._denied(q.name, q.type_text, "the new name could not be recorded")
                return dnsmsg.answer(q, dnsmsg.REFUSED)
            self._budget.settle(q.name)
        return None

    @staticmethod
    def _memory_max(policy: ResolverPolicy) -> int:
        """Lookups remembered at most (answers, and apart from them failures): room for A and
        AAAA of every name the budget may hold in its window, beside CACHE_MAX others."""
        return CACHE_MAX + 2 * policy.wildcard_budget

    def _keep(
        self,
        memory: dict[tuple[str, int], _V],
        policy: ResolverPolicy,
        now: float,
        until: Callable[[_V], float],
    ) -> dict[tuple[str, int], _V]:
        """`memory` (full) without what may go: lapsed lines, then names allowed only by a
        wildcard that have left the budget's window (asking them again costs a new name);
        and if that freed too little, exact names too (only a very long allowlist has that
        many). Emptying it outright let every repeat go upstream again at once: with a budget
        above CACHE_MAX / 2, cycling through the names in the window emptied it over and
        over, and each repeat was another message out. The names in the window, A and AAAA,
        always fit (`_memory_max`), with CACHE_MAX to spare."""
        kept = {
            k: v
            for k, v in memory.items()
            if until(v) > now
            and (policy.allowlist.wildcard_for(k[0]) is None or self._budget.holds(k[0]))
        }
        if len(kept) > self._memory_max(policy) - CACHE_MAX // 4:
            kept = {k: v for k, v in kept.items() if policy.allowlist.wildcard_for(k[0])}
        return kept

    def _remember_negative(
        self,
        key: tuple[str, int],
        rcode: int,
        policy: ResolverPolicy,
        now: float,
        why: str | None = None,
    ) -> None:
        """Answer `key` with `rcode` and no records for a while (NEGATIVE_TTL, FAILURE_TTL
        for SERVFAIL), unless the policy changed meanwhile (it emptied the memory). The while
        starts now, when the answer (or the last upstream's timeout) came, not when the
        lookup began: upstreams that time out one after another take longer than it lasts."""
        life = FAILURE_TTL if rcode == SERVFAIL_RCODE else NEGATIVE_TTL
        now = max(now, self._clock())
        with self._lock:
            if self._policy is not policy:
                return
            if len(self._negative) >= self._memory_max(policy):
                self._negative = self._keep(self._negative, policy, now, lambda v: v[0])
            self._negative[key] = (now + life, rcode, why)

    def _negative_answer(
        self,
        q: Query,
        key: tuple[str, int],
        rcode: int,
        policy: ResolverPolicy,
        now: float,
        why: str | None = None,
    ) -> bytes:
        from linpodx.egress import dnsmsg

        self._remember_negative(key, rcode, policy, now, why)
        return dnsmsg.answer(q, rcode)

    def _room_for(self, addrs: Sequence[IPAddress], now: float) -> bool:
        """Whether `addrs` may be granted without passing GRANTED_MAX (expired entries are
        dropped first, only when it would be passed: they are out of the sets already)."""
        with self._lock:
            new = sum(1 for a in set(addrs) if a not in self._granted)
            if len(self._granted) + new <= GRANTED_MAX:
                return True
            for a in [a for a, g in self._granted.items() if g.expires <= now]:
                del self._granted[a]
            return len(self._granted) + new <= GRANTED_MAX


# -- servers -------------------------------------------------------------------------------
MAX_TCP_CLIENTS = 32


UDP_WORKERS = 8


def serve_udp(sock: socket.socket, resolver: PolicyResolver, stop: threading.Event) -> None:
    """Answer datagrams on `sock` until `stop` is set (or the process ends: daemon threads).

    UDP_WORKERS threads each block in recvfrom on the same socket and answer what they
    receive themselves: the kernel wakes exactly one waiting thread per datagram, so there is
    no hand-over between a receiving thread and a worker (one more thread wake-up per query).
    At most UDP_WORKERS lookups wait upstream at once; further datagrams queue in the socket
    buffer, and past it the kernel drops them (clients retry).
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
