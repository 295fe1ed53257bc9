"""The allowed sets' netlink batches: their layout, and (as root) what the kernel makes of them
in a throwaway network namespace.

Addresses are data only: nothing here sends a packet anywhere.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from linpodx.egress import nfsets
from linpodx.egress.netns import load_ruleset, netns_path
from linpodx.egress.ruleset import build_ruleset

V4 = ipaddress.ip_address("203.0.113.7")
V6 = ipaddress.ip_address("2001:db8::1")


def messages(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, seq, payload after the nfgenmsg) of each netlink message."""
    out = []
    off = 0
    while off < len(data):
        size, kind, flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
        out.append((kind, flags, seq, data[off + 20 : off + size]))
        off += (size + 3) & ~3
    return out


def attrs(payload: bytes) -> list[tuple[int, bytes]]:
    out = []
    off = 0
    while off + 4 <= len(payload):
        size, kind = struct.unpack_from("=HH", payload, off)
        out.append((kind & ~nfsets.NLA_F_NESTED, payload[off + 4 : off + size]))
        off += (size + 3) & ~3
    return out


def elements(payload: bytes) -> list[tuple[bytes, int | None]]:
    """(key bytes, timeout ms) of each element in a set-element message."""
    top = dict(attrs(payload))
    out = []
    for _kind, elem in attrs(top[nfsets.NFTA_SET_ELEM_LIST_ELEMENTS]):
        fields = dict(attrs(elem))
        key = dict(attrs(fields[nfsets.NFTA_SET_ELEM_KEY]))[nfsets.NFTA_DATA_VALUE]
        tmo = fields.get(nfsets.NFTA_SET_ELEM_TIMEOUT)
        out.append((key, struct.unpack("!Q", tmo)[0] if tmo else None))
    return out


def test_add_batch_readds_each_address_with_its_timeout_per_family() -> None:
    data, acked = nfsets.add_batch([(V4, 60), (V6, 3600), (V4, 60)], seq=100)
    msgs = messages(data)
    assert msgs[0][0] == nfsets.NFNL_MSG_BATCH_BEGIN and msgs[0][2] == 100
    assert msgs[-1][0] == nfsets.NFNL_MSG_BATCH_END and msgs[-1][2] == 107
    body = msgs[1:-1]
    assert [m[2] for m in body] == acked == list(range(101, 107))
    kinds = [m[0] & 0xFF for m in body]
    new, dele = nfsets.NFT_MSG_NEWSETELEM, nfsets.NFT_MSG_DELSETELEM
    assert kinds == [new, dele, new, new, dele, new]
    assert all(m[0] >> 8 == nfsets.NFNL_SUBSYS_NFTABLES for m in body)
    assert all(m[1] & nfsets.NLM_F_ACK for m in body)
    sets = [dict(attrs(m[3]))[nfsets.NFTA_SET_ELEM_LIST_SET] for m in body]
    assert sets == [b"allowed4\0"] * 3 + [b"allowed6\0"] * 3
    assert elements(body[0][3]) == [(V4.packed, 60_000)]  # the duplicate went once
    assert elements(body[1][3]) == [(V4.packed, None)]
    assert elements(body[5][3]) == [(V6.packed, 3_600_000)]


def kinds_and_sets(data: bytes) -> list[tuple[int, bytes]]:
    """(NEWSETELEM or DELSETELEM, set name) of each message between BEGIN and END."""
    return [
        (m[0] & 0xFF, dict(attrs(m[3]))[nfsets.NFTA_SET_ELEM_LIST_SET])
        for m in messages(data)[1:-1]
    ]


NEW, DEL = nfsets.NFT_MSG_NEWSETELEM, nfsets.NFT_MSG_DELSETELEM


def test_revoke_batch_moves_each_address_to_the_revoked_sets_in_one_transaction() -> None:
    data, acked = nfsets.revoke_batch([V4, V6, V4], seq=7)
    msgs = messages(data)
    assert msgs[0][0] == nfsets.NFNL_MSG_BATCH_BEGIN and msgs[-1][0] == nfsets.NFNL_MSG_BATCH_END
    assert len(msgs) == 8 and acked == list(range(8, 14))  # one batch: applied all at once
    assert kinds_and_sets(data) == [
        (NEW, b"allowed4\0"),  # added first with 1 s, so a lapsed one cannot fail the delete
        (DEL, b"allowed4\0"),
        (NEW, b"allowed6\0"),
        (DEL, b"allowed6\0"),
        (NEW, b"revoked4\0"),
        (NEW, b"revoked6\0"),
    ]
    body = msgs[1:-1]
    assert elements(body[0][3]) == [(V4.packed, 1000)]  # the duplicate went once
    assert elements(body[1][3]) == [(V4.packed, None)]
    # The revoked sets have no timeouts: an element with one would be refused.
    assert elements(body[4][3]) == [(V4.packed, None)]
    assert elements(body[5][3]) == [(V6.packed, None)]
    assert nfsets.revoke_batch([], seq=1) == (b"", [])


def test_add_batch_can_take_addresses_out_of_the_revoked_sets_too() -> None:
    data, acked = nfsets.add_batch([(V4, 60), (V6, 30)], seq=40, unrevoke=[V4])
    assert acked == list(range(41, 49))
    assert kinds_and_sets(data) == [
        (NEW, b"allowed4\0"),
        (DEL, b"allowed4\0"),
        (NEW, b"allowed4\0"),
        (NEW, b"allowed6\0"),
        (DEL, b"allowed6\0"),
        (NEW, b"allowed6\0"),
        (NEW, b"revoked4\0"),  # added first: the delete cannot fail on a missing element
        (DEL, b"revoked4\0"),
    ]
    body = messages(data)[1:-1]
    assert elements(body[2][3]) == [(V4.packed, 60_000)]
    assert elements(body[6][3]) == elements(body[7][3]) == [(V4.packed, None)]
    # Nothing revoked: the very batch of before, no message for the revoked sets.
    assert nfsets.add_batch([(V4, 60)], seq=1) == nfsets.add_batch([(V4, 60)], seq=1, unrevoke=[])
    assert nfsets.add_batch([], seq=1) == (b"", [])


class AckingSocket:
    """Stands in for the netlink socket: keeps what was sent, acknowledges every message."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.answer = b""

    def sendto(self, data: bytes, _addr: object) -> None:
        self.sent.append(data)
        self.answer = b"".join(ack(m[2], 0) for m in messages(data)[1:-1])

    def recv(self, _size: int) -> bytes:
        return self.answer


def fake_sets() -> tuple[nfsets.NftSets, AckingSocket]:
    sets = nfsets.NftSets.__new__(nfsets.NftSets)
    sock = AckingSocket()
    sets._sock = sock  # type: ignore[assignment]
    sets._seq = 1
    sets._lock = threading.Lock()
    sets._revoked = set()
    return sets, sock


def test_nftsets_unrevokes_what_it_revoked_when_it_is_added_again() -> None:
    sets, sock = fake_sets()
    sets.add([(V4, 60)])
    assert {n for _, n in kinds_and_sets(sock.sent[-1])} == {b"allowed4\0"}
    sets.revoke([V4])
    assert (NEW, b"revoked4\0") in kinds_and_sets(sock.sent[-1])
    sets.add([(V4, 60), (V6, 60)])  # granted again by a new lookup
    assert kinds_and_sets(sock.sent[-1])[-2:] == [(NEW, b"revoked4\0"), (DEL, b"revoked4\0")]
    assert len(sock.sent) == 3  # in the same batch as the add
    sets.add([(V4, 60)])  # no longer revoked: back to the plain add
    assert {n for _, n in kinds_and_sets(sock.sent[-1])} == {b"allowed4\0"}


def ack(seq: int, err: int) -> bytes:
    return (
        struct.pack("=IHHII", 36, nfsets.NLMSG_ERROR, 0, seq, 0)
        + struct.pack("=i", err)
        + (b"\0" * 16)
    )


def test_acks_and_refusals() -> None:
    waiting = {5, 6}
    nfsets.check_acks(ack(5, 0) + ack(99, -2), waiting)  # 99: an older batch, ignored
    assert waiting == {6}
    with pytest.raises(OSError) as err:
        nfsets.check_acks(ack(6, -2), waiting)
    assert err.value.errno == 2


@pytest.fixture
def netns_pid() -> Iterator[int]:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and util-linux unshare")
    proc = subprocess.Popen(["unshare", "-n", "sleep", "60"])
    try:
        for _ in range(100):
            if os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.02)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def listed(pid: int) -> str:
    nft = shutil.which("nft") or "/usr/sbin/nft"
    return subprocess.run(
        ["nsenter", f"--net={netns_path(pid)}", nft, "list", "table", "inet", "linpodx_egress"],
        capture_output=True,
        text=True,
        check=True,
        timeout=20,
    ).stdout


def test_the_kernel_takes_the_batches(netns_pid: int) -> None:
    load_ruleset(netns_pid, build_ruleset())
    sets = nfsets.NftSets(netns_path(netns_pid))
    never = ipaddress.ip_address("198.51.100.1")
    try:
        sets.add([(V4, 60), (V6, 3600)])
        sets.add([(V4, 1000)])  # refreshed: the timeout is the new one
        text = listed(netns_pid)
        assert "203.0.113.7 timeout 16m40s" in text and "2001:db8::1 timeout 1h" in text
        sets.revoke([V4, V6, never])  # the third was never there
        text = listed(netns_pid)
        assert "elements" not in set_text(text, "allowed4") + set_text(text, "allowed6")
        for addr, name in ((V4, "revoked4"), (V6, "revoked6"), (never, "revoked4")):
            assert str(addr) in set_text(text, name)
        sets.revoke([V4])  # again: already revoked, already not allowed, still fine
        sets.add([(V4, 60)])  # granted again
        text = listed(netns_pid)
        assert "203.0.113.7 timeout 1m" in set_text(text, "allowed4")
        assert "203.0.113.7" not in set_text(text, "revoked4")
        assert "198.51.100.1" in set_text(text, "revoked4")  # the others stay revoked
        load_ruleset(netns_pid, "delete table inet linpodx_egress\n")
        with pytest.raises(OSError):
            sets.add([(V4, 60)])  # no set: refused, never silently ignored
    finally:
        sets.close()


def set_text(listing: str, name: str) -> str:
    """The part of `nft list table` output that describes set `name`."""
    start = listing.index(f"set {name} {{")
    end = listing.find("\n\t}", start)
    return listing[start:end]


def test_thousands_of_addresses_go_in_batches_that_fit(netns_pid: int) -> None:
    """One message carries a set's elements in one attribute with a 16-bit length (~2,300
    addresses), and a batch must fit the socket's send buffer: a revoke of thousands of
    addresses (a long-lived container behind a wildcard) must not fail on either."""
    load_ruleset(netns_pid, build_ruleset())
    sets = nfsets.NftSets(netns_path(netns_pid))
    many: list[Any] = [ipaddress.ip_address(f"10.{i // 256}.{i % 256}.1") for i in range(3000)]
    many += [ipaddress.ip_address(f"2001:db8::{i:x}") for i in range(3000)]
    try:
        sets.add([(a, 600) for a in many])
        text = listed(netns_pid)
        assert "10.11.183.1" in set_text(text, "allowed4")  # the 3000th
        sets.revoke(many)
        text = listed(netns_pid)
        assert "elements" not in set_text(text, "allowed4") + set_text(text, "allowed6")
        assert "10.11.183.1" in set_text(text, "revoked4")
        assert "2001:db8::bb7" in set_text(text, "revoked6")
        sets.add([(a, 600) for a in many])  # all granted again
        text = listed(netns_pid)
        assert "elements" not in set_text(text, "revoked4") + set_text(text, "revoked6")
    finally:
        sets.close()
