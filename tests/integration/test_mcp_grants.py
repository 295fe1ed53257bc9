"""Approval for the session: `s` answered in a real terminal (pexpect), the real bridge, a real
container running the logging test server, and the session's audit chain."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pexpect
import pytest

from linpodx.audit import chain as audit_chain
from linpodx.events.reader import EventFile
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import RawSession, linpodx, server_log, start_server_container

pytestmark = pytest.mark.podman

GRANT_PROFILE = """\
version: 1
name: {name}
description: session grants
mcp_policy:
  - method: tools/call
    tool_name: write_file
    decision: prompt
  - method: tools/call
    decision: prompt
mcp:
  approval_timeout_seconds: {timeout}
  max_line_bytes: 1048576
"""


def call(i: int, tool: str, **args: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {"name": tool, "arguments": args},
    }


def test_an_s_answer_grants_the_rule_and_tool_for_the_session(
    tmp_path: Path, unique_name: str
) -> None:
    start_server_container(
        tmp_path, unique_name, DEBIAN_IMAGE, timeout=60, profile_text=GRANT_PROFILE
    )
    s = RawSession(unique_name)
    child = None
    try:
        s.handshake()
        child = pexpect.spawn(
            sys.executable,
            ["-m", "linpodx", "events", "--filter", "approval"],
            env=dict(os.environ),
            timeout=30,
        )
        time.sleep(1.5)  # let it start following before the request appears
        events = EventFile()
        events.skip_to_end()

        s.send(call(1, "write_file", path="a", content="M-GRANT-1"))
        child.expect(rb"tools/call write_file \xe2\x86\x92 PROMPT")
        child.expect_exact(b"approve? [y/N/s]: ")
        child.sendline(b"s")
        child.expect(rb"APPROVED FOR THE SESSION")
        assert s.recv_id(1)["result"]["content"][0]["text"] == "wrote 9 bytes to a"
        child.expect(
            rb"grt_[0-9A-Z]{26} tools/call write_file \xe2\x86\x92 GRANTED FOR THE "
            rb"SESSION \(rule 0; apr_"
        )

        # The same rule and tool: forwarded with no prompt at all.
        s.send(call(2, "write_file", path="b", content="M-GRANT-2"))
        assert s.recv_id(2)["result"]["content"][0]["text"] == "wrote 9 bytes to b"
        # Another tool (the catch-all rule) still prompts, `s` grants it for that tool only;
        s.send(call(3, "echo", text="M-GRANT-3"))
        child.expect(rb"tools/call echo \xe2\x86\x92 PROMPT")
        child.expect_exact(b"approve? [y/N/s]: ")
        child.sendline(b"s")
        child.expect(rb"APPROVED FOR THE SESSION")
        assert s.recv_id(3)["result"]["content"][0]["text"] == "echo:M-GRANT-3"
        # the same catch-all rule with yet another tool still prompts.
        s.send(call(4, "run_shell", cmd="M-GRANT-4"))
        child.expect(rb"tools/call run_shell \xe2\x86\x92 PROMPT")
        child.expect_exact(b"approve? [y/N/s]: ")
        child.sendline(b"n")
        child.expect(rb"DENIED")
        assert s.recv_id(4)["result"]["isError"] is True
        sid = s.session_id()
        assert s.close() == 0
    finally:
        if child is not None:
            child.terminate(force=True)
        s.kill()

    pending = [e for e in events.read_new() if e.get("type") == "approval.pending"]
    assert [e["tool"] for e in pending] == ["write_file", "echo", "run_shell"]
    log = server_log(unique_name)
    assert b"M-GRANT-1" in log and b"M-GRANT-2" in log and b"M-GRANT-3" in log
    assert b"M-GRANT-4" not in log

    records = audit_chain.read_records(audit_chain.session_path(sid))
    types = [r.type for r in records]
    grants = [r for r in records if r.type == "mcp.grant"]
    assert [(g.data["rule"], g.data["tool"]) for g in grants] == [(0, "write_file"), (1, "echo")]
    calls = {r.data["id"]: r for r in records if r.type == "mcp.request" and "id" in r.data}
    # Call 2 went under the first grant, whose record came before it.
    assert calls[2].data["grant"] == grants[0].data["grant_id"]
    assert calls[2].data["decision"] == "auto_allow" and calls[2].data["rule"] == 0
    assert grants[0].seq < calls[2].seq
    assert all("grant" not in calls[i].data for i in (1, 3, 4))
    decided = [r.data for r in records if r.type == "approval.decided"]
    assert [(d["decision"], d.get("scope"), d.get("grant")) for d in decided] == [
        ("approve", "session", grants[0].data["grant_id"]),
        ("approve", "session", grants[1].data["grant_id"]),
        ("deny", None, None),
    ]
    assert types[-1] == "session.close"
    ok = linpodx("audit", "verify", "--session", sid, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "chain:   OK" in ok.stdout
