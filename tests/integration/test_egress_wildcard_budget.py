"""The wildcard budget on real podman, nftables and slirp4netns (root and rootless).

An agent under an allowed `*.wild.test` writes data into new subdomains, each lookup one
message to the zone's servers. The guard lets at most the budget's worth of new names (the
default, 100, here) go upstream in 10 minutes, refuses the next one without asking, keeps
answering the names already asked, and records every new name in the audit chain and the
event stream. The upstream is a DNS server on 127.0.0.1 that answers any name in the zone,
as an attacker's would; the container is made as in test_egress_live.
"""

from __future__ import annotations

import json
import os
import pwd
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from linpodx.egress import guard
from linpodx.egress.state import EgressState
from linpodx.profile.model import Network, Profile
from tests.conftest import ROOTLESS, run_linpodx
from tests.integration.test_egress_live import (
    HOST,
    Stored,
    admin_records,
    bring_up,
    create,
    podman,
    sh,
    wait_for,
)
from tests.servers.dns_upstream import DnsUpstream, Records

pytestmark = pytest.mark.podman

BUDGET = 100  # the default: the profile below does not set it
DENIED = "wildcard budget: 100 new names per 10 minutes, all used"


@pytest.fixture(autouse=True)
def podman_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rootless podman keeps its store under the real HOME (see test_egress_live)."""
    if ROOTLESS:
        monkeypatch.setenv("HOME", pwd.getpwuid(os.getuid()).pw_dir)
        monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)


def zone(name: str, rtype: str) -> Records | None:
    """Every name under wild.test exists (A: this host; no AAAA), like a zone that answers
    whatever it is asked; allowed.test is an exact entry."""
    if name.lower().endswith(".wild.test") or name.lower() == "allowed.test":
        return [(name, "A", HOST)] if rtype == "A" else []
    return None


@pytest.fixture(scope="module")
def upstream() -> Iterator[DnsUpstream]:
    up = DnsUpstream(zone)
    yield up
    up.close()


@pytest.fixture
def container(unique_name: str) -> Iterator[str]:
    yield unique_name
    podman("rm", "-f", "-t", "0", unique_name, check=False)
    guard.detach(unique_name)


def statuses(name: str, lookups: list[str]) -> list[str]:
    """`dig`'s status for each `NAME TYPE [+tcp]` lookup, in one exec."""
    script = "; ".join(
        f"dig +tries=1 +time=5 {q} | grep -o 'status: [A-Z]*' || echo 'status: NONE'"
        for q in lookups
    )
    out = sh(name, script, timeout=300).stdout
    return re.findall(r"status: ([A-Z]+)", out)


def test_past_the_budget_new_names_are_refused_known_ones_resolve_and_all_are_recorded(
    upstream: DnsUpstream, container: str
) -> None:
    net = Network(
        egress_dns_allowlist=("allowed.test", "*.wild.test"),
        upstream_dns=(f"127.0.0.1:{upstream.port}",),
        allow_private_answers=True,  # the zone answers with this host's address
    )
    st = Stored(Profile(name="budget-test", network=net), "budget-test", "prof_TESTbudget", 1)
    create(container, st)
    bring_up(container, st)
    names = [f"n{i}.wild.test" for i in range(1, BUDGET + 1)]

    # 100 new names (every other one over TCP), each followed by a spelling of itself that
    # reaches the upstream as the same name: one hundred names, no more.
    lookups = []
    for i, n in enumerate(names):
        tcp = " +tcp" if i % 2 else ""
        lookups += [f"{n} A{tcp}", f"{n.upper()}. A{tcp}"]
    got = statuses(container, lookups)
    assert got == ["NOERROR"] * len(lookups)

    # The 101st new name: refused at once, over UDP and TCP, and never asked upstream.
    before = len(upstream.asked)
    assert statuses(container, ["n101.wild.test A", "n101.wild.test A +tcp"]) == ["REFUSED"] * 2
    # Data types under the wildcard stay refused too (and would not have counted).
    assert statuses(container, ["n1.wild.test TXT"]) == ["REFUSED"]
    assert upstream.asked[before:] == []

    # Names already asked keep working: from the cache, and upstream for another type.
    ok = sh(container, "getent ahostsv4 n50.wild.test")
    assert ok.returncode == 0 and HOST in ok.stdout
    assert statuses(container, ["n1.wild.test AAAA", "N2.Wild.Test AAAA +tcp"]) == ["NOERROR"] * 2
    assert upstream.asked[before:] == [("n1.wild.test", "AAAA"), ("n2.wild.test", "AAAA")]
    # An exact entry is never counted.
    assert statuses(container, ["allowed.test A"]) == ["NOERROR"]
    asked = {n.lower() for n, _ in upstream.asked}
    assert "n101.wild.test" not in asked and set(names) <= asked

    # The refusal is an event and a record, naming the budget.
    ev = run_linpodx("events", "--no-follow")
    assert ev.returncode == 0, ev.stderr
    assert f"dns lookup denied for n101.wild.test (A, {DENIED})" in ev.stdout
    assert "dns lookup of new name n1.wild.test under *.wild.test (1 of 100 per 10 minutes)" in (
        ev.stdout
    )
    denied = [r["data"] for r in admin_records("dns.denied") if r["data"].get("reason") == DENIED]
    assert denied and denied[0]["name"] == "n101.wild.test"
    assert denied[0]["container"] == container

    # Every new name is in the audit chain exactly once: one by one, then in summaries
    # (written at the latest when the guard stops).
    gpid = json.loads(EgressState(container).guard_file.read_text())["guard_pid"]
    podman("stop", "-t", "0", container)
    assert wait_for(lambda: not Path(f"/proc/{gpid}").exists(), timeout=30)

    def recorded() -> list[str]:
        out: list[str] = []
        for r in admin_records("dns.wildcard"):
            d = r["data"]
            assert d["container"] == container
            out += [d["name"]] if "name" in d else d["names"]
        return out

    assert wait_for(lambda: len(recorded()) >= BUDGET)
    assert sorted(recorded()) == sorted(names)
    one_by_one = [r["data"] for r in admin_records("dns.wildcard") if "name" in r["data"]]
    assert one_by_one[0] == {
        "container": container,
        "name": "n1.wild.test",
        "wildcard": "*.wild.test",
        "used": 1,
        "budget": 100,
        "message": "dns lookup of new name n1.wild.test under *.wild.test (1 of 100 per 10 "
        "minutes)",
    }
    assert any("names" in r["data"] for r in admin_records("dns.wildcard"))  # summarised

    # A new start of the container is a new guard, and a new window.
    bring_up(container, st)
    assert statuses(container, ["n101.wild.test A"]) == ["NOERROR"]


BURST = r"""
import os, socket, struct, threading
def ask(i):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(10)
    name = b"".join(bytes([len(p)]) + p for p in (b"k%d" % i, b"wild", b"test")) + b"\0"
    s.sendto(os.urandom(2) + struct.pack("!HHHHH", 0x0100, 1, 0, 0, 0) + name
             + struct.pack("!HH", 1, 1), ("127.0.0.1", 53))
    s.recv(512)
ts = [threading.Thread(target=ask, args=(i,)) for i in range(100)]
[t.start() for t in ts]
[t.join() for t in ts]
print("done")
"""


def test_every_name_that_left_is_recorded_even_if_the_guard_is_killed_right_after(
    upstream: DnsUpstream, container: str
) -> None:
    """Names past the one-by-one bound are summarised; their summary is written before
    they go upstream, so a guard killed (-9: no flush) right after a burst lost none."""
    net = Network(
        egress_dns_allowlist=("*.wild.test",),
        upstream_dns=(f"127.0.0.1:{upstream.port}",),
        allow_private_answers=True,
    )
    st = Stored(Profile(name="budget-kill", network=net), "budget-kill", "prof_TESTbkill", 1)
    create(container, st)
    bring_up(container, st)
    before = len(upstream.asked)
    out = sh(container, f"python3 -c '{BURST}'", timeout=120)
    assert out.stdout.strip() == "done", out.stderr
    left = {n.lower() for n, _ in upstream.asked[before:]}
    assert left == {f"k{i}.wild.test" for i in range(100)}
    gpid = json.loads(EgressState(container).guard_file.read_text())["guard_pid"]
    os.kill(gpid, 9)
    assert wait_for(lambda: not Path(f"/proc/{gpid}").exists(), timeout=30)
    recorded: list[str] = []
    for r in admin_records("dns.wildcard"):
        d = r["data"]
        if d["container"] == container:
            recorded += [d["name"]] if "name" in d else d["names"]
    assert sorted(recorded) == sorted(left)
