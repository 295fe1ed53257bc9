"""Top-level commands `linpodx events`, `linpodx approve ID`, `linpodx deny ID`.

`events` follows the event stream file by polling (like `podman events` with its file logger,
no daemon), in bounded memory; a damaged line is skipped, never the end of a listener (see
`linpodx.events.reader.EventFile`). With approvals in the filter and a terminal on stdin, each
pending approval is shown and answered right there: the answer is bound to the digest of the request
file this listener displayed, and it comes only from this terminal (input typed ahead is
discarded first), so a "y" inside a payload or server output can never answer anything.
"""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TextIO

import typer

from linpodx import ids
from linpodx.approvals import elsewhere
from linpodx.approvals import store as approvals
from linpodx.approvals.prompter import Prompter
from linpodx.cli.common import JsonOpt, new_app, run_command
from linpodx.errors import (
    EXIT_INTERRUPTED,
    CommandFailed,
    Conflict,
    InvalidInput,
    LinpodxError,
    NotFound,
    UsageError,
)
from linpodx.events import EVENT_TYPES
from linpodx.events.reader import EventFile
from linpodx.output import safe_text
from linpodx.paths import state_dir

POLL_SECONDS = 0.1
FIELD_CAP = 200
PAYLOAD_CAP = 1000

_REL = re.compile(r"^([0-9]+)([smhd])\Z")  # not \d, which takes fullwidth and other digits


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """`--since`: an ISO 8601 time (`2026-11-30T04:00:00Z`) or a duration ago (`90s`, `5m`)."""
    now = now or datetime.now(UTC)
    m = _REL.match(value.strip())
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}[m.group(2)]
        try:
            return now - timedelta(**{unit: int(m.group(1))})
        except (OverflowError, ValueError):  # before year 1, or past what timedelta holds
            raise UsageError(
                f"--since {value} reaches back before the year 1",
                "use a shorter duration, or an ISO time like 2026-11-30T04:00:00Z",
            ) from None
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"invalid --since value: {value!r}",
            "use an ISO time like 2026-11-30T04:00:00Z or a duration like 10m",
        ) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _event_time(event: dict[str, Any]) -> datetime | None:
    """The event's `ts` in UTC, or None when it has no time we can use.

    linpodx writes `…Z`; anything else is damage and is treated like a `ts` that does not parse:
    shown as `??:??:??`, left out by --since. That includes a time without a zone (it cannot be
    compared with --since's) and one that leaves datetime's range once converted to UTC
    (`0001-01-01T00:00:00+14:00`).
    """
    ts = event.get("ts")
    if not isinstance(ts, str):
        return None
    try:
        t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        return t.astimezone(UTC) if t.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None


def check_filters(filters: list[str]) -> list[str]:
    """`--filter` values, each an event type or its first component; UsageError otherwise.

    An unknown one (a typo: `aproval`) would match nothing, and would also turn off the
    approval prompter, which only listens when approvals are in the filter."""
    valid = sorted({*EVENT_TYPES, *(t.split(".")[0] for t in EVENT_TYPES)})
    for f in filters:
        if f not in valid:
            raise UsageError(
                f"unknown event type for --filter: {safe_text(f, 80)}",
                f"use one of: {', '.join(valid)}",
            )
    return filters


def matches(event: dict[str, Any], filters: list[str]) -> bool:
    """`--filter approval` matches `approval.pending`; `--filter approval.pending` only that."""
    if not filters:
        return True
    etype = event.get("type")
    if not isinstance(etype, str):
        return False
    return any(etype == f or etype.startswith(f + ".") for f in filters)


def _clock(event: dict[str, Any]) -> str:
    t = _event_time(event)
    if t is None:
        return "??:??:??"
    try:
        return t.astimezone().strftime("%H:%M:%S")
    except (OverflowError, ValueError, OSError):  # a UTC time near year 9999 in a zone east of it
        return "??:??:??"


def _s(value: Any, cap: int = FIELD_CAP) -> str:
    return safe_text("-" if value is None else str(value), cap)


def _field_lines(event: dict[str, Any]) -> list[str] | None:
    """`  key: value (N chars)` per key of a pending request, or None when the event has no
    well-formed `fields` (an older writer: its `payload` is shown instead)."""
    fields = event.get("fields")
    if not isinstance(fields, list) or not fields:
        return None
    lines = []
    for item in fields[: approvals.FIELDS_MAX]:
        if not (isinstance(item, list) and len(item) == 3):
            return None
        key, value, size = item
        text = f"  {_s(key, approvals.KEY_CAP + 40)}: {_s(value, approvals.VALUE_CAP + 1)}"
        if type(size) is int:
            text += f" ({size:,} chars)"
        lines.append(text)
    more = event.get("fields_more")
    if type(more) is int and more > 0:
        lines.append(
            f"  … {more:,} more keys: linpodx approvals show {_s(event.get('approval_id'))}"
        )
    return lines


def render(event: dict[str, Any]) -> list[str]:
    """Human lines for one event; every value from outside is escaped and capped."""
    etype = event.get("type")
    head = f"[{_clock(event)}] {_s(event.get('session', ''))}".rstrip()
    if etype == "approval.pending":
        what = " ".join(
            x
            for x in (
                _s(event.get("method")),
                _s(event.get("tool"), FIELD_CAP) if event.get("tool") else "",
            )
            if x
        )
        body = _field_lines(event)
        if body is None:
            body = [f"payload: {_s(event.get('payload'), PAYLOAD_CAP)}"]
        why = [f"why: {_s(event.get('reason'), 1000)}"] if event.get("reason") else []
        return [
            f"{head} {what} → PROMPT",
            *why,
            *body,
            f"approval_id: {_s(event.get('approval_id'))}",
        ]
    if etype == "approval.decided":
        raw_by = event.get("by")
        by: dict[str, Any] = raw_by if isinstance(raw_by, dict) else {}
        who = "linpodx" if by.get("bridge") else f"{_s(by.get('user'))}@{_s(by.get('tty'))}"
        scope = " FOR THE SESSION" if event.get("scope") == "session" else ""
        lines = [
            f"{head} {_s(event.get('approval_id'))} → {_s(event.get('decision')).upper()}{scope} "
            f"({_s(event.get('reason'))}; by {who})"
        ]
        if event.get("grant_refused"):
            lines.append(f"  no session grant: {_s(event.get('grant_refused'))}")
        return lines
    if etype == "approval.granted":
        what = " ".join(
            x
            for x in (_s(event.get("method")), _s(event.get("tool")) if event.get("tool") else "")
            if x
        )
        return [
            f"{head} {_s(event.get('grant_id'))} {what} → GRANTED FOR THE SESSION "
            f"(rule {_s(event.get('rule'))}; {_s(event.get('approval_id'))})"
        ]
    if etype == "mcp.decision":
        what = " ".join(
            x
            for x in (_s(event.get("method")), _s(event.get("tool")) if event.get("tool") else "")
            if x
        )
        return [f"{head} {what} → {_s(event.get('decision')).upper()}"]
    if isinstance(event.get("message"), str):
        # Events that carry their own sentence (`dns lookup denied for NAME`) read as one line.
        where = event.get("container") or event.get("session")
        parts = [f"[{_clock(event)}]", _s(where) if where else "", _s(event["message"])]
        # A sentence that already gives its reason (`egress denied: … (REASON)`) gets it once.
        detail = [
            _s(event[k])
            for k in ("qtype", "reason")
            if event.get(k) and f"({event[k]})" not in event["message"]
        ]
        if detail:
            parts.append(f"({', '.join(detail)})")
        return [" ".join(p for p in parts if p)]
    rest = {k: v for k, v in event.items() if k not in ("ts", "type", "session")}
    text = safe_text(json.dumps(rest, ensure_ascii=False, separators=(",", ":")), PAYLOAD_CAP)
    return [f"[{_clock(event)}] {_s(etype)} {text}".rstrip()]


def events_cmd(filters: list[str], since: str | None, json_mode: bool, no_follow: bool) -> None:
    """Print (and follow) the event stream.

    Ctrl-C is how a follower is stopped: it ends quietly (exit 0). A `--no-follow` listing cut
    short by Ctrl-C is incomplete, so it ends as other commands do: `error: interrupted`, 130.
    """
    check_filters(filters)
    since_t = parse_since(since) if since is not None else None
    out = sys.stdout
    wants_approvals = not filters or any(f in ("approval", "approval.pending") for f in filters)
    say_state_dir(wants_approvals)
    interactive = not json_mode and not no_follow and wants_approvals and sys.stdin.isatty()
    prompter = Prompter(sys.stdin, out, render) if interactive else None
    reader = EventFile()
    try:
        if not no_follow and since_t is None:
            reader.skip_to_end()
            if wants_approvals:
                _show_waiting(out, json_mode, prompter)
        while True:
            for event in reader.read_new():
                if not matches(event, filters):
                    continue
                t = _event_time(event)
                if since_t is not None and (t is None or t < since_t):
                    continue
                _show(event, out, json_mode, prompter)
            if no_follow:
                return
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        if no_follow:
            raise LinpodxError("interrupted", exit_code=EXIT_INTERRUPTED) from None
        return
    except BrokenPipeError:
        return


def say_state_dir(approvals_too: bool = True) -> str:
    """Name the state dir in use on stderr (once per command: a listener that sees nothing is
    most often listening to another one), and, for approvals, the other state dirs of this
    person where approvals wait (`approvals.elsewhere`)."""
    in_use = str(state_dir())
    lines = [f"state dir: {safe_text(in_use, 300)}"]
    if approvals_too:
        lines += elsewhere.notes(in_use)
    sys.stderr.write("".join(x + "\n" for x in lines))
    sys.stderr.flush()
    return in_use


def _show_waiting(out: TextIO, json_mode: bool, prompter: Prompter | None) -> None:
    """Show the requests made before this listener started: they still wait for someone."""
    for p in approvals.pending_requests():
        ev = {
            "ts": p.to_dict()["created"],
            "type": "approval.pending",
            "session": p.session,
            "approval_id": p.approval_id,
            "method": p.method,
            "tool": p.tool,
            "payload": p.payload,
            "fields": [f.to_list() for f in p.fields],
            "fields_more": p.fields_more,
            "reason": p.reason,
            "digest": p.digest,
        }
        _show(ev, out, json_mode, prompter)


def _show(event: dict[str, Any], out: TextIO, json_mode: bool, prompter: Prompter | None) -> None:
    if json_mode:
        out.write(json.dumps(event, ensure_ascii=True, separators=(",", ":")) + "\n")
        out.flush()
        return
    if prompter is not None and event.get("type") == "approval.pending":
        aid = event.get("approval_id")
        if isinstance(aid, str):
            prompter.ask(aid, event)  # (shown from its file, once)
            return
    for line in render(event):
        out.write(line + "\n")
    out.flush()


NON_INTERACTIVE_HINT = (
    "run it from a terminal (or answer in `linpodx events --filter approval`); a script that "
    "must answer passes --non-interactive, and the audit log records the answer as "
    "non-interactive"
)


def decide(
    approval_id: str, decision: str, non_interactive: bool = False, for_session: bool = False
) -> dict[str, Any]:
    """`linpodx approve|deny ID`: answer one pending approval (first answer wins).
    `for_session` (`approve --for-session`): approve this call and make a session grant.

    Without a terminal on stdin it needs `--non-interactive`: the MCP client is a process of
    the same user, and one with a shell tool that learnt an id could otherwise approve its own
    call silently. The flag is recorded (`by.interactive: false`) for whoever reads the log.
    A malformed id is a usage error first, whatever stdin is (a terminal would not help)."""
    if not ids.is_id(approval_id, "apr"):
        raise UsageError(
            f"not an approval id: '{approvals.shown_id(approval_id)}'",
            "approval ids look like apr_<ULID>; list pending ones with "
            "`linpodx events --filter approval --no-follow`",
        )
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if not interactive and not non_interactive:
        raise UsageError(
            f"`linpodx {decision}` needs a terminal on stdin", NON_INTERACTIVE_HINT
        )
    in_use = str(state_dir())
    try:
        pending = approvals.load(approval_id)
    except NotFound as exc:
        found = elsewhere.pending_elsewhere(in_use)
        if not found:
            raise
        where = "; ".join(
            f"{e.pending} pending in {safe_text(e.state_dir, 300)} ({safe_text(e.command, 400)})"
            for e in found
        )
        raise NotFound(exc.message, f"approvals wait in another state dir: {where}") from None
    st = approvals.status(approval_id)
    if st != "pending":
        raise Conflict(
            f"approval {approval_id} is already {st}", "only pending approvals can be answered"
        )
    if for_session and not pending.grantable:
        raise InvalidInput(
            f"approval {approvals.shown_id(approval_id)} cannot be approved for the session",
            approvals.NOT_GRANTABLE_HINT,
        )
    reason = "approved by a person" if decision == approvals.APPROVE else "denied by a person"
    if for_session:
        reason += " for the session"
    if not interactive:
        reason += " (non-interactive)"
    by = {**approvals.who(), "interactive": interactive}
    scope = approvals.SCOPE_SESSION if for_session else approvals.SCOPE_CALL
    if not approvals.answer(approval_id, pending.digest, decision, reason, by=by, scope=scope):
        raise Conflict(
            f"approval {approval_id} is already {approvals.status(approval_id)}",
            "another answer (or the timeout) came first",
        )
    # Named once answered; a refusal is `error:` first, and names the state dir when it
    # matters (`approval not found … (searched the state dir …)`).
    say_state_dir(approvals_too=False)
    return {
        "approval_id": approval_id,
        "decision": "approved" if decision == approvals.APPROVE else "denied",
        "session": safe_text(pending.session, FIELD_CAP),
        "method": safe_text(pending.method, FIELD_CAP),
        "tool": safe_text(pending.tool, FIELD_CAP) if pending.tool else None,
        "digest": safe_text(pending.digest, FIELD_CAP),
        "scope": scope,
        "interactive": interactive,
    }


def show(approval_id: str) -> dict[str, Any]:
    """`linpodx approvals show ID`: the whole request an approval binds, checked against its
    digest (the listener shows each value cut; this is all of it)."""
    pending, request = approvals.load_request(approval_id)
    return {
        "approval_id": approval_id,
        "status": approvals.status(approval_id),
        "session": pending.session,
        "digest": pending.digest,
        "expires": pending.to_dict()["expires"],
        "reason": pending.reason,
        "request": request,
    }


def _render_show(result: dict[str, Any]) -> None:
    """Key lines, then the request as indented JSON, every non-ASCII character and control
    character escaped (`ensure_ascii`): it came from the agent's side."""
    out = sys.stdout
    for key in ("approval_id", "status", "session", "digest", "expires"):
        out.write(f"{key}: {safe_text(str(result[key]), FIELD_CAP)}\n")
    if result.get("reason"):
        out.write(f"why: {safe_text(str(result['reason']), 1000)}\n")
    out.write("request:\n")
    out.write(json.dumps(result["request"], ensure_ascii=True, indent=2, sort_keys=True) + "\n")
    out.flush()


app = new_app("Look at MCP approvals.")


@app.command("show")
def show_cmd(
    approval_id: Annotated[str, typer.Argument(help="apr_… id (see `linpodx events`).")],
    json_mode: JsonOpt = False,
) -> None:
    """Print the whole request an approval binds (checked against its digest)."""
    run_command(
        "approvals show", json_mode, lambda: show(approval_id), None if json_mode else _render_show
    )


NonInteractiveOpt = Annotated[
    bool,
    typer.Option(
        "--non-interactive",
        help="Answer without a terminal on stdin (recorded as non-interactive).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("events")
    def events(
        filter_: Annotated[
            list[str] | None,
            typer.Option(
                "--filter",
                metavar="TYPE",
                help="Event type or its first component (approval, mcp, container…); repeatable.",
            ),
        ] = None,
        since: Annotated[
            str | None,
            typer.Option(
                "--since",
                metavar="TIME",
                help="Show events from this time (ISO 8601) or this long ago (10m, 2h).",
            ),
        ] = None,
        json_mode: Annotated[
            bool, typer.Option("--json", help="One JSON object per line.")
        ] = False,
        no_follow: Annotated[
            bool, typer.Option("--no-follow", help="Print what is there and exit.")
        ] = False,
    ) -> None:
        """Follow the event stream; answer pending approvals from this terminal."""
        try:
            events_cmd(list(filter_ or []), since, json_mode, no_follow)
        except LinpodxError as err:
            # With --json the error is a line of its own, like the events before it.
            raise CommandFailed("events", json_mode, err) from None

    @app.command("approve")
    def approve(
        approval_id: Annotated[str, typer.Argument(help="apr_… id (see `linpodx events`).")],
        json_mode: JsonOpt = False,
        non_interactive: NonInteractiveOpt = False,
        for_session: Annotated[
            bool,
            typer.Option(
                "--for-session",
                help="Also pass later calls of this session that the same rule decides for "
                "the same tool (until the session ends).",
            ),
        ] = False,
    ) -> None:
        """Approve one pending MCP request (from a terminal, or with --non-interactive)."""
        run_command(
            "approve",
            json_mode,
            lambda: decide(approval_id, approvals.APPROVE, non_interactive, for_session),
        )

    @app.command("deny")
    def deny(
        approval_id: Annotated[str, typer.Argument(help="apr_… id (see `linpodx events`).")],
        json_mode: JsonOpt = False,
        non_interactive: NonInteractiveOpt = False,
    ) -> None:
        """Deny one pending MCP request (from a terminal, or with --non-interactive)."""
        run_command(
            "deny", json_mode, lambda: decide(approval_id, approvals.DENY, non_interactive)
        )
