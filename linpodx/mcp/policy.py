"""The gate's policy engine: pure, no I/O. Rules in order, first match wins, default deny.

Protocol housekeeping (handshake, discovery lists, ping, cancellation/progress, the session's
log level) always passes:
without it no client can even connect, and none of it runs a tool. The lists are explicit and
compared exactly; anything else (including `tools/call ` with a trailing space or a full-width
slash) must match a rule or it is denied.

A rule may also name a tool's arguments (each matched by `linpodx.profile.mcprule`) and a rate.
`evaluate` is the rules alone; a session holds a `SessionPolicy`, which also counts each rated
rule's matches and decides `prompt` past the rate.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    matched: tuple[str, ...] = ()
    """The arguments the rule matched on (shown first to a person asked to approve)."""
    rate_limited: bool = False
    """True when the decision is `prompt` because the rule's `rate:` was passed: a session
    grant (`mcp.grants`) never lifts that."""
    unjudged: bool = False
    """True when the rule (a `prompt` or `deny` one) matched only because an argument could not
    be judged (not a string, a path with `..`, `PATH` beside `path`): a session grant
    never covers such a call, or it would allow a value no rule allowed."""

    @property
    def allowed(self) -> bool:
        return self.action is Action.AUTO_ALLOW


def _matches(
    rule: McpRule, method: str, tool_name: str | None, params: Any, lenient: bool | None = None
) -> bool:
    if rule.method != "*" and rule.method != method:
        return False
    if rule.tool_name is not None and rule.tool_name != "*":
        # A rule naming a tool only matches a tools/call for exactly that tool.
        if method != "tools/call" or tool_name != rule.tool_name:
            return False
    if rule.arguments:
        # Every named argument present and matching. A named argument that is missing (or
        # no `arguments` at all) matches no rule that names one: nothing is there to use.
        args = params.get("arguments") if isinstance(params, Mapping) else None
        if lenient is None:
            lenient = rule.decision is Action.AUTO_ALLOW
        if method != "tools/call":
            return False
        if not isinstance(args, Mapping):
            # `arguments` that are there but no object cannot be judged (see below).
            return args is not None and not lenient
        for name, matcher in rule.arguments:
            folded = name.casefold()
            if any(k != name and k.casefold() == folded for k in args):
                # `Path` or `PATH` beside (or instead of) `path`: Go's encoding/json binds
                # keys to fields case-insensitively, the last one winning, so the server may
                # read a value the gate did not judge. Unjudgeable, as below.
                if lenient:
                    return False
                continue
            if name not in args:
                return False
            verdict = matcher.judge(args[name])
            # A value the matcher cannot judge (not a string, NUL, a path with `..`)
            # never lets a rule allow, and never lets a call pass a deny or prompt rule.
            if verdict is False or (verdict is None and lenient):
                return False
    return True


def _describe(index: int, rule: McpRule) -> str:
    what = f"rule {index} ({rule.method}"
    what += f" {rule.tool_name}" if rule.tool_name else ""
    if rule.arguments:
        what += " " + ", ".join(f"{name}~{m.kind}" for name, m in rule.arguments)
    return what + ")"


def refusal(
    kind: str, method: str, params: Mapping[str, Any] | None, may_hold_proto: bool = True
) -> Decision | None:
    """A deny for a client message no rule may see, else None.

    - a request-only method sent as a notification (`kind` is `notification`);
    - a `tools/call` whose `params.name` is not a string: the rules compare names exactly and
      a name that is no string matches no named rule, so a catch-all would decide it, while a
      server may read `["run_shell"]` as `run_shell`;
    - a `tools/call` whose name has whitespace around it or a character that is not printable
      (`str.isprintable`: controls, format characters such as U+200B/U+FEFF, separators other
      than the space): a server that trims or cleans names runs another tool than a deny
      rule named;
    - a `tools/call` whose params hold `name`, `arguments` or `_meta` in another case (`Name`,
      `ARGUMENTS`): a server that binds keys case-insensitively may read those instead;
    - a `tools/call` with a `__proto__` key anywhere in its params (`may_hold_proto` False:
      the frame's bytes cannot spell it, `jsonrpc.Message.may_hold_proto`, and the walk is
      skipped).
    """
    if kind == "notification" and method in REQUEST_METHODS:
        return Decision(Action.DENY, None, f"{method} is a request and was sent without an id")
    if method == "tools/call":
        name = (params or {}).get("name")
        if not isinstance(name, str):
            return Decision(Action.DENY, None, "tools/call without a string params.name")
        if not name.isprintable() or name.strip() != name:
            # `run_shell ` is not `run_shell` to the rules, but a server that trims names
            # (or drops control characters) runs run_shell; MCP names (SEP-986) are printable
            # ASCII without spaces, so nothing a server registers looks so.
            return Decision(
                Action.DENY,
                None,
                "tools/call whose name has whitespace around it or unprintable characters",
            )
    if (
        method == "tools/call"
        and params
        and any(k not in _CALL_KEYS and k.casefold() in _CALL_KEYS for k in params)
    ):
        # `Name` beside `name` (or `Arguments` for `arguments`): Go's encoding/json fills its
        # `Name` field from either key, the last one winning, so the server would run another
        # tool, or read other arguments, than the rules saw.
        return Decision(
            Action.DENY, None, "tools/call with name, arguments or _meta in another case"
        )
    if method == "tools/call" and params and may_hold_proto and _holds_proto(params):
        # JSON.parse makes `__proto__` an own key, but JavaScript that copies the object by
        # assignment (`Object.assign({}, args)`) makes it the copy's prototype, whose keys
        # (`path`) the copy then reads as its own: arguments the rules never saw; a deep
        # merge of a nested one sets Object.prototype's keys for every object of the server.
        return Decision(
            Action.DENY, None, "tools/call with a __proto__ key (a prototype to JavaScript)"
        )
    return None


_PROTO = "__proto__"


def _holds_proto(value: Mapping[str, Any]) -> bool:
    """Whether a `__proto__` key is in `value` at any depth (its parsed keys: an escaped
    spelling is the same key). Parsed JSON nests at most MAX_DEPTH deep; no recursion."""
    todo: list[Any] = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            if _PROTO in item:
                return True
            todo.extend(v for v in item.values() if isinstance(v, (dict, list)))
        else:
            todo.extend(v for v in item if isinstance(v, (dict, list)))
    return False


_CALL_KEYS = frozenset({"name", "arguments", "_meta"})
"""The keys of a `tools/call`'s params that MCP defines (see `refusal`)."""


def evaluate(
    rules: Sequence[McpRule],
    method: str,
    tool_name: str | None = None,
    params: Any = None,
    reasons: dict[int, str] | None = None,
) -> Decision:
    """Decide a client → server request or notification by the rules alone (no rates: a
    session decides through `SessionPolicy`). `reasons`: the matched rules' reasons, kept
    across calls by the caller (a rule's reason never changes)."""
    if method in CLIENT_HOUSEKEEPING:
        return Decision(Action.AUTO_ALLOW, None, "protocol housekeeping")
    for index, rule in enumerate(rules):
        if _matches(rule, method, tool_name, params):
            unjudged = bool(rule.arguments) and not _matches(
                rule, method, tool_name, params, lenient=True
            )
            reason = reasons.get(index) if reasons is not None else None
            if reason is None:
                reason = f"{_describe(index, rule)}: {rule.decision.value}"
                if reasons is not None:
                    reasons[index] = reason
            return Decision(
                rule.decision,
                index,
                reason,
                tuple(name for name, _m in rule.arguments),
                unjudged=unjudged,
            )
    return Decision(Action.DENY, None, "no rule matches (default deny)")


class SessionPolicy:
    """The rules of one session, with the counters of its rated rules.

    A rated rule's match is counted when the rule's own decision (`auto_allow`) is given; past
    `count` such decisions in the last `seconds`, a match is decided `prompt` instead, and is
    not counted (so the rule is back once older matches age out). Each counter keeps at most
    `count` times (`mcprule.MAX_RATE`), whatever the client sends.
    """

    def __init__(
        self, rules: Sequence[McpRule], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rules = tuple(rules)
        self._clock = clock
        self._lock = threading.Lock()
        self._reasons: dict[int, str] = {}  # (`evaluate`'s, per rule)
        self._seen: dict[int, collections.deque[float]] = {
            i: collections.deque() for i, r in enumerate(self.rules) if r.rate is not None
        }

    def decide(self, method: str, tool_name: str | None, params: Any) -> Decision:
        """`evaluate`, then the matched rule's rate."""
        decision = evaluate(self.rules, method, tool_name, params, self._reasons)
        index = decision.rule_index
        if index is None or index not in self._seen:
            return decision
        rate = self.rules[index].rate
        if rate is None:  # _seen holds rated rules only
            return decision
        now = self._clock()
        with self._lock:
            seen = self._seen[index]
            while seen and seen[0] <= now - rate.seconds:
                seen.popleft()
            if len(seen) < rate.count:
                seen.append(now)
                return decision
        return Decision(
            Action.PROMPT,
            index,
            f"{_describe(index, self.rules[index])}: rate {rate.text} exceeded "
            f"({rate.count} auto-allowed in the last {rate.seconds}s): prompt",
            decision.matched,
            rate_limited=True,
            unjudged=decision.unjudged,
        )


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
