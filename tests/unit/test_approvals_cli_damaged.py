"""`approve`, `deny` and `events` facing damaged or hostile files under approvals/."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from linpodx.approvals import store
from linpodx.cli import approvals as cli_approvals

REQ = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "write_file", "arguments": {"path": "a", "content": "b"}},
}
ESC = "\x1b]8;;http://e\x07\x1b[31m"


def pending() -> store.PendingRequest:
    return store.create(
        "sess_01KB0000000000000000000000", "tools/call", "write_file", REQ, REQ["params"], 30
    )


def _rewrite_request(p: store.PendingRequest, **fields: str) -> None:
    path = store.approvals_dir() / p.approval_id / "request.json"
    path.write_text(json.dumps({**p.to_dict(), **fields}))


def _one_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a following `events` stop at its first pause (as Ctrl-C would)."""

    def interrupt(_seconds: float) -> None:
        raise KeyboardInterrupt

    fake = types.SimpleNamespace(time=cli_approvals.time.time, sleep=interrupt)
    monkeypatch.setattr(cli_approvals, "time", fake)


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_decision_output_escapes_session_and_digest(cli: Any, decision: str) -> None:
    p = pending()
    _rewrite_request(p, session=f"sess{ESC}", digest=f"d{ESC}")
    res = cli(decision, "--non-interactive", p.approval_id)
    assert res.exit_code == 0
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "session:" in res.stdout and "\\x1b" in res.stdout


def test_deeply_nested_request_is_refused_alone(cli: Any) -> None:
    p = pending()
    path = store.approvals_dir() / p.approval_id / "request.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    res = cli("approve", "--non-interactive", p.approval_id)
    assert res.exit_code == 3 and "approval request is unreadable" in res.stderr
    assert "RecursionError" not in res.stderr


def test_listener_starts_despite_damaged_entries(
    cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    stray = store.approvals_dir() / "apr_01M8Q50RSSHGZYNDRRHMFW6H6K"
    good = pending()
    stray.write_bytes(b"")  # a file where an approval's directory belongs
    deep = pending()
    (store.approvals_dir() / deep.approval_id / "request.json").write_bytes(
        b"{" * 100_000 + b"}" * 100_000
    )
    _one_poll(monkeypatch)
    res = cli("events", "--filter", "approval")
    assert res.exit_code == 0, res.stderr
    assert good.approval_id in res.stdout and deep.approval_id not in res.stdout
