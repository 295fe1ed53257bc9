"""`linpodx ps`'s body, for typer's command and for the plain forms `linpodx.cli.main` parses
itself (`parse`): `ps`, `ps -a`/`--all`, `ps --json`.

typer costs ~0.3 s before a command runs (its import, and a pydantic adapter built for every
parameter), more than `podman ps` itself takes; `linpodx ps` is what people and scripts run
to see what is running, so its plain forms skip typer (bench/bench_cli.py: at most 2x
`podman ps --filter label=…`). Anything else (`--help`, an unknown option) goes through typer,
which stays the one place for help and usage errors. One body, so both parsers list alike.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from linpodx.errors import CommandFailed, LinpodxError
from linpodx.output import envelope, note, print_json, safe_text

COLUMNS = ("name", "profile", "revision", "state", "egress")
_FLAGS = {"-a": "all", "--all": "all", "--json": "json"}


def parse(args: Sequence[str]) -> tuple[bool, bool] | None:
    """(all states, JSON) for `ps ARGS…` (ARGS after the word `ps`), or None to let typer
    parse it."""
    seen: set[str] = set()
    for arg in args:
        what = _FLAGS.get(arg)
        if what is None or what in seen:
            return None
        seen.add(what)
    return "all" in seen, "json" in seen


def _rollbacks_journaled() -> bool:
    """Whether any rollback journal is there for `journal.interrupted_notes` to read (the
    snapshot modules cost more to import than the rest of `ps`; almost always there is none)."""
    import os

    from linpodx import paths

    where = os.path.dirname(paths.rollback_journal("x"))
    try:
        return any(n.endswith(".json") for n in os.listdir(where))
    except FileNotFoundError:
        return False
    except OSError:
        return True  # cannot tell: the journal's reader says why


def listing(all_states: bool) -> list[dict[str, Any]]:
    """The rows, with notes on stderr about interrupted rollbacks and renamed containers."""
    from linpodx.containers import runner

    # podman lists while the rest loads: `listing` alone, not the whole container service
    # (~0.1 s of imports: plan, pipeline…).
    listed = runner.start_listing(all_states)
    from linpodx.containers import listing

    rows = listing.ps(all_states, listed)
    if _rollbacks_journaled():
        from linpodx.snapshot import journal

        for line in journal.interrupted_notes():
            note(safe_text(line))
    for r in rows:
        if "renamed_from" in r:
            note(
                f"note: {safe_text(r['name'])} was renamed outside linpodx (linpodx "
                f"created it as {safe_text(r['renamed_from'])}); run `podman rename "
                f"{safe_text(r['name'])} {safe_text(r['renamed_from'])}` before linpodx "
                "commands act on it"
            )
    return rows


def render(rows: list[dict[str, Any]], quiet: bool = False) -> None:
    """The table: one line per container, control characters escaped; `quiet`: the names
    only (not podman's short ids: every linpodx command takes a name)."""
    if quiet:
        lines = [safe_text(str(r["name"])) for r in rows]
        if lines:
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
        return
    cells = [{c: safe_text("-" if r[c] is None else str(r[c])) for c in COLUMNS} for r in rows]
    widths = {c: max([len(c)] + [len(row[c]) for row in cells]) for c in COLUMNS}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in COLUMNS).rstrip()]
    lines += ["  ".join(row[c].ljust(widths[c]) for c in COLUMNS).rstrip() for row in cells]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def execute(all_states: bool, json_mode: bool, quiet: bool = False) -> int:
    """List, then print the table or the `--json` envelope; a failure leaves as
    CommandFailed (printed by `linpodx.cli.main`'s one error boundary)."""
    try:
        rows = listing(all_states)
    except LinpodxError as err:
        raise CommandFailed("ps", json_mode, err) from None
    if json_mode:
        print_json(envelope("ps", {"containers": rows}))
    else:
        render(rows, quiet)
    return 0
