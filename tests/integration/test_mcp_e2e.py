"""End to end: the official MCP SDK client on the host, `linpodx mcp attach`, and an SDK server
inside a real linpodx container (root and rootless)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from linpodx.audit import chain as audit_chain
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import (
    SERVER_PATH,
    env,
    linpodx,
    server_log,
    start_server_container,
    wait_pending,
)

pytestmark = pytest.mark.podman


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def _session(name: str, mode: str, errlog: Any) -> dict[str, Any]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "linpodx", "mcp", "attach", "--container", name, "--", "python3", SERVER_PATH],
        env=env(),
    )
    out: dict[str, Any] = {}
    async with Client(stdio_client(params, errlog=errlog), mode=mode) as client:  # type: ignore[arg-type]
        out["protocol"] = client.protocol_version
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        ok = await client.call_tool("echo", {"text": "hello-bridge"})
        out["auto"] = (ok.is_error, _text(ok))
        denied = await client.call_tool("run_shell", {"cmd": "MARK-DENIED-CALL"})
        out["denied"] = (denied.is_error, _text(denied))

        # A prompted call, approved by a separate `linpodx approve` process.
        seen: set[str] = set()
        task = asyncio.create_task(
            client.call_tool("write_file", {"path": "a.txt", "content": "MARK-APPROVED"})
        )
        ev = await asyncio.to_thread(wait_pending, seen)
        out["pending_event"] = ev
        approve = await asyncio.to_thread(
            linpodx, "approve", "--non-interactive", ev["approval_id"]
        )
        out["approve_stdout"] = approve.stdout
        res = await task
        out["approved"] = (res.is_error, _text(res))
        again = await asyncio.to_thread(
            linpodx, "approve", "--non-interactive", ev["approval_id"], check=False
        )
        out["approve_again"] = (again.returncode, again.stderr)

        # A prompted call nobody answers: denied after the profile's window.
        res2 = await client.call_tool("write_file", {"path": "b.txt", "content": "MARK-TIMEOUT"})
        out["timeout"] = (res2.is_error, _text(res2))
    return out


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_sdk_client_through_the_bridge(tmp_path: Path, unique_name: str, mode: str) -> None:
    # The window must outlast a `linpodx approve` process starting on a loaded CI machine (the
    # approved call), and is then waited out once (the unanswered call).
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=15)
    errpath = tmp_path / "bridge.stderr"
    with open(errpath, "w") as errlog:
        out = asyncio.run(_session(unique_name, mode, errlog))
    stderr = errpath.read_text()

    assert out["protocol"] == ("2026-07-28" if mode == "auto" else "2025-11-25")
    assert out["tools"] == ["echo", "emit_raw", "run_shell", "slow", "write_file"]
    assert out["auto"] == (False, "echo:hello-bridge")
    assert out["denied"][0] is True and "denied by linpodx policy" in out["denied"][1]
    ev = out["pending_event"]
    assert ev["method"] == "tools/call" and ev["tool"] == "write_file"
    assert "MARK-APPROVED" in ev["payload"]
    assert "decision: approved" in out["approve_stdout"]
    assert out["approved"] == (False, "wrote 13 bytes to a.txt")
    assert out["approve_again"][0] != 0 and "already approved" in out["approve_again"][1]
    assert out["timeout"][0] is True and "timeout" in out["timeout"][1]

    # What the server received: the allowed and approved calls, never the denied ones.
    log = server_log(unique_name)
    assert b"hello-bridge" in log and b"MARK-APPROVED" in log
    assert b"MARK-DENIED-CALL" not in log and b"MARK-TIMEOUT" not in log

    # stderr carries the session lines; the chain verifies and then detects tampering.
    lines = stderr.splitlines()
    sid = next(x.split(": ", 1)[1] for x in lines if x.startswith("mcp_session_id: sess_"))
    assert "bridge: host stdio <-> container stdio" in lines
    assert "policy: 5 rules loaded" in lines
    records = audit_chain.read_records(audit_chain.session_path(sid))
    types = [r.type for r in records]
    assert types[0] == "session.start" and types[-1] == "session.close"
    decisions = [
        (r.data.get("tool"), r.data["decision"])
        for r in records
        if r.type == "mcp.request" and r.data.get("method") == "tools/call"
    ]
    assert decisions == [
        ("echo", "auto_allow"),
        ("run_shell", "deny"),
        ("write_file", "prompt"),
        ("write_file", "prompt"),
    ]
    decided = [
        (r.data["decision"], r.data["reason"]) for r in records if r.type == "approval.decided"
    ]
    assert decided == [("approve", "approved"), ("deny", "timeout")]
    assert all("arguments" not in r.data for r in records)  # by digest only

    ok = linpodx("audit", "verify", "--session", sid, check=False)
    assert ok.returncode == 0, ok.stderr
    assert f"events:  {len(records)}" in ok.stdout and "chain:   OK" in ok.stdout

    # Tamper with one record (the denied call becomes "auto_allow"): verify names its seq.
    path = audit_chain.session_path(sid)
    raw = path.read_bytes().split(b"\n")
    bad_seq = next(r.seq for r in records if r.data.get("tool") == "run_shell")
    raw[bad_seq] = raw[bad_seq].replace(b'"decision":"deny"', b'"decision":"auto_allow"')
    path.write_bytes(b"\n".join(raw))
    bad = linpodx("audit", "verify", "--session", sid, check=False)
    assert bad.returncode == 7
    assert f"seq {bad_seq}" in (bad.stdout + bad.stderr)
