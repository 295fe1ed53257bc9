"""The wildcard budget: the pure counter, the resolver's use of it, and its records.

The resolver runs with the hand-written fake upstream and fake nft sets of
`test_egress_resolver`; nothing here sends a packet anywhere but to the loopback sockets of
the TCP/UDP test, which this test itself serves.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rcode
import pytest

from linpodx.egress import budget, runner
from linpodx.egress.budget import WildcardBudget
from linpodx.egress.denials import SUMMARY_NAMES, DenialRecorder
from linpodx.egress.policy import Allowlist
from linpodx.egress.resolver import PolicyResolver, ResolverPolicy, serve_tcp, serve_udp
from tests.unit.test_egress_resolver import Clock, FakeSets, FakeUpstream, ask


class Tick:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


# -- the counter ---------------------------------------------------------------------------
def test_budget_admits_n_new_names_then_refuses_new_ones_only() -> None:
    clock = Tick()
    b = WildcardBudget(clock=clock)
    for i in range(100):
        got = b.admit(f"n{i}.example.com", 100)
        assert got.allowed and got.new and got.used == i + 1
    over = b.admit("n100.example.com", 100)
    assert not over.allowed and not over.new and over.used == 100 and over.budget == 100
    again = b.admit("n7.example.com", 100)  # a repeat in the window costs nothing
    assert again.allowed and not again.new and again.used == 100
    assert b.used() == 100


def test_the_window_slides_and_a_repeat_starts_the_name_s_window_again() -> None:
    clock = Tick()
    b = WildcardBudget(clock=clock)
    assert b.admit("a.example.com", 2).new
    clock.t = 100
    assert b.admit("b.example.com", 2).new
    clock.t = 500
    assert not b.admit("a.example.com", 2).new  # repeat: a's window starts again at 500
    assert not b.admit("c.example.com", 2).allowed
    clock.t = 699.9
    assert not b.admit("c.example.com", 2).allowed  # b is 599.9 s old: still in
    clock.t = 700
    got = b.admit("c.example.com", 2)  # b left the window (600 s), a has not
    assert got.allowed and got.new and got.used == 2
    assert not b.admit("d.example.com", 2).allowed
    clock.t = 1100
    assert b.admit("d.example.com", 2).new  # a (last asked at 500) left now
    # b was forgotten when it left: asked again, it is new again (and costs).
    assert not b.admit("b.example.com", 2).allowed


def test_no_span_of_ten_minutes_lets_more_than_the_budget_through() -> None:
    """Whatever the order of new names and repeats, count admissions per sliding window."""
    rng = random.Random(21)  # noqa: S311 - a fixed, replayable order of lookups
    clock = Tick()
    b = WildcardBudget(clock=clock)
    admitted: list[float] = []
    for step in range(5000):
        clock.t += rng.expovariate(1 / 15)
        pick = rng.random()
        name = f"r{rng.randrange(40)}.example.com" if pick < 0.6 else f"f{step}.example.com"
        got = b.admit(name, 10)
        if got.new:
            admitted.append(clock.t)
        assert b.used() <= 10  # memory: never more names than the budget
    for i, start in enumerate(admitted):
        in_window = [t for t in admitted[i:] if t < start + budget.WINDOW]
        assert len(in_window) <= 10, start
    assert len(admitted) > 50  # the window did move on many times


def test_spellings_of_one_name_count_once() -> None:
    b = WildcardBudget(clock=Tick())
    assert b.admit("Mixed.Example.COM.", 1).new
    assert b.admit("mixed.example.com", 1).allowed
    assert not b.admit("other.example.com", 1).allowed


def test_a_lowered_budget_admits_nothing_new_until_the_window_drains() -> None:
    clock = Tick()
    b = WildcardBudget(clock=clock)
    for i in range(5):
        assert b.admit(f"n{i}.example.com", 5).new
    assert not b.admit("x.example.com", 3).allowed
    assert b.admit("n0.example.com", 3).allowed  # names already in keep working
    clock.t = 601
    assert b.admit("x.example.com", 3).new


def test_forget_gives_the_place_back() -> None:
    b = WildcardBudget(clock=Tick())
    b.admit("a.example.com", 1)
    b.forget("A.example.com.")
    assert b.admit("b.example.com", 1).new


def test_window_text() -> None:
    assert budget.window_text() == "10 minutes"
    assert budget.window_text(60) == "1 minute"
    assert budget.window_text(90) == "90 seconds"


# -- which names count -----------------------------------------------------------------------
def test_wildcard_for_names_only_what_a_wildcard_alone_allows() -> None:
    a = Allowlist.from_entries(["api.example.com", "*.example.com", "*.deep.example.com"])
    assert a.wildcard_for("api.example.com") is None  # exact: never counted
    assert a.wildcard_for("API.Example.com.") is None
    assert a.wildcard_for("x.example.com") == "*.example.com"
    assert a.wildcard_for("x.deep.example.com") == "*.deep.example.com"  # most specific
    assert a.wildcard_for("example.com") is None  # the apex is not allowed by the wildcard
    assert a.wildcard_for("badexample.com") is None
    assert a.wildcard_for("x.other.test") is None
    assert a.wildcard_for("") is None


# -- the resolver --------------------------------------------------------------------------
WILD: dict[str, Any] = {
    "api.example.com": [("api.example.com", "A", 300, "9.9.9.40")],
    "crates.io": [("crates.io", "A", 300, "9.9.9.10")],
    "chain.example.com": [
        ("chain.example.com", "CNAME", 300, "hop.example.com."),
        ("hop.example.com", "A", 300, "9.9.9.41"),
    ],
}


class WildUpstream(FakeUpstream):
    """Every name under example.com exists (an attacker's zone answers anything)."""

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        name = query.question[0].name.to_text(omit_final_dot=True).lower()
        if name.endswith(".example.com") and name not in self.table and "nx" not in name:
            self.table[name] = [(name, "A", 300, "9.9.9.50")]
        return super().answer(query)


def make_budgeted(
    n: int,
    allow: tuple[str, ...] = ("crates.io", "api.example.com", "*.example.com"),
    sink: Any = None,
) -> tuple[PolicyResolver, WildUpstream, list[tuple[str, dict[str, Any]]], Clock, DenialRecorder]:
    up = WildUpstream(dict(WILD))
    records: list[tuple[str, dict[str, Any]]] = []
    clock = Clock()
    rec = DenialRecorder("c1", sink or (lambda k, d: records.append((k, d))), clock=clock)
    pol = ResolverPolicy(
        Allowlist.from_entries(allow), (("127.0.0.1", 53),), False, wildcard_budget=n
    )
    sets = FakeSets()
    r = PolicyResolver(
        pol,
        add_to_sets=sets.add,
        revoke_in_sets=sets.revoke,
        on_denied=rec.deny,
        on_new_name=rec.new_name,
        upstream=up,
        clock=clock,
    )
    return r, up, records, clock, rec


def budget_denials(records: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [d for k, d in records if k == "dns.denied" and "budget" in d.get("reason", "")]


def test_past_the_budget_a_new_name_is_refused_never_asked_and_recorded() -> None:
    r, up, records, clock, _ = make_budgeted(3)
    for i in range(3):
        assert ask(r, f"n{i}.example.com").rcode() == dns.rcode.NOERROR
    over = ask(r, "n3.example.com")
    assert over.rcode() == dns.rcode.REFUSED and not over.answer
    assert ("n3.example.com", "A") not in up.asked
    [denial] = budget_denials(records)
    assert denial["name"] == "n3.example.com"
    assert denial["reason"] == "wildcard budget: 3 new names per 10 minutes, all used"
    assert denial["message"] == "dns lookup denied for n3.example.com"
    # Refused, not remembered: each new lookup is judged again (and stays refused).
    assert ask(r, "n3.example.com").rcode() == dns.rcode.REFUSED
    # Names already asked keep working: from the cache, and upstream once it lapsed.
    assert ask(r, "n1.example.com").rcode() == dns.rcode.NOERROR
    clock.t += 301
    before = len(up.asked)
    assert ask(r, "n1.example.com").rcode() == dns.rcode.NOERROR
    assert up.asked[before:] == [("n1.example.com", "A")]
    # A and AAAA of one name are one name.
    assert ask(r, "n2.example.com", "AAAA").rcode() == dns.rcode.NOERROR
    assert ("n2.example.com", "AAAA") in up.asked
    # Ten minutes after n0 and n2 were last asked, there is room again.
    clock.t += 600
    assert ask(r, "n3.example.com").rcode() == dns.rcode.NOERROR


def test_exact_names_are_never_counted_and_never_refused_by_it() -> None:
    r, _up, records, _clock, _ = make_budgeted(1)
    assert ask(r, "n0.example.com").rcode() == dns.rcode.NOERROR
    assert ask(r, "n1.example.com").rcode() == dns.rcode.REFUSED
    for name in ("crates.io", "api.example.com", "API.example.com"):
        assert ask(r, name).rcode() == dns.rcode.NOERROR, name
    assert not [d for k, d in records if k == "dns.wildcard" and d.get("name") == "crates.io"]


def test_spellings_that_reach_the_upstream_as_one_name_count_once() -> None:
    r, up, _records, _clock, _ = make_budgeted(1)
    assert ask(r, "Mixed.Example.COM").rcode() == dns.rcode.NOERROR
    for spelled in ("mixed.example.com.", "MIXED.example.com", "\\109ixed.example.com"):
        resp = ask(r, spelled, "AAAA" if spelled.startswith("M") else "A")
        assert resp.rcode() == dns.rcode.NOERROR, spelled
    assert ask(r, "mixed2.example.com").rcode() == dns.rcode.REFUSED
    assert {n for n, _ in up.asked} == {"mixed.example.com"}


def test_names_refused_for_other_reasons_cost_nothing() -> None:
    r, up, _records, _clock, _ = make_budgeted(1)
    assert ask(r, "data.example.com", "TXT").rcode() == dns.rcode.REFUSED
    assert ask(r, "nope.other.test").rcode() == dns.rcode.NXDOMAIN
    odd = dns.message.make_query("a\\032b.example.com", "A")  # an escaped space
    out = r.handle(odd.to_wire())
    assert out is not None and dns.message.from_wire(out).rcode() == dns.rcode.REFUSED
    assert up.asked == []
    assert ask(r, "real.example.com").rcode() == dns.rcode.NOERROR  # the one place is still free
    assert ask(r, "more.example.com").rcode() == dns.rcode.REFUSED  # and now it is taken


def test_txt_and_other_data_types_under_a_wildcard_are_refused_and_never_asked() -> None:
    r, up, records, _clock, _ = make_budgeted(100)
    for rtype in ("TXT", "NULL", "MX", "SRV", "HTTPS", "SVCB", "CNAME", "ANY", "PTR", "CAA"):
        resp = ask(r, f"x{rtype.lower()}.example.com", rtype)
        assert resp.rcode() == dns.rcode.REFUSED and not resp.answer, rtype
    assert up.asked == []
    assert not [k for k, _ in records if k == "dns.wildcard"]


def test_a_name_is_counted_when_it_is_asked_whatever_the_answer() -> None:
    """The name has left once it is asked: an NXDOMAIN (the zone decides what it answers)
    counts as much as an address."""
    r, up, _records, _clock, _ = make_budgeted(2)
    assert ask(r, "nx1.example.com").rcode() == dns.rcode.NXDOMAIN
    assert ask(r, "nx2.example.com").rcode() == dns.rcode.NXDOMAIN
    assert ask(r, "nx3.example.com").rcode() == dns.rcode.REFUSED
    assert [n for n, _ in up.asked] == ["nx1.example.com", "nx2.example.com"]


def test_a_cname_chain_costs_the_name_asked_only() -> None:
    r, _up, records, _clock, _ = make_budgeted(2)
    resp = ask(r, "chain.example.com")
    assert resp.rcode() == dns.rcode.NOERROR and len(resp.answer) == 2
    new = [d["name"] for k, d in records if k == "dns.wildcard"]
    assert new == ["chain.example.com"]
    assert ask(r, "other.example.com").rcode() == dns.rcode.NOERROR


def test_each_new_name_is_recorded_once_before_it_is_asked() -> None:
    seen_upstream: list[str] = []

    def sink(kind: str, data: dict[str, Any]) -> None:
        if kind == "dns.wildcard":
            # Recorded before the upstream hears of it.
            assert (data["name"], "A") not in seen_upstream
        records.append((kind, data))

    records: list[tuple[str, dict[str, Any]]] = []
    r, up, _unused, _clock, _ = make_budgeted(5, sink=sink)
    for name in ("a.example.com", "b.example.com", "a.example.com"):
        ask(r, name)
        seen_upstream[:] = up.asked
    ask(r, "b.example.com", "AAAA")
    new = [d for k, d in records if k == "dns.wildcard"]
    assert [(d["name"], d["wildcard"], d["used"], d["budget"]) for d in new] == [
        ("a.example.com", "*.example.com", 1, 5),
        ("b.example.com", "*.example.com", 2, 5),
    ]
    assert new[1]["message"] == (
        "dns lookup of new name b.example.com under *.example.com (2 of 5 per 10 minutes)"
    )
    assert new[0]["container"] == "c1"


def test_the_other_type_of_a_new_name_waits_for_its_record_before_going_upstream() -> None:
    """getaddrinfo sends A and AAAA together: the AAAA (not new: A admitted the name) must
    not reach the upstream before the name's record is written, nor at all if it fails."""
    writing = threading.Event()
    release = threading.Event()
    outcome = {"fail": False}

    def sink(kind: str, data: dict[str, Any]) -> None:
        if kind == "dns.wildcard":
            writing.set()
            assert release.wait(10)
            if outcome["fail"]:
                raise OSError("disk full")

    for fail in (False, True):
        writing.clear()
        release.clear()
        outcome["fail"] = fail
        r, up, _records, _clock, _rec = make_budgeted(10, sink=sink)
        got: dict[str, int] = {}

        def look(rtype: str, r: PolicyResolver = r, got: dict[str, int] = got) -> None:
            got[rtype] = ask(r, "pair.example.com", rtype).rcode()

        a = threading.Thread(target=look, args=("A",))
        a.start()
        assert writing.wait(10)  # A's record is being written
        aaaa = threading.Thread(target=look, args=("AAAA",))
        aaaa.start()
        aaaa.join(0.5)
        assert up.asked == [] and got == {}  # AAAA waits, nothing has gone upstream
        release.set()
        a.join(10)
        aaaa.join(10)
        if fail:
            assert got == {"A": dns.rcode.REFUSED, "AAAA": dns.rcode.REFUSED}
            assert up.asked == []
        else:
            assert got == {"A": dns.rcode.NOERROR, "AAAA": dns.rcode.NOERROR}
            assert sorted(up.asked) == [("pair.example.com", "A"), ("pair.example.com", "AAAA")]


def test_a_large_budget_s_names_are_not_re_asked_before_their_answers_lapse() -> None:
    """With a budget above half the resolver's cache, the names in the window (A and AAAA)
    overflowed it, and a full cache was emptied: every repeat then went upstream again at
    once, as often as the agent liked (a channel as wide as the upstream's query rate)."""
    n = 4500  # more than 4096 (A only: AAAA would fill the negative memory the same way)
    r, up, _records, clock, _rec = make_budgeted(n, sink=lambda k, d: None)
    for _ in range(2):
        for i in range(n):
            assert ask(r, f"w{i}.example.com").rcode() == dns.rcode.NOERROR
        clock.t += 1
    assert len(up.asked) == n  # each name once, the repeats from memory


def test_a_new_name_that_cannot_be_recorded_is_refused_and_costs_nothing() -> None:
    fail = {"on": True}
    records: list[tuple[str, dict[str, Any]]] = []

    def sink(kind: str, data: dict[str, Any]) -> None:
        if fail["on"] and kind == "dns.wildcard":
            raise OSError("disk full")
        records.append((kind, data))

    r, up, _unused, _clock, _ = make_budgeted(1, sink=sink)
    assert ask(r, "a.example.com").rcode() == dns.rcode.REFUSED
    assert up.asked == []
    assert records[-1][1]["reason"] == "the new name could not be recorded"
    fail["on"] = False
    assert ask(r, "b.example.com").rcode() == dns.rcode.NOERROR  # its place was given back


def test_a_policy_change_keeps_the_window_and_applies_its_budget() -> None:
    r, _up, _records, _clock, _ = make_budgeted(2)
    ask(r, "a.example.com")
    ask(r, "b.example.com")
    assert ask(r, "c.example.com").rcode() == dns.rcode.REFUSED
    same = ResolverPolicy(r.policy.allowlist, r.policy.upstreams, False, wildcard_budget=2)
    r.set_policy(same)  # a re-apply is no fresh budget
    assert ask(r, "c.example.com").rcode() == dns.rcode.REFUSED
    wider = ResolverPolicy(r.policy.allowlist, r.policy.upstreams, False, wildcard_budget=3)
    r.set_policy(wider)
    assert ask(r, "c.example.com").rcode() == dns.rcode.NOERROR
    assert ask(r, "d.example.com").rcode() == dns.rcode.REFUSED


@pytest.fixture
def served() -> Iterator[tuple[tuple[str, int], tuple[str, int], WildUpstream]]:
    """The resolver behind real loopback UDP and TCP sockets (as the guard serves it)."""
    r, up, _records, _clock, _ = make_budgeted(2)
    stop = threading.Event()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    for target, sock in ((serve_udp, udp), (serve_tcp, tcp)):
        threading.Thread(target=target, args=(sock, r, stop), daemon=True).start()
    yield udp.getsockname(), tcp.getsockname(), up
    stop.set()
    udp.close()
    tcp.close()


def test_udp_and_tcp_lookups_share_one_budget(
    served: tuple[tuple[str, int], tuple[str, int], WildUpstream],
) -> None:
    (uh, up_port), (th, tp), up = served

    def udp(name: str, rtype: str = "A") -> int:
        return dns.query.udp(dns.message.make_query(name, rtype), uh, 3, port=up_port).rcode()

    def tcp(name: str, rtype: str = "A") -> int:
        return dns.query.tcp(dns.message.make_query(name, rtype), th, 3, port=tp).rcode()

    assert udp("one.example.com") == dns.rcode.NOERROR
    assert tcp("two.example.com") == dns.rcode.NOERROR
    assert tcp("three.example.com") == dns.rcode.REFUSED
    assert udp("three.example.com") == dns.rcode.REFUSED
    assert tcp("one.example.com", "AAAA") == dns.rcode.NOERROR  # known over UDP
    assert ("three.example.com", "A") not in up.asked


# -- the policy file -------------------------------------------------------------------------
def test_the_policy_file_s_budget_is_checked_again() -> None:
    assert runner.wildcard_budget({}) == budget.DEFAULT_BUDGET  # a file from before it existed
    assert runner.wildcard_budget({"wildcard_budget": 1}) == 1
    assert runner.wildcard_budget({"wildcard_budget": 10000}) == 10000
    for bad in (0, -1, 10001, True, "100", 1.0, None):
        with pytest.raises(ValueError):
            runner.wildcard_budget({"wildcard_budget": bad})


def test_defaults_agree_everywhere() -> None:
    from linpodx.egress.resolver import ResolverPolicy as RP
    from linpodx.podman import flags
    from linpodx.profile import loader
    from linpodx.profile.model import Network

    node = loader.schema()["properties"]["network"]["properties"]["wildcard_budget"]
    assert node["default"] == Network().wildcard_budget == budget.DEFAULT_BUDGET
    assert flags.WILDCARD_BUDGET_DEFAULT == budget.DEFAULT_BUDGET
    assert RP(Allowlist.from_entries([]), (), False).wildcard_budget == budget.DEFAULT_BUDGET
    assert (node["minimum"], node["maximum"]) == (1, budget.MAX_BUDGET)


# -- the records -----------------------------------------------------------------------------
def test_new_names_past_the_bound_are_listed_in_a_summary_written_before_they_go_on() -> None:
    out: list[tuple[str, dict[str, Any]]] = []
    clock = Tick()
    rec = DenialRecorder("c", lambda k, d: out.append((k, d)), max_records=3, clock=clock)
    for i in range(10):
        assert rec.new_name(f"n{i}.example.com", "*.example.com", i + 1, 100, "10 minutes")
        # Recorded before new_name returns, i.e. before the lookup goes upstream: a guard
        # killed right after it has left no name out of the chain.
        listed = [n for _, d in out for n in ([d["name"]] if "name" in d else d["names"])]
        assert listed == [f"n{j}.example.com" for j in range(i + 1)]
    assert [d["name"] for _, d in out[:3]] == [f"n{i}.example.com" for i in range(3)]
    kind, summary = out[3]
    assert kind == "dns.wildcard" and summary["suppressed"] == 1
    assert summary["names"] == ["n3.example.com"]
    assert summary["message"] == (
        "1 more new names looked up under wildcards (listed in the record, not one by one)"
    )
    clock.t = 60
    rec.tick()
    assert len(out) == 10  # nothing was left waiting
    rec.new_name("late.example.com", "*.example.com", 11, 100, "10 minutes")
    assert out[10][1]["name"] == "late.example.com"  # a new minute: one by one again


def test_names_arriving_during_a_write_share_the_next_summary() -> None:
    """A group commit: a burst past the bound costs a few writes, not one per name, and
    each name still waits for the write that carries it."""
    out: list[tuple[str, dict[str, Any]]] = []
    first_write = threading.Event()
    release = threading.Event()

    def sink(kind: str, data: dict[str, Any]) -> None:
        if not first_write.is_set():
            first_write.set()
            assert release.wait(10)
        out.append((kind, data))

    rec = DenialRecorder("c", sink, max_records=0, clock=Tick())
    done: dict[str, bool] = {}

    def look(name: str) -> None:
        done[name] = rec.new_name(name, "*.example.com", 1, 100, "10 minutes")

    first = threading.Thread(target=look, args=("a.example.com",))
    first.start()
    assert first_write.wait(10)  # a's summary is being written (and stays so for now)
    rest = [threading.Thread(target=look, args=(f"b{i}.example.com",)) for i in range(20)]
    for t in rest:
        t.start()
    deadline = time.monotonic() + 10
    while len(rec._waiting.names) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == {}  # nobody went on before its record was written
    release.set()
    for t in [first, *rest]:
        t.join(10)
    assert len(done) == 21 and all(done.values())
    assert len(out) == 2 and out[0][1]["names"] == ["a.example.com"]
    assert sorted(out[1][1]["names"]) == sorted(f"b{i}.example.com" for i in range(20))


def test_a_full_summary_holds_at_most_its_bound() -> None:
    out: list[tuple[str, dict[str, Any]]] = []
    rec = DenialRecorder("c", lambda k, d: out.append((k, d)), max_records=0, clock=Tick())
    batch = rec._waiting
    batch.names.extend(f"n{i}.example.com" for i in range(SUMMARY_NAMES - 1))
    assert rec.new_name("last.example.com", "*.example.com", 1, 10000, "10 minutes")
    assert len(out) == 1 and len(out[0][1]["names"]) == SUMMARY_NAMES
    assert len(json.dumps(out[0][1])) < 1 << 20  # far below an audit record's bound
    assert rec.new_name("next.example.com", "*.example.com", 2, 10000, "10 minutes")
    assert out[1][1]["names"] == ["next.example.com"]


def test_a_flood_of_denials_does_not_hide_new_names_nor_the_other_way_round() -> None:
    out: list[tuple[str, dict[str, Any]]] = []
    rec = DenialRecorder("c", lambda k, d: out.append((k, d)), max_records=5, clock=Tick())
    for i in range(100):
        rec.deny(f"d{i}.test", "A", "name not in the allowlist")
    rec.new_name("a.example.com", "*.example.com", 1, 100, "10 minutes")
    for i in range(100):
        rec.new_name(f"w{i}.example.com", "*.example.com", i + 2, 200, "10 minutes")
    rec.deny("budget.example.com", "A", "wildcard budget: 100 new names per 10 minutes, all used")
    names = [d.get("name") for _, d in out]
    assert "a.example.com" in names
    assert "budget.example.com" not in names  # the denial bound was used up by the flood
    listed = [n for k, d in out if k == "dns.wildcard" for n in d.get("names", [])]
    assert len(listed) == 96
    rec.flush()
    assert out[-1][0] == "dns.denied" and out[-1][1]["suppressed"] == 96


def test_while_the_sink_fails_names_waiting_for_a_summary_are_refused() -> None:
    state = {"fail": False}

    def sink(kind: str, data: dict[str, Any]) -> None:
        if state["fail"]:
            raise OSError("disk full")

    clock = Tick()
    rec = DenialRecorder("c", sink, max_records=1, clock=clock)
    assert rec.new_name("a.example.com", "*.example.com", 1, 100, "10 minutes")
    assert rec.new_name("b.example.com", "*.example.com", 2, 100, "10 minutes")  # a summary
    state["fail"] = True
    rec.deny("x.test", "A", "name not in the allowlist")  # this write fails
    assert not rec.new_name("c.example.com", "*.example.com", 3, 100, "10 minutes")
    state["fail"] = False
    assert not rec.new_name("d.example.com", "*.example.com", 3, 100, "10 minutes")
    clock.t = 60  # a new minute: one by one again, and the sink works
    assert rec.new_name("d.example.com", "*.example.com", 3, 100, "10 minutes")
    assert rec.new_name("e.example.com", "*.example.com", 4, 100, "10 minutes")
    state["fail"] = True  # the summary that would carry f fails: f is refused
    assert not rec.new_name("f.example.com", "*.example.com", 5, 100, "10 minutes")


# -- the profile field -----------------------------------------------------------------------
def _profile(tmp_path: Path, network: str) -> Path:
    f = tmp_path / "p.yml"
    f.write_text(f"name: demo\nnetwork:\n{network}", encoding="utf-8")
    return f


def test_the_profile_field_is_an_integer_within_bounds(tmp_path: Path) -> None:
    from linpodx.errors import ProfileError
    from linpodx.profile.loader import load_file

    assert load_file(_profile(tmp_path, "  egress_dns_allowlist: ['*.x.test']\n")).network \
        .wildcard_budget == 100
    for good in (1, 250, 10000):
        p = load_file(_profile(tmp_path, f"  wildcard_budget: {good}\n"))
        assert p.network.wildcard_budget == good
    for bad in ("0", "-5", "10001", "true", "'100'", "1.5", "null", "[100]"):
        with pytest.raises(ProfileError) as exc:
            load_file(_profile(tmp_path, f"  wildcard_budget: {bad}\n"))
        assert any("network.wildcard_budget" in p for p in exc.value.problems), bad


def test_revisions_stored_before_the_field_keep_their_digest(tmp_path: Path) -> None:
    """A revision written by a linpodx without the field has no `wildcard_budget` key: it
    means the default and still matches its digest; a non-default value is part of it."""
    from linpodx import paths
    from linpodx.profile import store

    r = store.apply(_profile(tmp_path, "  egress_dns_allowlist: ['*.x.test']\n"))
    path = paths.profiles_dir() / "revisions" / f"{r.profile_id}.json"
    doc = json.loads(path.read_text())
    assert doc["profile"]["network"]["wildcard_budget"] == 100  # `sandbox show` shows it
    del doc["profile"]["network"]["wildcard_budget"]
    path.write_text(json.dumps(doc))
    got = store.get("demo")
    assert got.profile_id == r.profile_id and got.profile.network.wildcard_budget == 100
    changed = store.apply(
        _profile(tmp_path, "  egress_dns_allowlist: ['*.x.test']\n  wildcard_budget: 20\n")
    )
    assert changed.changed and changed.digest != r.digest
    doc = json.loads((path.parent / f"{changed.profile_id}.json").read_text())
    doc["profile"]["network"]["wildcard_budget"] = 5000  # tampering is still detected
    (path.parent / f"{changed.profile_id}.json").write_text(json.dumps(doc))
    from linpodx.errors import ChainBroken

    with pytest.raises(ChainBroken):
        store.get("demo")


def test_the_guard_s_policy_carries_the_budget_and_old_files_still_pass() -> None:
    from linpodx.podman import flags
    from linpodx.snapshot import egresskeep

    net = {"egress_dns_allowlist": ["*.x.test"], "upstream_dns": [], "allow_private_answers": False}
    old = flags.egress_policy("demo", "prof_X", 1, net)  # a revision from before the field
    assert old["wildcard_budget"] == 100
    new = flags.egress_policy("demo", "prof_X", 1, {**net, "wildcard_budget": 7})
    assert new["wildcard_budget"] == 7
    assert egresskeep.check(new) is new
    del new["wildcard_budget"]
    assert egresskeep.check(new) is new  # a policy file an earlier linpodx wrote
    for bad in (True, "7", None):
        with pytest.raises(ValueError):
            egresskeep.check({**new, "wildcard_budget": bad})


def test_validate_names_the_budget_when_there_are_wildcards(tmp_path: Path) -> None:
    from tests.conftest import run_linpodx

    f = _profile(tmp_path, "  egress_dns_allowlist: [crates.io, '*.x.test']\n"
                 "  wildcard_budget: 40\n")
    r = run_linpodx("sandbox", "validate", str(f))
    assert r.returncode == 0, r.stderr
    line = "egress:  2 hosts allowed (1 wildcard: at most 40 new names per 10 minutes)\n"
    assert line in r.stdout
    doc = json.loads(run_linpodx("sandbox", "validate", str(f), "--json").stdout)
    assert doc["result"]["wildcards"] == 1 and doc["result"]["wildcard_budget"] == 40


def test_a_huge_answer_is_cut_to_a_few_addresses() -> None:
    """A zone answering with thousands of addresses (TCP carries ~4,000) must not make each
    remembered answer megabytes."""
    from linpodx.egress.resolver import MAX_ANSWER_ADDRS

    r, up, _records, _clock, _rec = make_budgeted(10)
    up.table["big.example.com"] = [
        ("big.example.com", "A", 300, f"9.9.{i // 250}.{i % 250 + 1}") for i in range(1000)
    ]
    resp = ask(r, "big.example.com")
    assert resp.rcode() == dns.rcode.NOERROR
    assert len([rd for rr in resp.answer for rd in rr]) == MAX_ANSWER_ADDRS == 32
    [line] = [v for k, v in r._cache.items() if k[0] == "big.example.com"]
    assert len(line.records) == MAX_ANSWER_ADDRS


def test_connection_bounds_agree_everywhere_and_reach_the_policy_file() -> None:
    from linpodx.egress.checker import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_NEW_PER_SECOND
    from linpodx.podman import flags
    from linpodx.profile import loader
    from linpodx.profile.model import Network
    from linpodx.snapshot import egresskeep

    props = loader.schema()["properties"]["network"]["properties"]
    assert props["max_connections"]["default"] == Network().max_connections
    assert Network().max_connections == flags.MAX_CONNECTIONS_DEFAULT == DEFAULT_MAX_CONNECTIONS
    assert props["max_new_connections_per_second"]["default"] == (
        Network().max_new_connections_per_second
    )
    assert (
        Network().max_new_connections_per_second
        == flags.MAX_NEW_CONNECTIONS_PER_SECOND_DEFAULT
        == DEFAULT_MAX_NEW_PER_SECOND
    )
    net = {"egress_dns_allowlist": ["a.test"], "upstream_dns": [], "allow_private_answers": False,
           "max_connections": 7, "max_new_connections_per_second": 3}  # fmt: skip
    doc = flags.egress_policy("p", "prof_X", 1, net)
    assert (doc["max_connections"], doc["max_new_connections_per_second"]) == (7, 3)
    assert runner._bounds(doc).max_connections == 7
    assert runner._bounds(doc).max_new_per_second == 3
    assert runner._bounds({"max_connections": True}).max_connections == DEFAULT_MAX_CONNECTIONS
    egresskeep.check(doc)  # a rollback keeps such a policy file


def test_connection_bounds_in_a_profile_file(tmp_path: Path) -> None:
    from linpodx.profile.loader import load_file

    f = tmp_path / "p.yml"
    f.write_text(
        "name: c\nnetwork:\n  egress_dns_allowlist: [a.test]\n"
        "  max_connections: 9\n  max_new_connections_per_second: 4\n"
    )
    net = load_file(f).network
    assert (net.max_connections, net.max_new_connections_per_second) == (9, 4)
    f.write_text("name: c\nnetwork:\n  egress_dns_allowlist: [a.test]\n  max_connections: 0\n")
    from linpodx.errors import ProfileError

    with pytest.raises(ProfileError) as refused:
        load_file(f)
    assert "max_connections" in " ".join(refused.value.problems), refused.value.problems
