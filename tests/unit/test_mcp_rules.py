"""MCP rules on a tool's arguments, and rates: the matchers, the policy, the loader, the bridge."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from linpodx.approvals import store as approvals
from linpodx.errors import ProfileError
from linpodx.mcp import policy
from linpodx.mcp.bridge import Bridge
from linpodx.mcp.framing import Line
from linpodx.profile.loader import load_text, profile_from_dict
from linpodx.profile.mcprule import (
    MAX_SUBJECT,
    Matcher,
    PatternError,
    Rate,
    compile_regex,
    normalize_path,
    parse_rate,
)
from linpodx.profile.model import Decision as A
from linpodx.profile.model import McpRule, McpSettings, Profile

# ---- paths and globs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "norm"),
    [
        ("/proj/a", "/proj/a"),
        ("/proj//a///b", "/proj/a/b"),
        ("/proj/./a/.", "/proj/a"),
        ("/proj/a/../b", "/proj/b"),
        ("//proj", "/proj"),
        ("/", "/"),
        ("/..", None),
        ("/proj/../../etc", None),
        ("../x", None),
        ("a/../..", None),
        ("a/./b", "a/b"),
        ("", None),
        ("/proj/a\0", None),
    ],
)
def test_normalize_path(value: str, norm: str | None) -> None:
    assert normalize_path(value) == norm


WORK = Matcher("glob", "/proj/**")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("/proj/a", True),
        ("/proj/a/b/c.py", True),
        ("/proj//a", True),
        ("/proj/./a", True),
        ("/proj/x/../a", False),  # `..` after a symlink is not where the text says (below)
        ("/proj/../etc/passwd", False),  # normalized first: /etc/passwd
        ("/proj/a/../../etc/passwd", False),
        ("/proj/../../proj/a", False),  # climbs above the root: never a match
        ("/proj", False),  # `/proj/**` is what is below /proj
        ("/workshop/a", False),
        ("work/a", False),
        ("/proj/a\0/b", False),
        (7, False),
        (None, False),
        (["/proj/a"], False),
        ({"path": "/proj/a"}, False),
        ("/proj/" + "a" * MAX_SUBJECT, False),  # longer than the bound
    ],
)
def test_glob_double_star(value: Any, ok: bool) -> None:
    assert WORK.matches(value) is ok


@pytest.mark.parametrize(
    "value",
    [
        "/proj/%2e%2e/etc/passwd",  # a server that decodes file: URIs reads /etc/passwd
        "/proj/%2F..%2Fetc",
        "/proj/..\\..\\etc",  # a backslash is a separator to some servers
        "/proj/\uff0e\uff0e/etc",  # full-width dots: NFKC makes them `..`
        "/proj/\u2024\u2024/etc",  # the one-dot leader, likewise
        "/proj/a\uff0fb",  # a full-width slash
        "/proj/.. ",  # a server that trims the value reads /proj/.., the root's parent
        "/proj/..\n",
        "/proj/a/..\t",
        "/proj/..\u3000",  # Python's strip() and Go's TrimSpace take it too
        "/proj/..\ufeff",  # JavaScript's trim() takes the BOM
    ],
)
def test_a_path_a_server_may_read_otherwise_is_not_judged(value: str) -> None:
    assert WORK.judge(value) is None
    assert not WORK.matches(value)


def test_a_dot_dot_after_a_link_leaves_the_tree_the_text_stays_in(tmp_path: Path) -> None:
    """`..` is taken back by the kernel from where a symlink led, not from the link: with a
    workspace link from deep to shallow (pnpm's `node_modules/@s/pkg -> ../../packages/pkg`),
    `/proj/node_modules/@s/pkg/../../../secret` is `/proj/secret` to the text and the parent
    of /proj to the file system. The glob allowed it; a path holding `..` is unjudged."""
    proj = tmp_path / "proj"
    (proj / "packages" / "pkg").mkdir(parents=True)
    (proj / "node_modules" / "@s").mkdir(parents=True)
    (proj / "node_modules" / "@s" / "pkg").symlink_to("../../packages/pkg")
    (tmp_path / "secret").write_text("outside the tree\n")
    value = f"{proj}/node_modules/@s/pkg/../../../secret"
    assert Path(value).read_text() == "outside the tree\n"  # what a server opens
    assert normalize_path(value) == f"{proj}/secret"  # what the text says
    tree = Matcher("glob", f"{proj}/**")
    assert tree.judge(value) is None and not tree.matches(value)
    assert Matcher("glob", f"{tmp_path}/secret").judge(value) is None  # a deny takes it
    assert tree.judge(f"{proj}/node_modules/@s/pkg/x") is True  # no `..`: judged


def test_other_non_ascii_and_a_bare_percent_are_still_judged() -> None:
    assert WORK.judge("/proj/caf\u00e9/\u6587\u4ef6.txt") is True
    assert WORK.judge("/proj/100%.txt") is True


def test_single_star_and_question_mark_stay_in_one_segment() -> None:
    py = Matcher("glob", "/proj/*.py")
    assert py.matches("/proj/a.py") and py.matches("/proj/.py")
    assert not py.matches("/proj/sub/a.py") and not py.matches("/proj/a.pyc")
    q = Matcher("glob", "/proj/?.txt")
    assert q.matches("/proj/a.txt") and not q.matches("/proj/ab.txt")
    assert not q.matches("/proj//.txt")  # `//` collapses: `/proj/.txt` has no char for `?`
    mid = Matcher("glob", "/proj/**/test_*.py")
    assert mid.matches("/proj/test_a.py")  # `a/**/b` also matches `a/b`
    assert mid.matches("/proj/x/y/test_a.py")
    assert not mid.matches("/proj/x/y/test_a.py/z")
    assert not mid.matches("/proj/x/ytest_a.py")


def test_glob_is_not_fnmatch() -> None:
    # fnmatch's `*` crosses `/`: `/proj/*` would take `/proj/a/b`.
    assert not Matcher("glob", "/proj/*").matches("/proj/a/b")


# ---- regexes ----------------------------------------------------------------------------------


def test_regex_matches_the_whole_value() -> None:
    m = Matcher("regex", "[a-z0-9_-]+")
    assert m.matches("unit-tests_1")
    assert not m.matches("a b") and not m.matches("abc\n") and not m.matches("")
    assert not m.matches("abc\0") and not m.matches(5)
    alt = Matcher("regex", "(fast|slow)(-[0-9]{1,3})?")
    assert [alt.matches(v) for v in ("fast", "slow-12", "slow-1234", "fastslow")] == [
        True, True, False, False,
    ]  # fmt: skip
    cls = Matcher("regex", r"[^/\s]+\.py|\d+")
    assert cls.matches("a.py") and cls.matches("42") and not cls.matches("a b.py")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(", "not a valid regular expression"),
        ("a{2,1}", "not a valid regular expression"),
        ("^a", "anchors"),
        ("a$", "anchors"),
        (r"\bword", "anchors"),
        ("(?i)a", "inline flags"),
        ("(?s:a.)", "inline flags"),
        ("(?=a)a", "not supported"),
        (r"(a)\1", "not supported"),
        ("a{1,500}", "too large"),
        ("(a{1,100}){1,100}", "too large"),
    ],
)
def test_regex_refused(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match=why):
        compile_regex(pattern)


def test_regex_time_is_bounded() -> None:
    # Python's `re` takes minutes on this (backtracking); the machine is linear in the subject.
    m = Matcher("regex", ".*a.*a.*a.*x")
    t = time.monotonic()
    assert not m.matches("a" * MAX_SUBJECT)
    assert time.monotonic() - t < 2.0
    assert not m.matches("a" * (MAX_SUBJECT + 1) + "x")  # past the bound: no match at all
    assert m.matches("aaax")


def test_a_repeat_of_nothing_does_not_hang_the_loader() -> None:
    # `(?:){N}` emits no step, so MAX_PROGRAM never stopped the loop that wrote N copies: a
    # profile with N = 4e9 hung `sandbox validate` (and apply) for hours.
    def too_slow(_sig: int, _frame: Any) -> None:
        raise TimeoutError("compiling a repeat of nothing did not finish in 5 s")

    old = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(5)
    try:
        p = load_text(
            "name: a\nmcp_policy:\n  - method: tools/call\n"
            "    arguments: {n: {regex: '(?:){4000000000}a((?:){99999}){99999}'}}\n"
            "    decision: deny\n"
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    (_name, m), = p.mcp_policy[0].arguments
    assert m.matches("a") and not m.matches("") and not m.matches("aa")


# ---- equals, one_of ---------------------------------------------------------------------------


def test_equals_compares_json_values_with_their_types() -> None:
    one = Matcher("equals", 1)
    assert one.matches(1)
    assert not one.matches(True) and not one.matches("1") and not one.matches(1.0)
    yes = Matcher("equals", True)
    assert yes.matches(True) and not yes.matches(1)
    obj = Matcher("equals", {"a": [1, "x"]})
    assert obj.matches({"a": [1, "x"]})
    assert not obj.matches({"a": [True, "x"]}) and not obj.matches({"a": [1, "x"], "b": 1})
    nul = Matcher("equals", None)
    assert nul.matches(None) and not nul.matches(0) and not nul.matches("")
    some = Matcher("one_of", ("fast", 2, None))
    assert some.matches("fast") and some.matches(2) and some.matches(None)
    assert not some.matches("2") and not some.matches(False) and not some.matches("slow")


# ---- the policy -------------------------------------------------------------------------------

RULES = (
    McpRule(
        "tools/call",
        A.AUTO_ALLOW,
        "read_file",
        arguments=(("path", WORK), ("mode", Matcher("one_of", ("r", "rb")))),
    ),
    McpRule("tools/call", A.PROMPT, "read_file"),
    McpRule("tools/call", A.AUTO_ALLOW, "run_tests", rate=Rate(3, 60)),
)


def params(tool: str, **args: Any) -> dict[str, Any]:
    return {"name": tool, "arguments": args}


@pytest.mark.parametrize(
    ("p", "rule"),
    [
        (params("read_file", path="/proj/a", mode="r"), 0),
        (params("read_file", path="/proj/a", mode="r", extra=1), 0),  # others are not looked at
        (params("read_file", path="/proj/../etc/passwd", mode="r"), 1),
        (params("read_file", path="/proj/a"), 1),  # `mode` missing
        (params("read_file", path="/proj/a", mode=["r"]), 1),  # of the wrong type
        (params("read_file", path=["/proj/a"], mode="r"), 1),
        (params("read_file", path="/proj/a\0", mode="r"), 1),
        ({"name": "read_file", "arguments": [["path", "/proj/a"]]}, 1),  # not an object
        ({"name": "read_file"}, 1),  # no arguments at all
    ],
)
def test_rule_with_arguments_matches_only_when_every_one_does(p: Any, rule: int) -> None:
    d = policy.evaluate(RULES, "tools/call", "read_file", p)
    assert d.rule_index == rule
    if rule == 0:
        assert d.action is A.AUTO_ALLOW and d.matched == ("path", "mode")
        assert d.reason == "rule 0 (tools/call read_file path~glob, mode~one_of): auto_allow"
    else:
        assert d.action is A.PROMPT and d.matched == ()


def test_arguments_never_match_another_method() -> None:
    rules = (McpRule("*", A.AUTO_ALLOW, arguments=(("path", WORK),)), McpRule("*", A.DENY))
    p = {"arguments": {"path": "/proj/a"}}
    assert policy.evaluate(rules, "prompts/get", None, p).action is A.DENY
    assert policy.evaluate(rules, "tools/call", "x", p).action is A.AUTO_ALLOW


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_rate_turns_into_prompt_past_the_window_count_and_back_later() -> None:
    clock = Clock()
    sp = policy.SessionPolicy(RULES, clock)
    p = params("run_tests")
    got = []
    for _ in range(5):
        got.append(sp.decide("tools/call", "run_tests", p).action)
        clock.t += 1
    assert got == [A.AUTO_ALLOW] * 3 + [A.PROMPT] * 2
    over = sp.decide("tools/call", "run_tests", p)
    assert over.rule_index == 2
    assert over.reason == (
        "rule 2 (tools/call run_tests): rate 3/min exceeded (3 auto-allowed in the last 60s): "
        "prompt"
    )
    # The window slides: at t0+60 the first call ages out (prompts were not counted).
    clock.t = 1060.0
    assert sp.decide("tools/call", "run_tests", p).action is A.AUTO_ALLOW
    assert sp.decide("tools/call", "run_tests", p).action is A.PROMPT
    clock.t = 1062.0
    assert [sp.decide("tools/call", "run_tests", p).action for _ in range(3)] == [
        A.AUTO_ALLOW, A.AUTO_ALLOW, A.PROMPT,
    ]  # fmt: skip


def test_rates_are_per_session_and_per_rule() -> None:
    clock = Clock()
    rules = (
        McpRule("tools/call", A.AUTO_ALLOW, "a", rate=Rate(1, 1)),
        McpRule("tools/call", A.AUTO_ALLOW, "b", rate=Rate(1, 1)),
    )
    one, two = policy.SessionPolicy(rules, clock), policy.SessionPolicy(rules, clock)
    assert one.decide("tools/call", "a", params("a")).action is A.AUTO_ALLOW
    assert one.decide("tools/call", "b", params("b")).action is A.AUTO_ALLOW
    assert one.decide("tools/call", "a", params("a")).action is A.PROMPT
    assert two.decide("tools/call", "a", params("a")).action is A.AUTO_ALLOW
    clock.t += 1
    assert one.decide("tools/call", "a", params("a")).action is A.AUTO_ALLOW


def test_housekeeping_and_unrated_rules_are_not_counted() -> None:
    sp = policy.SessionPolicy(RULES, Clock())
    for _ in range(20):
        assert sp.decide("ping", None, None).action is A.AUTO_ALLOW
        assert sp.decide("tools/call", "read_file", params("read_file")).action is A.PROMPT


@pytest.mark.parametrize(
    ("text", "rate"),
    [("30/min", Rate(30, 60)), ("1/s", Rate(1, 1)), ("10000/h", Rate(10000, 3600)),
     ("0/s", None), ("10001/s", None), ("30/m", None), ("30 /min", None), ("1.5/s", None)],
)  # fmt: skip
def test_parse_rate(text: str, rate: Rate | None) -> None:
    assert parse_rate(text) == rate


# ---- the loader -------------------------------------------------------------------------------

GOOD = """name: a
mcp_policy:
  - method: tools/call
    tool_name: read_file
    arguments:
      path: {glob: "/proj/**"}
      mode: {one_of: [r, rb, 1, true, null]}
      size: {equals: {max: 10}}
      name: {regex: "[a-z]+"}
    decision: auto_allow
  - method: tools/call
    tool_name: run_tests
    rate: 30/min
    decision: auto_allow
"""


def test_loader_builds_matchers_and_rates_and_keeps_old_forms() -> None:
    p = load_text(GOOD)
    r0, r1 = p.mcp_policy
    assert [n for n, _m in r0.arguments] == ["path", "mode", "size", "name"]
    assert r0.arguments[1][1] == Matcher("one_of", ("r", "rb", 1, True, None))
    assert r1.rate == Rate(30, 60) and r1.arguments == ()
    d = p.to_dict()
    assert d["mcp_policy"][0]["arguments"]["size"] == {"equals": {"max": 10}}
    assert d["mcp_policy"][1]["rate"] == "30/min"
    assert profile_from_dict(d) == p
    # A rule without them has exactly the stored form it had before they existed (digests).
    plain = load_text("name: a\nmcp_policy: [{method: tools/call, decision: deny}]\n")
    assert plain.to_dict()["mcp_policy"] == [
        {"method": "tools/call", "tool_name": None, "decision": "deny"}
    ]


def problems(rule: str) -> list[str]:
    with pytest.raises(ProfileError) as exc:
        load_text(f"name: a\nmcp_policy:\n  - method: tools/call\n{rule}\n", "p.yml")
    return [str(x) for x in exc.value.problems]


@pytest.mark.parametrize(
    ("rule", "where", "what"),
    [
        ("    arguments: {path: {glob: /proj/../x}}\n    decision: deny",
         "mcp_policy[0].arguments.path.glob", "normalized path"),
        ("    arguments: {path: {glob: '/proj/'}}\n    decision: deny",
         "mcp_policy[0].arguments.path.glob", "normalized path"),
        ("    arguments: {path: {glob: '/proj/[ab]'}}\n    decision: deny",
         "mcp_policy[0].arguments.path.glob", "no meaning in a glob"),
        ("    arguments: {path: {regex: '^/proj'}}\n    decision: deny",
         "mcp_policy[0].arguments.path.regex", "anchors"),
        ("    arguments: {path: {regex: '(a'}}\n    decision: deny",
         "mcp_policy[0].arguments.path.regex", "not a valid regular expression"),
        ("    arguments: {path: {regex: '" + "a" * 257 + "'}}\n    decision: deny",
         "mcp_policy[0].arguments.path.regex", "too long"),
        ("    arguments: {path: {glob: a, regex: b}}\n    decision: deny",
         "mcp_policy[0].arguments.path", "exactly one matcher"),
        ("    arguments: {path: {}}\n    decision: deny",
         "mcp_policy[0].arguments.path", "exactly one matcher"),
        ("    arguments: {path: {like: a}}\n    decision: deny",
         "mcp_policy[0].arguments.path.like", "unknown key"),
        ("    arguments: {path: /proj}\n    decision: deny",
         "mcp_policy[0].arguments.path", "expected a mapping"),
        ("    arguments: {}\n    decision: deny", "mcp_policy[0].arguments", "non-empty"),
        ("    arguments: {n: {equals: 1.5}}\n    decision: deny",
         "mcp_policy[0].arguments.n.equals", "floating-point"),
        ("    arguments: {n: {one_of: []}}\n    decision: deny",
         "mcp_policy[0].arguments.n.one_of", ""),
        ("    rate: 30/min\n    decision: deny", "mcp_policy[0].rate", "only applies to decision"),
        ("    rate: 30/min\n    decision: prompt", "mcp_policy[0].rate", "only applies"),
        ("    rate: 30/day\n    decision: auto_allow", "mcp_policy[0].rate", "not valid here"),
        ("    rate: 20000/s\n    decision: auto_allow", "mcp_policy[0].rate", "is not a rate"),
        ("    rate: 30\n    decision: auto_allow", "mcp_policy[0].rate", "string"),
    ],
)  # fmt: skip
def test_loader_refuses_bad_rules(rule: str, where: str, what: str) -> None:
    probs = problems(rule)
    assert any(f": {where}:" in p and what in p for p in probs), probs


def test_loader_refuses_arguments_on_another_method(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as exc:
        load_text(
            "name: a\nmcp_policy:\n  - method: resources/read\n"
            "    arguments: {uri: {glob: /x}}\n    decision: deny\n"
        )
    (prob,) = exc.value.problems
    assert "mcp_policy[0].arguments: arguments only applies to method tools/call" in str(prob)


def test_cli_reports_error_and_hint(cli: Any, tmp_path: Path) -> None:
    f = tmp_path / "p.yml"
    f.write_text(
        "name: a\nmcp_policy:\n  - method: tools/call\n    arguments: {p: {regex: '^x'}}\n"
        "    decision: deny\n"
    )
    r = cli("sandbox", "validate", str(f))
    assert r.exit_code != 0 and r.stdout == ""
    assert "error: " in r.stderr and "mcp_policy[0].arguments.p.regex: anchors" in r.stderr
    assert "hint: " in r.stderr and "Traceback" not in r.stderr
    f.write_text(GOOD)
    r = cli("sandbox", "validate", str(f))
    assert r.exit_code == 0, r.stderr
    assert "mcp:     2 rules (1 on arguments; rule 1 at most 30/min)" in r.stdout


# ---- the bridge -------------------------------------------------------------------------------


class Chain:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def append(self, type_: str, data: Any) -> None:
        self.records.append((type_, dict(data)))


def bridge(clock: Clock) -> tuple[Bridge, Chain, list[Any], list[Any], list[Any]]:
    profile = Profile(
        name="t",
        mcp_policy=(*RULES, McpRule("tools/call", A.DENY)),
        mcp=McpSettings(approval_timeout_seconds=5),
    )
    chain, client, server, events = Chain(), [], [], []  # type: ignore[var-annotated]
    b = Bridge(
        profile=profile,
        session_id="sess_R",
        chain=chain,
        to_client=lambda d: client.append(json.loads(d)),
        to_server=lambda d: server.append(json.loads(d)),
        emit=lambda t, **d: events.append((t, d)),
        clock=clock,
    )
    return b, chain, client, server, events


def send(b: Bridge, i: int, tool: str, **args: Any) -> None:
    msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params(tool, **args)}
    b.on_client_frame(Line(json.dumps(msg).encode()))


def test_bridge_forwards_a_matching_call_and_prompts_past_the_rate() -> None:
    clock = Clock()
    b, chain, _client, server, events = bridge(clock)
    send(b, 1, "read_file", path="/proj/a.txt", mode="r")
    send(b, 2, "read_file", path="/proj/../etc/passwd", mode="r")
    assert [m["id"] for m in server] == [1]
    for i in range(3, 6):
        send(b, i, "run_tests")
    send(b, 6, "run_tests")
    assert [m["id"] for m in server] == [1, 3, 4, 5]
    recs = {r["id"]: r for t, r in chain.records if t == "mcp.request"}
    assert recs[1]["rule"] == 0 and recs[1]["decision"] == "auto_allow"
    assert recs[2]["rule"] == 1 and recs[2]["decision"] == "prompt"
    assert recs[6]["decision"] == "prompt" and recs[6]["rule"] == 2
    assert "rate 3/min exceeded" in recs[6]["reason"]
    pending = [d for t, d in events if t == "approval.pending"]
    assert len(pending) == 2
    by_tool = {d["tool"]: d for d in pending}
    assert "rate 3/min exceeded" in by_tool["run_tests"]["reason"]
    assert approvals.load(by_tool["run_tests"]["approval_id"]).reason == recs[6]["reason"]
    b.shutdown("end")


def test_prompt_shows_the_matched_arguments_first() -> None:
    # The catch-all prompt after an argument rule: a call that missed it shows its arguments
    # in name order; a rate-limited argument rule shows the ones it matched on first.
    clock = Clock()
    rules = (
        McpRule("tools/call", A.AUTO_ALLOW, "w", arguments=(("z_path", WORK),), rate=Rate(1, 60)),
        McpRule("tools/call", A.PROMPT),
    )
    events: list[Any] = []
    b = Bridge(
        profile=Profile(name="t", mcp_policy=rules, mcp=McpSettings(approval_timeout_seconds=5)),
        session_id="sess_F",
        chain=Chain(),
        to_client=lambda d: None,
        to_server=lambda d: None,
        emit=lambda t, **d: events.append((t, d)),
        clock=clock,
    )
    send(b, 1, "w", a_content="x" * 50, z_path="/proj/a")
    send(b, 2, "w", a_content="x" * 50, z_path="/proj/a")
    (ev,) = [d for t, d in events if t == "approval.pending"]
    keys = [f[0] for f in ev["fields"]]
    assert keys[:3] == ["name", "arguments.z_path", "arguments.a_content"], keys
    from linpodx.cli.approvals import render

    lines = render({**approvals.load(ev["approval_id"]).to_dict(), "type": "approval.pending"})
    assert lines[1].startswith("why: rule 0 (tools/call w z_path~glob): rate 1/min exceeded")
    assert lines[3].startswith("  arguments.z_path: ")
    b.shutdown("end")


def test_a_value_no_matcher_can_judge_never_slips_past_a_stricter_rule() -> None:
    # deny writes below /etc, allow the rest: a path with NUL, one that climbs above its root,
    # a list or a huge string cannot be judged, and is denied rather than let through.
    rules = (
        McpRule("tools/call", A.DENY, "w", arguments=(("path", Matcher("glob", "/etc/**")),)),
        McpRule("tools/call", A.PROMPT, "w", arguments=(("cmd", Matcher("regex", "rm .*")),)),
        McpRule("tools/call", A.AUTO_ALLOW, "w"),
    )

    def decide(**args: Any) -> tuple[A, int | None]:
        d = policy.evaluate(rules, "tools/call", "w", params("w", **args))
        return d.action, d.rule_index

    assert decide(path="/etc/passwd") == (A.DENY, 0)
    assert decide(path="/proj/../etc/passwd") == (A.DENY, 0)
    for odd in ("/etc/passwd\0", "../../etc/passwd", ["/etc/passwd"], 7, "/" + "e" * MAX_SUBJECT):
        assert decide(path=odd) == (A.DENY, 0), odd
    assert decide(path="/proj/a") == (A.AUTO_ALLOW, 2)
    assert decide(cmd=["rm", "-rf"]) == (A.PROMPT, 1)
    assert decide(cmd="rm -rf /") == (A.PROMPT, 1)
    assert decide(cmd="ls") == (A.AUTO_ALLOW, 2)
    assert decide() == (A.AUTO_ALLOW, 2)  # nothing named is there: those rules do not apply
    odd_args = {"name": "w", "arguments": [["path", "/etc/passwd"]]}
    assert policy.evaluate(rules, "tools/call", "w", odd_args).rule_index == 0
    # The same odd values under an allow rule: not allowed by it.
    allow = (McpRule("tools/call", A.AUTO_ALLOW, "w", arguments=(("path", WORK),)),)
    for odd in ("/proj/a\0", "/proj/../../proj/a", ["/proj/a"], 7):
        assert policy.evaluate(allow, "tools/call", "w", params("w", path=odd)).action is A.DENY


def test_a_line_end_a_dot_would_have_to_cross_never_slips_past_a_stricter_rule() -> None:
    # `.` stops at a line end (as `re` reads it), and a shell runs each line: "ls\nrm -rf ~"
    # went past a deny of `.*rm .*` to the catch-all auto_allow.
    rules = (
        McpRule("tools/call", A.DENY, "w", arguments=(("cmd", Matcher("regex", ".*rm .*")),)),
        McpRule("tools/call", A.AUTO_ALLOW, "w"),
    )

    def rule(cmd: str) -> int | None:
        return policy.evaluate(rules, "tools/call", "w", params("w", cmd=cmd)).rule_index

    assert rule("ls\nrm -rf ~") == 0 and rule("rm -rf ~\n") == 0 and rule("x rm y") == 0
    assert rule("ls\necho hi") == 1  # no `rm ` in it on any reading: not denied
    # Under an allow rule such a value is not allowed, as before.
    ls_only = Matcher("regex", "ls .*")
    ls = (McpRule("tools/call", A.AUTO_ALLOW, "w", arguments=(("cmd", ls_only),)),)

    def allowed(cmd: str) -> bool:
        return policy.evaluate(ls, "tools/call", "w", params("w", cmd=cmd)).action is A.AUTO_ALLOW

    assert not allowed("ls x\nrm -rf ~") and allowed("ls -l")
    dot = Matcher("regex", "a.b")
    assert dot.judge("a\nb") is None and dot.judge("a\nc") is False and dot.judge("axb") is True


def test_a_number_or_type_equals_cannot_tell_apart_never_slips_past_a_deny() -> None:
    # Profiles hold integers; a client sends 1.0 (valid JSON, forwarded as 1.0) and a Python
    # or JavaScript server reads the number 1. `["rm"]` is "rm" to a server that compares
    # loosely. Both went past the deny to the catch-all auto_allow.
    rules = (
        McpRule("tools/call", A.DENY, "w", arguments=(("level", Matcher("equals", 1)),)),
        McpRule("tools/call", A.DENY, "w", arguments=(("cmd", Matcher("one_of", ("rm", "dd"))),)),
        McpRule("tools/call", A.DENY, "w", arguments=(("opt", Matcher("equals", {"n": 2})),)),
        McpRule("tools/call", A.AUTO_ALLOW, "w"),
    )

    def rule(**args: Any) -> int | None:
        return policy.evaluate(rules, "tools/call", "w", params("w", **args)).rule_index

    assert rule(level=1) == 0 and rule(level=1.0) == 0 and rule(level=True) == 0
    assert rule(level="1") == 0 and rule(level=[1]) == 0
    assert rule(level=2) == 3 and rule(level=0.5) == 3  # a number, another one: not denied
    assert rule(cmd="rm") == 1 and rule(cmd=["rm"]) == 1 and rule(cmd={"0": "rm"}) == 1
    assert rule(cmd="ls") == 3  # a string, another one
    assert rule(opt={"n": 2.0}) == 2 and rule(opt={"n": 3}) == 3
    # Under an allow rule the exact type still decides: 1.0 is not allowed by `equals: 1`.
    one = Matcher("equals", 1)
    allow = (McpRule("tools/call", A.AUTO_ALLOW, "w", arguments=(("level", one),)),)
    for odd in (1.0, True, "1", [1]):
        assert policy.evaluate(allow, "tools/call", "w", params("w", level=odd)).action is A.DENY
    assert policy.evaluate(allow, "tools/call", "w", params("w", level=1)).allowed


def test_a_relative_path_never_slips_past_an_absolute_deny() -> None:
    # The server resolves `.ssh/id_rsa` against its working directory (here the home the deny
    # rule names), `~` against its home; the gate cannot: they went to the catch-all allow.
    rules = (
        McpRule("tools/call", A.DENY, "r", arguments=(("path", Matcher("glob", "/root/**")),)),
        McpRule("tools/call", A.DENY, "r", arguments=(("file", Matcher("glob", "secret/*")),)),
        McpRule("tools/call", A.AUTO_ALLOW, "r"),
    )

    def rule(**args: Any) -> int | None:
        return policy.evaluate(rules, "tools/call", "r", params("r", **args)).rule_index

    for odd in (".ssh/id_rsa", "~/.ssh/id_rsa", "file:///root/.ssh/id_rsa", "x/../.ssh"):
        assert rule(path=odd) == 0, odd
    assert rule(path="/proj/a") == 2 and rule(path="/root/x") == 0
    assert rule(file="/proj/secret/a") == 1  # absolute against a relative glob: the same
    assert rule(file="secret/a") == 1 and rule(file="public/a") == 2
    # Under an allow rule a relative path is no match for an absolute glob (as before).
    assert not WORK.matches("work/a") and WORK.judge("a") is None
    # A glob that starts with `**` takes relative and absolute paths alike.
    keys = Matcher("glob", "**/.ssh/**")
    assert keys.matches("/root/.ssh/id_rsa") and keys.matches(".ssh/id_rsa")
    assert keys.judge("/proj/a") is False and keys.judge("a") is False


def test_an_argument_spelled_in_another_case_is_not_judged_as_absent() -> None:
    # A Go server (encoding/json) fills its `Path` field from `path`, `Path` or `PATH`, the
    # last key winning; the gate looked up `path` only, so both calls below reached the allow.
    rules = (
        McpRule("tools/call", A.DENY, "r", arguments=(("path", Matcher("glob", "/etc/**")),)),
        McpRule("tools/call", A.AUTO_ALLOW, "r", arguments=(("path", WORK),)),
        McpRule("tools/call", A.PROMPT, "r"),
    )

    def rule(args: dict[str, Any]) -> int | None:
        return policy.evaluate(rules, "tools/call", "r", {"name": "r", "arguments": args})

    assert rule({"path": "/proj/a"}).rule_index == 1
    assert rule({"path": "/proj/a", "PATH": "/etc/shadow"}).rule_index == 0
    assert rule({"Path": "/etc/shadow"}).rule_index == 0
    assert rule({"\u017fecret": 1, "path": "/proj/a"}).rule_index == 1  # other names: as before
    # Under the allow rule alone such a call is no match.
    allow = rules[1:]
    d = policy.evaluate(allow, "tools/call", "r", params("r", path="/proj/a", PATH="/proj/b"))
    assert d.rule_index == 1


def test_approvals_show_says_why(cli: Any) -> None:
    reason = "rule 1 (tools/call run_tests): rate 3/min exceeded (3 auto-allowed in the last 60s)"
    req = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params("run_tests")}
    p = approvals.create("sess_W", "tools/call", "run_tests", req, req["params"], 30, (), reason)
    r = cli("approvals", "show", p.approval_id)
    assert r.exit_code == 0, r.stderr
    assert f"why: {reason}\nrequest:\n" in r.stdout
    doc = json.loads(cli("approvals", "show", p.approval_id, "--json").stdout)
    assert doc["result"]["reason"] == reason
