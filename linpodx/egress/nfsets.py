"""Updates of the allowed sets as nf_tables netlink batches, sent on a socket that lives in
the container's network namespace.

Why not libnftables here: every call parses nft text and first re-reads the kernel's ruleset
into its cache, about 0.3 ms per update on this kind of machine, and the resolver must wait for
the update before it answers a lookup of a new address. The batch for a few addresses is fixed
in shape (what `nft add element` sends), so it is built here directly and sent with one
sendto; the kernel applies it atomically and acknowledges each message (~0.03 ms).

The socket is opened by a short-lived thread that joined the container's netns (a socket
belongs to the netns it was created in, forever), so every thread can then use it.

Each address is added (so it surely exists), deleted and added again with its new timeout, all
in one batch: `add` alone leaves an existing element's timeout unchanged, and inside one
transaction packets never see the address missing.

A policy change that takes addresses away revokes them: one batch removes them from the
allowed sets and puts them into the revoked sets, which the ruleset checks before it accepts
established flows, so a connection opened while they were allowed stops too. An allowed
element that merely lapsed is not revoked (see `ruleset`). A later `add` of a revoked
address takes it out of the revoked sets in its own batch, so it is allowed again, new and
established flows alike, at the same instant.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Iterable

from linpodx.egress.netns import CLONE_NEWNET, setns
from linpodx.egress.policy import IPAddress
from linpodx.egress.ruleset import REVOKED4, REVOKED6, SET4, SET6, TABLE

NETLINK_NETFILTER = 12
NLMSG_ERROR = 2
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_CREATE = 0x400
NLA_F_NESTED = 0x8000
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFT_MSG_NEWSETELEM = 12
NFT_MSG_DELSETELEM = 14
NFPROTO_INET = 1
NFTA_SET_ELEM_LIST_TABLE = 1
NFTA_SET_ELEM_LIST_SET = 2
NFTA_SET_ELEM_LIST_ELEMENTS = 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY = 1
NFTA_SET_ELEM_TIMEOUT = 4
NFTA_DATA_VALUE = 1

ACK_TIMEOUT = 5.0
BATCH_ADDRESSES = 512
"""Addresses per batch. A message carries a set's elements in one netlink attribute, whose
length field has 16 bits (~2,300 addresses with timeouts), and a batch must fit the socket's
send buffer (~200 KiB): 512 addresses make at most ~60 KiB, in messages of ~20 KiB."""

_NLMSGHDR = struct.Struct("=IHHII")


def _attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes (the length field excludes the padding)."""
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def _nest(kind: int, payload: bytes) -> bytes:
    return _attr(kind | NLA_F_NESTED, payload)


def _message(kind: int, flags: int, seq: int, family: int, res_id: int, body: bytes) -> bytes:
    """nlmsghdr + nfgenmsg (family, version 0, big-endian resource id) + attributes."""
    payload = struct.pack("!BBH", family, 0, res_id) + body
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), kind, flags, seq, 0) + payload


def _elements(
    kind: int, set_name: str, elems: list[tuple[IPAddress, int | None]], seq: int
) -> bytes:
    """One NEWSETELEM/DELSETELEM message for `set_name` (timeout in seconds, or none)."""
    parts = []
    for addr, timeout in elems:
        elem = _nest(NFTA_SET_ELEM_KEY, _attr(NFTA_DATA_VALUE, addr.packed))
        if timeout is not None:
            elem += _attr(NFTA_SET_ELEM_TIMEOUT, struct.pack("!Q", int(timeout) * 1000))
        parts.append(_nest(NFTA_LIST_ELEM, elem))
    items = b"".join(parts)
    body = (
        _attr(NFTA_SET_ELEM_LIST_TABLE, TABLE.encode() + b"\0")
        + _attr(NFTA_SET_ELEM_LIST_SET, set_name.encode() + b"\0")
        + _nest(NFTA_SET_ELEM_LIST_ELEMENTS, items)
    )
    flags = NLM_F_REQUEST | NLM_F_ACK
    if kind == NFT_MSG_NEWSETELEM:
        flags |= NLM_F_CREATE
    return _message((NFNL_SUBSYS_NFTABLES << 8) | kind, flags, seq, NFPROTO_INET, 0, body)


ALLOWED = (SET4, SET6)
REVOKED = (REVOKED4, REVOKED6)

Step = tuple[int, bool]
"""One message per set: NEWSETELEM or DELSETELEM, and whether its elements carry a timeout."""
_ADD_REFRESH: tuple[Step, ...] = (
    (NFT_MSG_NEWSETELEM, True),
    (NFT_MSG_DELSETELEM, False),
    (NFT_MSG_NEWSETELEM, True),
)
# Added first (with 1 s where the set has timeouts), so an element that has lapsed or was
# never there cannot make the delete, and with it the whole batch, fail.
_ADD_DELETE_TIMED: tuple[Step, ...] = ((NFT_MSG_NEWSETELEM, True), (NFT_MSG_DELSETELEM, False))
_ADD_DELETE: tuple[Step, ...] = ((NFT_MSG_NEWSETELEM, False), (NFT_MSG_DELSETELEM, False))
# The revoked sets have no timeouts (nf_tables refuses one there): plain add, which is a
# no-op for an element already in.
_ADD: tuple[Step, ...] = ((NFT_MSG_NEWSETELEM, False),)

Message = tuple[int, str, list[tuple[IPAddress, int | None]]]
"""(NEWSETELEM or DELSETELEM, set name, each address with its timeout in seconds or none)."""


def _by_set(
    entries: Iterable[tuple[IPAddress, int]], names: tuple[str, str]
) -> dict[str, list[tuple[IPAddress, int]]]:
    """Each address once, under names[0] (IPv4) or names[1] (IPv6)."""
    out: dict[str, list[tuple[IPAddress, int]]] = {}
    seen: set[IPAddress] = set()
    for addr, timeout in entries:
        if addr in seen:
            continue
        seen.add(addr)
        name = names[0] if isinstance(addr, ipaddress.IPv4Address) else names[1]
        out.setdefault(name, []).append((addr, timeout))
    return out


def _steps(
    by_set: dict[str, list[tuple[IPAddress, int]]], steps: tuple[Step, ...]
) -> list[Message]:
    """The messages of `steps` for each set in turn (sets in name order)."""
    out: list[Message] = []
    for set_name, elems in sorted(by_set.items()):
        for kind, timed in steps:
            out.append((kind, set_name, [(a, t if timed else None) for a, t in elems]))
    return out


Batch = tuple[bytes, list[int]]
"""The bytes to send and the sequence numbers the kernel will acknowledge."""


def add_batch(
    entries: Iterable[tuple[IPAddress, int]], seq: int, unrevoke: Iterable[IPAddress] = ()
) -> Batch:
    """The batch (sequence numbers from `seq` on) that (re)adds each address with a fresh
    timeout in seconds, and takes each address of `unrevoke` out of the revoked sets."""
    msgs = _steps(_by_set(entries, ALLOWED), _ADD_REFRESH)
    msgs += _steps(_by_set(((a, 0) for a in unrevoke), REVOKED), _ADD_DELETE)
    return _batch(msgs, seq)


def revoke_batch(addrs: Iterable[IPAddress], seq: int) -> Batch:
    """The batch that removes each address from the allowed sets (added first with 1 s) and
    puts it into the revoked ones, in one transaction: there is no instant at which it is in
    neither, when an established flow to it would still pass."""
    addrs = list(addrs)
    msgs = _steps(_by_set(((a, 1) for a in addrs), ALLOWED), _ADD_DELETE_TIMED)
    msgs += _steps(_by_set(((a, 0) for a in addrs), REVOKED), _ADD)
    return _batch(msgs, seq)


def _batch(msgs: list[Message], seq: int) -> Batch:
    """BATCH_BEGIN, the messages, BATCH_END; only the middle ones are acked."""
    if not msgs:
        return b"", []
    res = NFNL_SUBSYS_NFTABLES
    parts = [_message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, socket.AF_UNSPEC, res, b"")]
    acked: list[int] = []
    for kind, set_name, elems in msgs:
        seq += 1
        acked.append(seq)
        parts.append(_elements(kind, set_name, elems, seq))
    parts.append(_message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq + 1, socket.AF_UNSPEC, res, b""))
    return b"".join(parts), acked


def check_acks(data: bytes, waiting: set[int]) -> None:
    """Remove from `waiting` each of its sequence numbers acknowledged in `data`; raise
    OSError with the kernel's errno for a refused one. Answers to other (earlier, timed-out)
    batches are ignored."""
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        size, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if size < _NLMSGHDR.size:
            raise OSError("malformed netlink answer")
        if kind == NLMSG_ERROR and seq in waiting:
            (err,) = struct.unpack_from("=i", data, off + _NLMSGHDR.size)
            if err != 0:
                raise OSError(-err, f"nf_tables refused the set update: {os.strerror(-err)}")
            waiting.discard(seq)
        off += (size + 3) & ~3


class NftSets:
    """The allowed and revoked sets of one container's netns, updated over netlink
    (thread-safe)."""

    def __init__(self, netns_fd_path: str) -> None:
        self._sock = _open_in_netns(netns_fd_path)
        self._sock.settimeout(ACK_TIMEOUT)
        self._seq = int.from_bytes(os.urandom(3), "big")
        self._lock = threading.Lock()
        # The addresses this process may have put into the revoked sets (they are filled by
        # nothing else): only an `add` of one of them needs the extra messages that take it
        # out again, so the usual lookup's batch stays as small as before.
        self._revoked: set[IPAddress] = set()

    def add(self, entries: list[tuple[IPAddress, int]]) -> None:
        """(Re)add each address with its timeout in seconds, no longer revoked if it was;
        returns once the kernel has (in batches of at most BATCH_ADDRESSES)."""
        with self._lock:
            for i in range(0, len(entries), BATCH_ADDRESSES):
                chunk = entries[i : i + BATCH_ADDRESSES]
                back = [a for a, _ in chunk if a in self._revoked]
                data, acked = add_batch(chunk, self._seq, unrevoke=back)
                self._send(data, acked)
                # Only once the kernel took it: after a failure the next add takes them out.
                self._revoked.difference_update(back)

    def revoke(self, addrs: list[IPAddress]) -> None:
        """Take each address out of the allowed sets and refuse every packet to it, of an
        established flow too, until an `add` allows it again; returns once the kernel has
        (in batches of at most BATCH_ADDRESSES, each one atomic)."""
        with self._lock:
            for i in range(0, len(addrs), BATCH_ADDRESSES):
                chunk = addrs[i : i + BATCH_ADDRESSES]
                # Remembered before sending: a batch whose acks did not come may still have
                # been applied, and taking out an address that is not in is harmless.
                self._revoked.update(chunk)
                data, acked = revoke_batch(chunk, self._seq)
                self._send(data, acked)

    def _send(self, data: bytes, acked: list[int]) -> None:
        if not data:
            return
        self._seq = acked[-1] + 2  # past this batch's end message
        self._sock.sendto(data, (0, 0))
        waiting = set(acked)
        while waiting:
            check_acks(self._sock.recv(65536), waiting)

    def close(self) -> None:
        self._sock.close()


def _open_in_netns(path: str) -> socket.socket:
    """A netlink socket created by a thread that joined the netns at `path` (setns moves only
    that thread, which then ends there)."""
    result: dict[str, socket.socket | BaseException] = {}

    def work() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                setns(fd, CLONE_NEWNET)
            finally:
                os.close(fd)
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
            sock.bind((0, 0))
            result["sock"] = sock
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=work, name="nfsets-netns")
    t.start()
    t.join()
    got = result.get("sock")
    if not isinstance(got, socket.socket):
        raise OSError(f"could not open netlink in the container's netns: {result.get('error')}")
    return got
