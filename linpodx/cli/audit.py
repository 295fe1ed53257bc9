"""`linpodx audit …` commands: verify, show, seal."""

from __future__ import annotations

import json
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from linpodx.audit.chain import (
    HINT_NOT_A_LOG,
    NotALog,
    Record,
    RecordScan,
    admin_chain,
    session_path,
)
from linpodx.audit.verify import (
    NOT_CLOSED,
    ChainCheck,
    anchors_map,
    log_present,
    parse_anchor,
    raise_broken,
)
from linpodx.cli.common import JsonOpt, new_app, run_command
from linpodx.errors import AuditError, ChainBroken, NotFound, UsageError
from linpodx.fsutil import present
from linpodx.integrity import seal, verify_admin, verify_all, verify_session
from linpodx.output import kv_line, print_error, safe_text

app = new_app("Verify, show and seal the hash-chained audit logs.")

SessionOpt = Annotated[
    str | None,
    typer.Option(
        "--session", metavar="ID", help="A session's chain (sess_…) instead of the admin chain."
    ),
]
AnchorOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--anchor",
        metavar="SEQ:HASH",
        help="SEQ:HASH from `linpodx audit seal`: the chain must still hold that record "
        "(repeatable).",
    ),
]


def _short(h: str) -> str:
    return h[:12] + "…"


def _lines(check: ChainCheck) -> list[str]:
    r = check.report
    out = []
    if check.session_id:
        out.append(kv_line("session", check.session_id))
    if check.profile_id:
        out.append(kv_line("profile", safe_text(check.profile_id, 80)))
    out.append(kv_line("events", r.events))
    if not r.ok:
        reason = safe_text(r.reason or "")
        out.append(kv_line("chain", f"BROKEN at seq {r.first_bad_seq}: {reason}"))
    elif check.problems:
        out.append(kv_line("chain", f"BROKEN: {safe_text(check.problems[0])}"))
    else:
        out.append(kv_line("chain", f"OK (head {_short(r.head)}, tail {_short(r.tail)})"))
    for p in check.problems[1 if r.ok else 0 :]:
        out.append(kv_line("problem", safe_text(p)))
    if r.torn_tail and r.reason and r.ok:
        out.append(kv_line("warning", r.reason))
    if check.session_id and NOT_CLOSED in check.notes:
        # Normal while its `mcp attach` runs; after it ended, the closing record is missing.
        out.append(kv_line("warning", f"{NOT_CLOSED} (normal while the session runs)"))
    return out


AllOpt = Annotated[
    bool,
    typer.Option("--all", help="The admin chain and every session log against it."),
]


def _verify_all(anchors: dict[int, str], json_mode: bool) -> dict[str, Any]:
    admin, sessions = verify_all(anchors)
    unreadable = [c for c in sessions if c.unreadable is not None]
    broken = [c for c in sessions if not c.ok and c.unreadable is None]
    if not json_mode:
        out = _lines(admin)
        for c in sessions:
            r = c.report
            if c.unreadable is not None:
                state = f"UNREADABLE: {safe_text(c.unreadable)}"
            elif not r.ok:
                state = f"BROKEN at seq {r.first_bad_seq}: {safe_text(r.reason or '')}"
            elif c.problems:
                state = f"BROKEN: {safe_text(c.problems[0])}"
            else:
                state = f"OK ({r.events} events, tail {_short(r.tail)})"
            out.append(kv_line("session", f"{c.session_id} {state}"))
        summary = f"{len(sessions) - len(unreadable)} verified, {len(broken)} broken"
        if unreadable:
            summary += f", {len(unreadable)} unreadable"
        out.append(kv_line("sessions", summary))
        sys.stdout.write("".join(line + "\n" for line in out))
        sys.stdout.flush()
    # Each log that could not be read gets its own error and hint: the verdict below names
    # only the first failure, and an unreadable log must not pass unnoticed beside it.
    for c in unreadable:
        print_error(AuditError(f"session {c.session_id}: {c.unreadable}", c.report.hint))
    result: dict[str, Any] = {"admin": admin.to_dict(), "sessions": [c.to_dict() for c in sessions]}
    if not admin.ok or broken:
        first = admin if not admin.ok else broken[0]
        try:
            raise_broken(first)
        except ChainBroken as exc:
            if first is not admin:
                exc.message = f"session {first.session_id}: {exc.message}"
            # Every log's verdict, not only the first failure's: the others were checked too.
            exc.details = result
            raise
    if unreadable:
        names = ", ".join(str(c.session_id) for c in unreadable)
        raise AuditError(
            f"{_count(len(unreadable), 'session log')} of {len(sessions)} could not be read "
            f"and {'was' if len(unreadable) == 1 else 'were'} not verified ({names}); "
            "every other log verified OK",
            "fix what the errors above say (most often the file's permissions), then run "
            "`linpodx audit verify --all` again",
            details=result,
        )
    return result


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


@app.command("verify")
def verify_cmd(
    session: SessionOpt = None,
    anchor: AnchorOpt = None,
    all_logs: AllOpt = False,
    json_mode: JsonOpt = False,
) -> None:
    """Check every hash and link of a chain, its seals, and its anchors in the other chain."""

    def run() -> dict[str, Any]:
        anchors = anchors_map(parse_anchor(a) for a in (anchor or []))
        if all_logs:
            if session:
                raise UsageError("--all and --session exclude each other", "give one of them")
            return _verify_all(anchors, json_mode)
        check = verify_session(session, anchors) if session else verify_admin(anchors)
        if not json_mode:
            sys.stdout.write("".join(line + "\n" for line in _lines(check)))
            sys.stdout.flush()
        if not check.ok:
            raise_broken(check)
        return check.to_dict()

    run_command("audit verify", json_mode, run, render=lambda _result: None)


def _show_path(session: str | None) -> Path:
    """The log `show` reads; NotFound if there is none."""
    if session:
        try:
            path = session_path(session)
        except AuditError:
            path = None
        if path is None or not log_present(path):
            raise NotFound(
                f"no audit log for session {session}",
                "session ids are listed by `linpodx audit show` (session.open records)",
            )
        return path
    path = admin_chain().path
    if not present(path):
        raise NotFound(
            f"no admin audit log yet ({path})",
            "it is created by the first recorded action, e.g. "
            "`linpodx sandbox apply --profile FILE`",
        )
    return path


class _Scan(RecordScan):
    """`RecordScan` as `show` words it: why it stopped (`stopped`), and a log it cannot read
    as the error the CLI reports."""

    @property
    def stopped(self) -> str | None:
        if self.stop is None:
            return None
        offset, why, kind = self.stop
        if kind == "torn":
            return f"torn last line at byte {offset}: crash during append, not tampering"
        return f"damaged record at byte {offset}: {why}"

    def records(self, upto: int | None = None) -> Iterator[Record]:
        try:
            yield from super().records(upto)
        except NotALog as exc:
            raise ChainBroken(
                f"the audit log {exc}", HINT_NOT_A_LOG, details={"log": str(self.path), "events": 0}
            ) from None
        except OSError as exc:
            raise AuditError(
                f"could not read the audit log {self.path}: {exc.strerror or exc}",
                "check the file's permissions",
            ) from None


class _Lazy(list[dict[str, Any]]):
    """The records of a JSON envelope, read from the log while the envelope is written
    (`print_json` streams), so a log of any size is shown without holding it. Never empty:
    made only for a log with records."""

    def __init__(self, items: Callable[[], Iterator[dict[str, Any]]]) -> None:
        super().__init__([{}])  # truthy for the encoder; iteration is overridden
        self._items = items

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._items()


def _show_line(r: Record) -> str:
    data = json.dumps(r.data, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return (
        f"{r.seq:>6}  {r.ts}  {safe_text(r.type, 40):<18} {r.hash[:12]}  "
        f"{safe_text(data, 300)}\n"
    )


LIMIT_MAX = 1_000_000_000
"""The largest `audit show --limit`."""


@app.command("show")
def show_cmd(
    session: SessionOpt = None,
    limit: Annotated[
        int | None,
        # The bound keeps N a machine integer (deque's maxlen), far above any real log.
        typer.Option("--limit", min=1, max=LIMIT_MAX, help="Only the last N records."),
    ] = None,
    json_mode: JsonOpt = False,
) -> None:
    """List a chain's records (seq, time, type, short hash, data). Does not verify links."""

    def run() -> dict[str, Any]:
        path = _show_path(session)
        scan = _Scan(path)
        records: list[dict[str, Any]]
        if limit is not None:
            # The last `limit` records: memory bounded by `limit` records and one line.
            last: deque[Record] = deque(scan.records(), maxlen=limit)
            records = [r.to_dict() for r in last]
            if not json_mode:
                sys.stdout.write("".join(_show_line(r) for r in last))
        elif not json_mode:
            # Every record, printed as it is read: nothing is held.
            for r in scan.records():
                sys.stdout.write(_show_line(r))
            records = []
        else:
            # The envelope says ok or not before its records: count first (nothing held),
            # then read the same records again while the envelope is written.
            for _ in scan.records():
                pass
            count = scan.count

            def again() -> Iterator[dict[str, Any]]:
                for r in _Scan(path).records(upto=count):
                    yield r.to_dict()

            records = _Lazy(again) if count else []
        sys.stdout.flush()
        count, stopped = scan.count, scan.stopped
        result = {"log": str(path), "events": count, "records": records, "stopped": stopped}
        if stopped is not None and not stopped.startswith("torn"):
            raise ChainBroken(
                f"stopped at a {stopped}",
                "run `linpodx audit verify` to see what is wrong with the log",
                details={"log": str(path), "events": count},
            )
        if stopped is not None and not json_mode:
            sys.stderr.write(f"warning: {stopped}\n")
        return result

    run_command("audit show", json_mode, run, render=lambda _result: None)


@app.command("seal")
def seal_cmd(session: SessionOpt = None, json_mode: JsonOpt = False) -> None:
    """Print a checkpoint (SEQ:HASH) of the chain's last record to keep somewhere else.

    Later, `linpodx audit verify --anchor SEQ:HASH` proves the log still holds that record and
    everything before it: rewriting, replacing or truncating the log is then detected.
    """

    def run() -> dict[str, Any]:
        return seal(session).to_dict()

    def render(d: dict[str, Any]) -> None:
        for key in ("log", "log_id", "seq", "hash", "anchor"):
            sys.stdout.write(kv_line(key, d[key]) + "\n")
        sys.stdout.write(
            "note:    keep the anchor outside this account; check it later with "
            f"`linpodx audit verify{' --session ' + session if session else ''} "
            f"--anchor {d['anchor']}`\n"
        )
        sys.stdout.flush()

    run_command("audit seal", json_mode, run, render=render)
