"""How a session ends: server exit code, SIGTERM with a pending approval, container stopped.
In every case pending approvals are denied and the session chain gets its closing record."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from linpodx.approvals import store as approvals
from linpodx.audit import chain as audit_chain
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import RawSession, linpodx, start_server_container, wait_pending

pytestmark = pytest.mark.podman


def _closing(sid: str) -> dict[str, object]:
    records = audit_chain.read_records(audit_chain.session_path(sid))
    assert records[-1].type == "session.close"
    anchors = [
        r
        for r in audit_chain.read_records(audit_chain.admin_chain().path)
        if r.type == "session.close" and r.data.get("session_id") == sid
    ]
    assert len(anchors) == 1 and anchors[0].data["tail"] == records[-1].hash
    return dict(records[-1].data)


def test_server_exit_code_is_linpodx_exit_code(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "linpodx",
            "mcp",
            "attach",
            "--container",
            unique_name,
            "--",
            "python3",
            "-c",
            "import sys; sys.exit(3)",
        ],
        stdin=subprocess.PIPE,
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 3, res.stderr
    assert res.stdout == b""  # stdout carries protocol messages only
    err = res.stderr.decode()
    sid = next(x.split(": ", 1)[1] for x in err.splitlines() if x.startswith("mcp_session_id: "))
    data = _closing(sid)
    assert data["server_exit"] == 3
    assert linpodx("audit", "verify", "--session", sid).returncode == 0


def test_sigterm_denies_pending_and_closes(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=120)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        s.send(
            {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "write_file", "arguments": {"path": "p", "content": "c"}},
            }
        )
        ev = wait_pending()
        s.proc.send_signal(signal.SIGTERM)
        denied = s.recv_id(7)
        assert "session ended" in denied["result"]["content"][0]["text"]
        assert s.proc.wait(60) == 143
    finally:
        s.kill()
    assert approvals.status(ev["approval_id"]) == "denied"
    data = _closing(sid)
    assert str(data["reason"]).startswith("signal SIGTERM")


def test_container_stop_ends_the_session(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=120)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        s.send(
            {
                "jsonrpc": "2.0",
                "id": 8,
                "method": "tools/call",
                "params": {"name": "write_file", "arguments": {"path": "p", "content": "c"}},
            }
        )
        ev = wait_pending()
        subprocess.run(
            ["podman", "stop", "-t", "1", unique_name], check=True, capture_output=True, timeout=120
        )
        code = s.proc.wait(60)
        assert code != 0
    finally:
        s.kill()
    assert approvals.status(ev["approval_id"]) == "denied"
    data = _closing(sid)
    assert data["reason"] == "server exited"
