"""Group commit on the real session chain, and the bridge's pipelined lanes."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from linpodx.audit import chain as audit_chain
from linpodx.errors import AuditError
from linpodx.mcp.auditlog import GroupCommitChain
from linpodx.mcp.bridge import Bridge
from linpodx.mcp.framing import Line
from linpodx.profile.model import Decision as A
from linpodx.profile.model import McpRule, Profile

GENESIS = "ab" * 32


def test_concurrent_appends_form_one_valid_chain() -> None:
    ch = audit_chain.session_chain("sess_group", GENESIS)
    g = GroupCommitChain(ch)

    def work(k: int) -> None:
        for i in range(40):
            rec = g.append("mcp.request", {"k": k, "i": i})
            assert rec.data == {"k": k, "i": i}

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Someone else appends in between: the next batch resynchronizes from the file.
    ch.append("session.close", {"by": "other"})
    g.append("mcp.request", {"after": True})
    g.close()
    report = audit_chain.verify_file(ch.path, GENESIS)
    assert report.ok and report.events == 242
    assert g.batches <= g.records  # several records share an fsync when callers overlap


def test_unrecordable_data_fails_only_that_record() -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_float", GENESIS))
    with pytest.raises(AuditError):
        g.append("mcp.request", {"x": 1.5})
    assert g.append("mcp.request", {"x": 1}).seq == 0


def test_write_failure_raises_audit_error(monkeypatch: pytest.MonkeyPatch) -> None:
    g = GroupCommitChain(audit_chain.session_chain("sess_full", GENESIS))
    g.append("mcp.request", {"x": 1})

    def full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("linpodx.mcp.auditlog.os.fsync", full)
    with pytest.raises(AuditError):
        g.append("mcp.request", {"x": 2})
    monkeypatch.undo()
    g.close()
    assert audit_chain.verify_file(g.path, GENESIS).events == 1  # nothing half-written


def test_pipelined_bridge_records_before_acting() -> None:
    ch = audit_chain.session_chain("sess_pipe", GENESIS)
    g = GroupCommitChain(ch)
    sent: list[dict[str, Any]] = []
    seen_at_send: list[int] = []
    lock = threading.Lock()

    def to_server(data: bytes) -> None:
        msg = json.loads(data)
        with lock:
            sent.append(msg)
            # The request's record must already be on disk when it is forwarded.
            seen_at_send.append(len(audit_chain.read_records(ch.path)))

    profile = Profile(name="p", mcp_policy=(McpRule("tools/call", A.AUTO_ALLOW, "echo"),))
    bridge = Bridge(
        profile=profile,
        session_id="sess_pipe",
        chain=g,
        to_client=lambda _b: None,
        to_server=to_server,
        emit=lambda *_a, **_k: None,
        pipeline=True,
    )
    for i in range(50):
        bridge.on_client_frame(
            Line(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": i,
                        "method": "tools/call",
                        "params": {"name": "echo", "arguments": {"i": i}},
                    }
                ).encode()
            ),
            more=i % 10 != 9,  # backlog for most frames (queued in the lane), none for some
        )
    bridge.drain()
    g.close()
    assert [m["id"] for m in sent] == list(range(50))  # arrival order kept
    assert all(n >= k + 1 for k, n in enumerate(seen_at_send))
    assert audit_chain.verify_file(ch.path, GENESIS).ok
