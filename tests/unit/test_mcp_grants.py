"""Session grants: the book (pure), the answer that asks for one, and the bridge that makes one."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from linpodx.approvals import store
from linpodx.approvals.prompter import Prompter
from linpodx.cli import approvals as cli_approvals
from linpodx.errors import AuditError, InvalidInput
from linpodx.mcp import grants
from linpodx.mcp.bridge import Bridge
from linpodx.mcp.framing import Line
from linpodx.mcp.policy import Decision, evaluate
from linpodx.profile.model import Decision as A
from linpodx.profile.model import McpRule, McpSettings, Profile

RULES = (
    McpRule("tools/call", A.AUTO_ALLOW, "read_file"),
    McpRule("tools/call", A.PROMPT, "write_file"),
    McpRule("tools/call", A.DENY, "run_shell"),
    McpRule("tools/call", A.PROMPT),  # catch-all: every other tool prompts
    McpRule("resources/read", A.PROMPT),
)


def decide(tool: str, method: str = "tools/call") -> Decision:
    return evaluate(RULES, method, tool if method == "tools/call" else None)


# ---- the book --------------------------------------------------------------------------------


def test_a_grant_covers_later_calls_of_its_rule_and_tool() -> None:
    book = grants.GrantBook("sess_A", RULES)
    first = decide("write_file")
    assert book.find(first, "tools/call", "write_file") is None  # nothing granted yet
    g = book.make(first, "tools/call", "write_file", "apr_X")
    assert g.rule_index == 1 and g.tool == "write_file" and g.grant_id.startswith("grt_")
    assert book.find(first, "tools/call", "write_file") is None  # made is not in force
    assert book.add(g)
    later = decide("write_file")
    assert book.find(later, "tools/call", "write_file") == g
    allowed, gid = book.apply(later, "tools/call", "write_file")
    assert allowed.action is A.AUTO_ALLOW and gid == g.grant_id
    assert allowed.rule_index == 1 and g.grant_id in allowed.reason


def test_a_grant_never_widens_to_another_rule_tool_or_method() -> None:
    book = grants.GrantBook("sess_A", RULES)
    # Granted for `echo` under the catch-all prompt rule (3) ...
    assert book.add(book.make(decide("echo"), "tools/call", "echo", "apr_X"))
    assert book.find(decide("echo"), "tools/call", "echo") is not None
    # ... the same rule with another tool still prompts,
    for tool in ("run_tests", "Echo", "echo ", "write_file"):
        d = decide(tool)
        assert book.apply(d, "tools/call", tool) == (d, None), tool
    # so does another rule's method, and the same tool decided by another rule.
    d = decide("", "resources/read")
    assert book.apply(d, "resources/read", None) == (d, None)
    other_rule = Decision(A.PROMPT, 4, "rule 4")
    assert book.find(other_rule, "tools/call", "echo") is None


def test_no_grant_for_a_method_without_a_tool() -> None:
    """A grant is bound to its rule, method and tool; a `resources/read` has no tool, so `s`
    on one `resources/read file:///proj/README.md` passed every later one of the session,
    `file:///home/agent/.ssh/id_rsa` too. Only a tools/call is approved for the session."""
    d = decide("", "resources/read")
    assert d.action is A.PROMPT
    why = grants.refusal(RULES, d, "resources/read", None)
    assert why == "only a tools/call can be approved for the session"
    with pytest.raises(ValueError, match="only a tools/call"):
        grants.GrantBook("sess_A", RULES).make(d, "resources/read", None, "apr_X")
    forged = grants.Grant("grt_F", "sess_A", 4, "resources/read", None, "apr_X")
    book = grants.GrantBook("sess_A", RULES)
    assert book.add(forged)
    assert book.apply(d, "resources/read", None) == (d, None)


def test_no_grant_for_or_over_a_deny_or_an_allow() -> None:
    book = grants.GrantBook("sess_A", RULES)
    deny = decide("run_shell")
    assert deny.action is A.DENY
    with pytest.raises(ValueError, match="not prompt"):
        book.make(deny, "tools/call", "run_shell", "apr_X")
    # Even a grant in the book for that rule and tool does not turn the deny into an allow.
    forged = grants.Grant("grt_F", "sess_A", 2, "tools/call", "run_shell", "apr_X")
    assert book.add(forged)
    assert book.apply(deny, "tools/call", "run_shell") == (deny, None)
    # The default deny has no rule at all.
    default = evaluate((), "tools/call", "x")
    assert book.apply(default, "tools/call", "x") == (default, None)
    assert grants.refusal(RULES, default, "tools/call", "x") == (
        "the call's decision is deny, not prompt"
    )


def test_a_rate_limited_prompt_keeps_prompting() -> None:
    """A call that prompts because its rule's `rate:` was passed is never granted: not when
    its rule says auto_allow (the prompt is the rate's), nor when the decision says so."""
    book = grants.GrantBook("sess_A", RULES)
    past_rate = Decision(A.PROMPT, 0, "rule 0: rate 30/min passed", rate_limited=True)
    with pytest.raises(ValueError, match="says auto_allow"):
        book.make(past_rate, "tools/call", "read_file", "apr_X")
    # A prompt rule past its own rate: granted calls within the rate, not past it.
    assert book.add(book.make(decide("write_file"), "tools/call", "write_file", "apr_X"))
    limited = Decision(A.PROMPT, 1, "rule 1: rate passed", rate_limited=True)
    assert book.apply(limited, "tools/call", "write_file") == (limited, None)
    with pytest.raises(ValueError, match="rate limit"):
        book.make(limited, "tools/call", "write_file", "apr_Y")
    # Forged into the book, an auto_allow rule's grant does not lift its rate either.
    assert book.add(grants.Grant("grt_F", "sess_A", 0, "tools/call", "read_file", "apr_Z"))
    unflagged = Decision(A.PROMPT, 0, "rule 0: rate passed")
    assert book.apply(unflagged, "tools/call", "read_file") == (unflagged, None)


def test_grants_end_with_the_session() -> None:
    book = grants.GrantBook("sess_A", RULES)
    g = book.make(decide("write_file"), "tools/call", "write_file", "apr_X")
    late = book.make(decide("echo"), "tools/call", "echo", "apr_Y")
    assert book.add(g)
    assert book.close() == 1
    assert book.find(decide("write_file"), "tools/call", "write_file") is None
    assert not book.add(late)  # an approval answered as the session ends makes none
    with pytest.raises(ValueError, match="ended"):
        book.make(decide("echo"), "tools/call", "echo", "apr_Z")
    # Another session's grant is never taken in.
    other = grants.GrantBook("sess_B", RULES)
    assert not other.add(g) and len(other) == 0


def test_the_book_is_bounded() -> None:
    book = grants.GrantBook("sess_A", RULES)
    for i in range(grants.GRANTS_MAX):
        assert book.add(book.make(decide(f"t{i}"), "tools/call", f"t{i}", "apr_X"))
    with pytest.raises(ValueError, match="grants already"):
        book.make(decide("one_more"), "tools/call", "one_more", "apr_X")


# ---- the answer ------------------------------------------------------------------------------

REQ = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "write_file", "arguments": {"path": "a", "content": "b"}},
}


def pending(grantable: bool) -> store.PendingRequest:
    return store.create(
        "sess_01KB0000000000000000000000",
        "tools/call",
        "write_file",
        REQ,
        REQ["params"],
        30,
        grantable=grantable,
    )


def test_an_answer_for_the_session_needs_a_grantable_request() -> None:
    p = pending(grantable=False)
    with pytest.raises(InvalidInput, match="cannot be approved for the session"):
        store.answer(p.approval_id, p.digest, store.APPROVE, scope=store.SCOPE_SESSION)
    assert store.read_answer(p.approval_id) is None  # nothing written
    with pytest.raises(InvalidInput):
        store.answer(p.approval_id, p.digest, store.DENY, scope=store.SCOPE_SESSION)
    q = pending(grantable=True)
    assert store.load(q.approval_id).grantable
    assert store.answer(q.approval_id, q.digest, store.APPROVE, scope=store.SCOPE_SESSION)
    ans = store.read_answer(q.approval_id)
    assert ans is not None and ans.for_session and store.status(q.approval_id) == "approved"


def _write_answer(p: store.PendingRequest, **extra: Any) -> None:
    doc = {"approval_id": p.approval_id, "digest": p.digest, "decision": "approve", **extra}
    path = store.approvals_dir() / p.approval_id / "answer.json"
    path.write_text(json.dumps(doc))


def test_an_answer_with_an_unknown_scope_is_a_deny() -> None:
    p = pending(grantable=True)
    _write_answer(p, scope="forever")
    ans = store.read_answer(p.approval_id)
    assert ans is not None and ans.unreadable and not ans.for_session
    assert store.check_answer(p, ans).approved is False
    assert "unknown scope" in ans.reason


def test_an_older_answer_without_a_scope_approves_the_call_alone() -> None:
    p = pending(grantable=True)
    _write_answer(p)
    ans = store.read_answer(p.approval_id)
    assert ans is not None and ans.scope == store.SCOPE_CALL and not ans.for_session
    assert store.check_answer(p, ans).approved


def test_an_older_request_without_grantable_offers_no_session() -> None:
    p = pending(grantable=True)
    path = store.approvals_dir() / p.approval_id / "request.json"
    doc = json.loads(path.read_text())
    del doc["grantable"]
    path.write_text(json.dumps(doc))
    assert store.load(p.approval_id).grantable is False


def _ask(p: store.PendingRequest, typed: bytes) -> str:
    r, w = os.pipe()
    out = io.StringIO()
    prompter = Prompter(os.fdopen(r, "r"), out, cli_approvals.render)
    # Typed once the question is up (type-ahead is discarded, as on a terminal).
    threading.Timer(0.3, os.write, (w, typed)).start()
    prompter.ask(p.approval_id)
    os.close(w)
    return out.getvalue()


def test_the_prompter_offers_s_only_when_a_grant_can_be_made() -> None:
    p = pending(grantable=True)
    text = _ask(p, b"s\n")
    assert "approve? [y/N/s]: " in text and "→ APPROVED FOR THE SESSION" in text
    ans = store.read_answer(p.approval_id)
    assert ans is not None and ans.for_session and "for the session" in ans.reason

    q = pending(grantable=False)
    text = _ask(q, b"s\n")
    assert "approve? [y/N]: " in text and "[y/N/s]" not in text
    # `s` was not offered: it is no answer the person was given, so a deny.
    assert "→ DENIED" in text and store.status(q.approval_id) == "denied"


def test_approve_for_session_refuses_a_request_that_cannot_be_granted() -> None:
    p = pending(grantable=False)
    with pytest.raises(InvalidInput, match="cannot be approved for the session"):
        cli_approvals.decide(p.approval_id, store.APPROVE, True, for_session=True)
    assert store.status(p.approval_id) == "pending"
    q = pending(grantable=True)
    out = cli_approvals.decide(q.approval_id, store.APPROVE, True, for_session=True)
    assert out["scope"] == "session" and out["decision"] == "approved"
    ans = store.read_answer(q.approval_id)
    assert ans is not None and ans.for_session


def test_render_says_grants() -> None:
    decided = {
        "ts": "2026-11-30T05:00:00.000000Z",
        "type": "approval.decided",
        "session": "sess_S",
        "approval_id": "apr_A",
        "decision": "approve",
        "reason": "approved by a person for the session",
        "by": {"user": "root", "tty": "/dev/pts/0"},
        "scope": "session",
    }
    line = cli_approvals.render(decided)[0]
    assert line.endswith(
        "apr_A → APPROVE FOR THE SESSION (approved by a person for the session; by root@/dev/pts/0)"
    )
    granted = {
        "ts": "2026-11-30T05:00:00.000000Z",
        "type": "approval.granted",
        "session": "sess_S",
        "grant_id": "grt_G",
        "approval_id": "apr_A",
        "rule": 1,
        "method": "tools/call",
        "tool": "write\x1b[2J_file",
    }
    line = cli_approvals.render(granted)[0]
    assert "grt_G tools/call write\\x1b[2J_file → GRANTED FOR THE SESSION (rule 1; apr_A)" in line


# ---- the bridge ------------------------------------------------------------------------------


class FakeChain:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []
        self.fail_on: str | None = None

    def append(self, type: str, data: Mapping[str, Any]) -> None:
        if type == self.fail_on:
            raise AuditError("disk full")
        self.records.append((type, dict(data)))


class Harness:
    def __init__(self) -> None:
        self.chain = FakeChain()
        self.client: list[dict[str, Any]] = []
        self.server: list[dict[str, Any]] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        # What the chain held when each message reached the server.
        self.records_at_forward: list[list[str]] = []

        def to_server(b: bytes) -> None:
            self.records_at_forward.append([t for t, _ in self.chain.records])
            self.server.append(json.loads(b))

        self.bridge = Bridge(
            profile=Profile(
                name="t", mcp_policy=RULES, mcp=McpSettings(approval_timeout_seconds=5)
            ),
            session_id="sess_T",
            chain=self.chain,
            to_client=lambda b: self.client.append(json.loads(b)),
            to_server=to_server,
            emit=lambda t, **d: self.events.append((t, d)),
        )

    def call(self, i: int, tool: str) -> None:
        msg = {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": tool, "arguments": {"n": i}},
        }
        self.bridge.on_client_frame(Line(json.dumps(msg).encode()))

    def pending(self, n: int) -> store.PendingRequest:
        _wait_for(lambda: len(self.of("approval.pending")) >= n)
        return store.load(self.of("approval.pending")[n - 1]["approval_id"])

    def of(self, etype: str) -> list[dict[str, Any]]:
        return [d for t, d in self.events if t == etype]


def _wait_for(cond: Callable[[], Any], timeout: float = 10) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_the_bridge_forwards_later_calls_under_a_grant_and_records_it_first() -> None:
    h = Harness()
    h.call(1, "write_file")
    p = h.pending(1)
    assert p.grantable
    assert store.answer(p.approval_id, p.digest, store.APPROVE, scope=store.SCOPE_SESSION)
    _wait_for(lambda: h.server)
    grant_rec = next(d for t, d in h.chain.records if t == "mcp.grant")
    decided = next(d for t, d in h.chain.records if t == "approval.decided")
    assert decided["scope"] == "session" and decided["grant"] == grant_rec["grant_id"]
    assert grant_rec["rule"] == 1 and grant_rec["tool"] == "write_file"
    assert grant_rec["approval_id"] == p.approval_id
    # The grant was in the chain before the approved call itself went on.
    assert "mcp.grant" in h.records_at_forward[0]
    assert [e["grant_id"] for e in h.of("approval.granted")] == [grant_rec["grant_id"]]

    h.call(2, "write_file")  # same rule, same tool: no prompt, forwarded at once
    assert [m["id"] for m in h.server] == [1, 2]
    assert len(h.of("approval.pending")) == 1
    req2 = next(d for t, d in h.chain.records if t == "mcp.request" and d["id"] == 2)
    assert req2["grant"] == grant_rec["grant_id"] and req2["decision"] == "auto_allow"
    assert req2["rule"] == 1

    h.call(3, "echo")  # another rule: still prompts
    h.call(4, "run_shell")  # a deny: still denied
    q = h.pending(2)
    assert q.tool == "echo" and [m["id"] for m in h.server] == [1, 2]
    assert h.client[-1]["id"] == 4 and h.client[-1]["result"]["isError"] is True
    h.bridge.shutdown("end")
    h.call(5, "write_file")  # after the session's end the grant is gone
    assert [m["id"] for m in h.server] == [1, 2]


def test_a_grant_whose_record_fails_is_not_made() -> None:
    h = Harness()
    h.chain.fail_on = "mcp.grant"
    h.call(1, "write_file")
    p = h.pending(1)
    store.answer(p.approval_id, p.digest, store.APPROVE, scope=store.SCOPE_SESSION)
    _wait_for(lambda: h.server)  # the approved call itself goes on (its approval is recorded)
    assert h.of("approval.granted") == [] and len(h.bridge.grants) == 0
    h.call(2, "write_file")
    h.pending(2)  # prompts again
    assert [m["id"] for m in h.server] == [1]
    h.bridge.shutdown("end")


def test_a_plain_approval_makes_no_grant() -> None:
    h = Harness()
    h.call(1, "write_file")
    p = h.pending(1)
    store.answer(p.approval_id, p.digest, store.APPROVE)
    _wait_for(lambda: h.server)
    decided = next(d for t, d in h.chain.records if t == "approval.decided")
    assert "scope" not in decided and "grant" not in decided
    h.call(2, "write_file")
    h.pending(2)
    assert [m["id"] for m in h.server] == [1]
    h.bridge.shutdown("end")


def test_a_prompt_past_a_real_rate_is_never_grantable_and_offers_no_s() -> None:
    """With the session's own rate counters (`policy.SessionPolicy`): the second call of a
    `1/h` auto_allow rule prompts, and neither the book nor the request file offers a grant."""
    from linpodx.mcp.policy import SessionPolicy
    from linpodx.profile.mcprule import parse_rate

    rated = (McpRule("tools/call", A.AUTO_ALLOW, "run_tests", rate=parse_rate("1/h")),)
    session = SessionPolicy(rated, clock=lambda: 100.0)
    assert session.decide("tools/call", "run_tests", {}).action is A.AUTO_ALLOW
    past = session.decide("tools/call", "run_tests", {})
    assert past.action is A.PROMPT and past.rate_limited
    assert grants.refusal(rated, past, "tools/call", "run_tests") is not None
    book = grants.GrantBook("sess_A", rated)
    with pytest.raises(ValueError):
        book.make(past, "tools/call", "run_tests", "apr_X")

    chain = FakeChain()
    bridge = Bridge(
        profile=Profile(name="t", mcp_policy=rated, mcp=McpSettings(approval_timeout_seconds=5)),
        session_id="sess_T",
        chain=chain,
        to_client=lambda b: None,
        to_server=lambda b: None,
        emit=lambda t, **d: None,
    )
    for i in (1, 2):
        msg = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "run_tests"}}
        bridge.on_client_frame(Line(json.dumps(msg).encode()))
    _wait_for(lambda: store.pending_requests())
    (p,) = store.pending_requests()
    assert p.grantable is False
    with pytest.raises(InvalidInput):
        store.answer(p.approval_id, p.digest, store.APPROVE, scope=store.SCOPE_SESSION)
    bridge.shutdown("end")


def test_a_grant_never_covers_an_argument_its_rule_could_not_judge() -> None:
    """A prompt rule matches a value it cannot judge (so that value never slips past it into a
    looser rule); a grant for that rule must not then allow such a value unseen: a path above
    its root, a non-string, or `PATH` beside `path` (a Go server reads the last)."""
    from linpodx.profile.mcprule import Matcher

    rules = (
        McpRule(
            "tools/call", A.PROMPT, "write_file", arguments=(("path", Matcher("glob", "/tmp/**")),)
        ),
        McpRule("tools/call", A.DENY),
    )
    book = grants.GrantBook("sess_A", rules)

    def call(args: dict[str, Any]) -> Decision:
        return evaluate(
            rules, "tools/call", "write_file", {"name": "write_file", "arguments": args}
        )

    first = call({"path": "/tmp/a"})
    assert book.add(book.make(first, "tools/call", "write_file", "apr_X"))
    assert book.apply(call({"path": "/tmp/b"}), "tools/call", "write_file")[1] is not None
    for args in (
        {"path": "/../etc/passwd"},
        {"path": ["/etc/passwd"]},
        {"path": "/tmp/a", "PATH": "/etc/passwd"},
        {"path": "/tmp/a\0/../../etc/passwd"},
    ):
        d = call(args)
        assert d.action is A.PROMPT and d.rule_index == 0, args  # still stopped by the rule
        assert book.apply(d, "tools/call", "write_file") == (d, None), args
        with pytest.raises(ValueError, match="judge"):
            book.make(d, "tools/call", "write_file", "apr_Y")
