"""Policy engine: first match wins, default deny, housekeeping passes."""

from __future__ import annotations

import pytest

from linpodx.mcp import policy
from linpodx.profile.model import Decision as A
from linpodx.profile.model import McpRule

RULES = (
    McpRule("tools/call", A.AUTO_ALLOW, "read_file"),
    McpRule("tools/call", A.PROMPT, "write_file"),
    McpRule("tools/call", A.DENY, "*"),
    McpRule("resources/read", A.AUTO_ALLOW),
)


@pytest.mark.parametrize(
    ("method", "tool", "action", "rule"),
    [
        ("tools/call", "read_file", A.AUTO_ALLOW, 0),
        ("tools/call", "write_file", A.PROMPT, 1),
        ("tools/call", "run_shell", A.DENY, 2),
        ("tools/call", None, A.DENY, 2),
        ("resources/read", None, A.AUTO_ALLOW, 3),
        ("prompts/get", None, A.DENY, None),
        ("tools/call ", "read_file", A.DENY, None),
        ("tools\uff0fcall", "read_file", A.DENY, None),
        ("Tools/call", "read_file", A.DENY, None),
        ("initialize", None, A.AUTO_ALLOW, None),
        ("server/discover", None, A.AUTO_ALLOW, None),
        ("tools/list", None, A.AUTO_ALLOW, None),
        ("notifications/cancelled", None, A.AUTO_ALLOW, None),
    ],
)
def test_table(method: str, tool: str | None, action: A, rule: int | None) -> None:
    d = policy.evaluate(RULES, method, tool)
    assert (d.action, d.rule_index) == (action, rule)


def test_first_match_wins() -> None:
    rules = (McpRule("*", A.DENY), McpRule("tools/call", A.AUTO_ALLOW))
    assert policy.evaluate(rules, "tools/call", "x").action is A.DENY
    rules = (McpRule("tools/call", A.AUTO_ALLOW), McpRule("*", A.DENY))
    assert policy.evaluate(rules, "tools/call", "x").action is A.AUTO_ALLOW


def test_tool_rule_only_matches_tools_call() -> None:
    rules = (McpRule("*", A.AUTO_ALLOW, "read_file"),)
    assert policy.evaluate(rules, "resources/read", None).action is A.DENY
    assert policy.evaluate(rules, "tools/call", "read_file").action is A.AUTO_ALLOW


def test_housekeeping_passes_even_under_a_deny_all_profile() -> None:
    rules = (McpRule("*", A.DENY),)
    for m in sorted(policy.CLIENT_HOUSEKEEPING):
        assert policy.evaluate(rules, m).allowed, m
    assert not policy.evaluate(rules, "tools/call", "read_file").allowed


def test_empty_rules_deny() -> None:
    d = policy.evaluate((), "tools/call", "read_file")
    assert d.action is A.DENY and "default deny" in d.reason


def test_server_requests() -> None:
    for m in ("sampling/createMessage", "elicitation/create", "roots/list", "anything/else"):
        assert not policy.evaluate_server_request((), m).allowed
    assert policy.evaluate_server_request(
        ("sampling/createMessage",), "sampling/createMessage"
    ).allowed
    assert policy.evaluate_server_request((), "ping").allowed
    assert policy.evaluate_server_notification("notifications/progress").allowed
    assert not policy.evaluate_server_notification("notifications/whatever").allowed


def test_decision_is_frozen() -> None:
    d = policy.evaluate(RULES, "tools/call", "read_file")
    with pytest.raises(AttributeError):
        d.action = A.DENY  # type: ignore[misc]
