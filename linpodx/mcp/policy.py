"""The gate's policy engine: pure, no I/O. Rules in order, first match wins, default deny.

Protocol housekeeping (handshake, discovery lists, ping, cancellation/progress, the session's
log level) always passes:
without it no client can even connect, and none of it runs a tool. The lists are explicit and
compared exactly; anything else (including `tools/call ` with a trailing space or a full-width
slash) must match a rule or it is denied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from linpodx.profile.model import Decision as Action
from linpodx.profile.model import McpRule

# Client → server methods that always pass (MCP 2024-11-05 … 2026-07-28).
CLIENT_HOUSEKEEPING: frozenset[str] = frozenset(
    {
        "initialize",
        "notifications/initialized",
        "ping",
        "server/discover",  # 2026-07-28: stateless discovery replacing the handshake
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "prompts/list",
        "notifications/cancelled",
        "notifications/progress",
        "notifications/roots/list_changed",
        # Sets how much the server logs to this session (notifications/message): no effect
        # outside the session, runs no tool.
        "logging/setLevel",
    }
)

# Methods MCP defines as requests (2024-11-05 … 2026-07-28), either direction. Sent without an
# id (as a notification) one of these is refused: the rules, the approval and the record are
# all made for a call that is answered, and a notification has no answer to carry a denial.
REQUEST_METHODS: frozenset[str] = frozenset(
    {
        "initialize",
        "ping",
        "server/discover",
        "tools/list",
        "tools/call",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "prompts/list",
        "prompts/get",
        "logging/setLevel",
        "completion/complete",
        "sampling/createMessage",
        "roots/list",
        "elicitation/create",
        "tasks/get",
        "tasks/result",
        "tasks/list",
        "tasks/cancel",
        "subscriptions/listen",
    }
)

# Server → client notifications that pass: progress, logging and list-changed signals.
SERVER_NOTIFICATIONS: frozenset[str] = frozenset(
    {
        "notifications/cancelled",
        "notifications/progress",
        "notifications/message",
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/resources/updated",
        "notifications/prompts/list_changed",
        "notifications/elicitation/complete",
        "notifications/tasks/status",
        "notifications/subscriptions/acknowledged",
    }
)

# Server → client requests that pass without profile permission (a liveness check only).
SERVER_HOUSEKEEPING: frozenset[str] = frozenset({"ping"})


@dataclass(frozen=True)
class Decision:
    """What the gate decided for one message."""

    action: Action
    rule_index: int | None
    """Index of the matching rule in the profile's `mcp_policy`, None when no rule decided."""
    reason: str
    rate_limited: bool = False
    """True when the decision is `prompt` only because the rule's `rate:` was passed: a
    session grant (`mcp.grants`) never lifts that."""

    @property
    def allowed(self) -> bool:
        return self.action is Action.AUTO_ALLOW


def _matches(rule: McpRule, method: str, tool_name: str | None) -> bool:
    if rule.method != "*" and rule.method != method:
        return False
    if rule.tool_name is None or rule.tool_name == "*":
        return True
    # A rule naming a tool only matches a tools/call for exactly that tool.
    return method == "tools/call" and tool_name == rule.tool_name


def refusal(kind: str, method: str, params: Mapping[str, Any] | None) -> Decision | None:
    """A deny for a client message no rule may see, else None.

    - a request-only method sent as a notification (`kind` is `notification`);
    - a `tools/call` whose `params.name` is not a string: the rules compare names exactly and
      a name that is no string matches no named rule, so a catch-all would decide it, while a
      server may read `["run_shell"]` as `run_shell`.
    """
    if kind == "notification" and method in REQUEST_METHODS:
        return Decision(Action.DENY, None, f"{method} is a request and was sent without an id")
    if method == "tools/call" and not isinstance((params or {}).get("name"), str):
        return Decision(Action.DENY, None, "tools/call without a string params.name")
    return None


def evaluate(rules: Sequence[McpRule], method: str, tool_name: str | None = None) -> Decision:
    """Decide a client → server request or notification."""
    if method in CLIENT_HOUSEKEEPING:
        return Decision(Action.AUTO_ALLOW, None, "protocol housekeeping")
    for index, rule in enumerate(rules):
        if _matches(rule, method, tool_name):
            what = f"rule {index} ({rule.method}"
            what += f" {rule.tool_name})" if rule.tool_name else ")"
            return Decision(rule.decision, index, f"{what}: {rule.decision.value}")
    return Decision(Action.DENY, None, "no rule matches (default deny)")


def evaluate_server_request(allowed: Iterable[str], method: str) -> Decision:
    """Decide a server → client request (sampling, elicitation, roots, …)."""
    if method in SERVER_HOUSEKEEPING:
        return Decision(Action.AUTO_ALLOW, None, "protocol housekeeping")
    if method in set(allowed):
        return Decision(Action.AUTO_ALLOW, None, "allowed by mcp.allow_server_requests")
    return Decision(
        Action.DENY, None, "server requests are denied unless mcp.allow_server_requests lists them"
    )


def evaluate_server_notification(method: str) -> Decision:
    """Decide a server → client notification."""
    if method in SERVER_NOTIFICATIONS:
        return Decision(Action.AUTO_ALLOW, None, "protocol notification")
    return Decision(Action.DENY, None, "unknown server notification")
