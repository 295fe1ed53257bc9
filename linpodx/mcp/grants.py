"""Session grants: "approve this and every later call like it in this session".

A person answers `s` at a listener's `approve? [y/N/s]:` (or runs `linpodx approve ID
--for-session`); the bridge then makes a grant bound to three things of the call that was
approved: the rule that decided it (its index in the profile's `mcp_policy`), the method and
the tool name. A later call of the same session is forwarded under the grant only when the
policy decided it by that same rule, with that same method and tool name, and decided `prompt`
because the rule says `prompt`. So a grant never widens past its rule (a call that a different
rule matches, or the same catch-all rule with another tool, still prompts), never turns a
`deny` into an allow, and never lifts a rate limit (a call that is `prompt` because its rule's
`rate:` was passed keeps prompting). Grants live in the bridge's memory only: they end with
the session, and no file or answer can bring one back.

The book is pure (no I/O, no clock of its own): the bridge records each grant in the session's
audit chain before it adds it, and records the grant's id with every call forwarded under it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from linpodx import ids
from linpodx.mcp.policy import Decision
from linpodx.profile.model import Decision as Action
from linpodx.profile.model import McpRule

GRANTS_MAX = 256
"""Grants one session holds at most; each comes from a person's answer, so this is far more
than anyone gives by hand, and it keeps the book's memory bounded whatever a client sends."""


@dataclass(frozen=True)
class Grant:
    """One session grant: calls decided by `rule_index` for `method` and `tool` pass."""

    grant_id: str
    """`grt_<ULID>`: what the grant's audit record and the records of its calls name."""
    session: str
    rule_index: int
    method: str
    tool: str | None
    """The exact tool name (`params.name` of a `tools/call`); None for other methods."""
    approval_id: str
    """The approval whose answer made the grant."""


def refusal(
    rules: Sequence[McpRule], decision: Decision, method: str, tool: str | None
) -> str | None:
    """Why no grant may be made for (or applied to) a call with this decision; None if one may.

    Pure and total: every path that is not plainly "the rule itself says prompt" refuses."""
    if decision.action is not Action.PROMPT:
        return f"the call's decision is {decision.action.value}, not prompt"
    index = decision.rule_index
    if index is None or not 0 <= index < len(rules):
        return "no rule decided the call"
    if rules[index].decision is not Action.PROMPT:
        # e.g. an auto_allow rule that became prompt past its `rate:`: a grant would lift the
        # rate limit.
        return f"rule {index} says {rules[index].decision.value}, not prompt"
    if decision.rate_limited:
        return "the call prompts because its rule's rate limit was passed"
    if decision.unjudged:
        # The rule matched only because it could not judge an argument (a path above its
        # root, a non-string, `PATH` beside `path`): allowing that would allow what no rule did.
        return "an argument of the call could not be judged against its rule"
    if not isinstance(method, str) or not (tool is None or isinstance(tool, str)):
        return "the call has no plain method and tool name"
    if method != "tools/call" or tool is None:
        # A grant is bound to the tool; without one (`resources/read`, `prompts/get`) it would
        # pass every later call of the method, whatever resource or prompt it names.
        return "only a tools/call can be approved for the session"
    return None


class GrantBook:
    """The grants of one session (thread-safe: the reader and the approval threads use it)."""

    def __init__(self, session: str, rules: Sequence[McpRule]) -> None:
        self.session = session
        self._rules = tuple(rules)
        self._lock = threading.Lock()
        self._grants: dict[tuple[int, str, str | None], Grant] = {}
        self._closed = False

    def make(self, decision: Decision, method: str, tool: str | None, approval_id: str) -> Grant:
        """A new grant for calls like this one, not yet in force (`add` puts it in force once
        its record is written). ValueError when none may be made (`refusal`)."""
        why = refusal(self._rules, decision, method, tool)
        if why is None and self._closed:
            why = "the session has ended"
        if why is None and len(self._grants) >= GRANTS_MAX:
            why = f"the session holds {GRANTS_MAX} grants already"
        index = decision.rule_index
        if why is not None or index is None:  # (refusal says why when there is no index)
            raise ValueError(why or "no rule decided the call")
        return Grant(ids.new_id("grt"), self.session, index, method, tool, approval_id)

    def add(self, grant: Grant) -> bool:
        """Put `grant` in force; False when the session ended meanwhile (it is not added).
        A grant for the same rule, method and tool already in force stays (the first)."""
        if grant.session != self.session:
            return False
        with self._lock:
            if self._closed:
                return False
            self._grants.setdefault((grant.rule_index, grant.method, grant.tool), grant)
            return True

    def find(self, decision: Decision, method: str, tool: str | None) -> Grant | None:
        """The grant a call with this decision is forwarded under, or None (it prompts)."""
        index = decision.rule_index
        if decision.action is not Action.PROMPT:
            return None  # (every call that is no prompt, before `refusal` builds its reason)
        if index is None or refusal(self._rules, decision, method, tool) is not None:
            return None
        with self._lock:
            if self._closed:
                return None
            return self._grants.get((index, method, tool))

    def apply(
        self, decision: Decision, method: str, tool: str | None
    ) -> tuple[Decision, str | None]:
        """The bridge's decision step: a `prompt` that a grant covers becomes an allow that
        names the grant (its id goes into the call's record); anything else is unchanged."""
        grant = self.find(decision, method, tool)
        if grant is None:
            return decision, None
        allowed = Decision(
            Action.AUTO_ALLOW,
            decision.rule_index,
            f"session grant {grant.grant_id} ({decision.reason})",
        )
        return allowed, grant.grant_id

    def close(self) -> int:
        """End every grant (the session ends); returns how many there were."""
        with self._lock:
            self._closed = True
            n = len(self._grants)
            self._grants.clear()
            return n

    def __len__(self) -> int:
        with self._lock:
            return len(self._grants)


def record(grant: Grant, shorten: Callable[[Any], Any]) -> dict[str, Any]:
    """The grant's audit record (`mcp.grant`) and event (`approval.granted`) data; `shorten`
    makes a client's text fit a record (the bridge's `short`)."""
    return {
        "grant_id": grant.grant_id,
        "approval_id": grant.approval_id,
        "rule": grant.rule_index,
        "method": shorten(grant.method),
        "tool": shorten(grant.tool),
    }
