"""Rules on a tool's arguments, and rates, against the real bridge and the logging test server
in a real container: what the server received (or did not) is read back from its log."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest

from linpodx.audit import chain as audit_chain
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import RawSession, server_log, start_server_container, wait_pending

pytestmark = pytest.mark.podman

PROFILE = """\
version: 1
name: {name}
mcp_policy:
  - method: tools/call
    tool_name: write_file
    arguments:
      path: {{glob: "/proj/**"}}
      content: {{regex: "M-ARG-[A-Z0-9-]+"}}
    decision: auto_allow
  - method: tools/call
    tool_name: echo
    rate: 2/h
    decision: auto_allow
  - method: tools/call
    decision: deny
mcp:
  approval_timeout_seconds: {timeout}
"""


def calls(name: str) -> list[dict[str, Any]]:
    """The tools/call messages the server received, in order."""
    msgs = [json.loads(line) for line in server_log(name).splitlines() if line.strip()]
    return [m for m in msgs if m.get("method") == "tools/call"]


def write(s: RawSession, i: int, path: Any, content: str) -> dict[str, Any]:
    args = {"path": path, "content": content}
    return s.request(i, "tools/call", {"name": "write_file", "arguments": args})


def text(resp: dict[str, Any]) -> str:
    return str(resp["result"]["content"][0]["text"])


def test_argument_rule_forwards_only_matching_paths(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=PROFILE)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        assert text(write(s, 1, "/proj/src/a.py", "M-ARG-OK-1")) == (
            "wrote 10 bytes to /proj/src/a.py"
        )
        assert "wrote" in text(write(s, 2, "/proj//src/./b.py", "M-ARG-OK-2"))
        refused = [
            (3, "/proj/../etc/passwd"),
            (4, "/etc/passwd"),
            (5, "/proj/../../proj/x"),
            (6, ["/proj/a"]),
            (7, "/workshop/a"),
        ]
        for i, path in refused:
            resp = write(s, i, path, f"M-ARG-BAD-{i}")
            assert resp["result"]["isError"] is True, resp
            assert "rule 2 (tools/call): deny" in text(resp)
        # The path matches but another named argument does not.
        assert write(s, 8, "/proj/a", "not the marker M-ARG-BAD-8")["result"]["isError"] is True
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    got = [c["params"]["arguments"]["content"] for c in calls(unique_name)]
    assert got == ["M-ARG-OK-1", "M-ARG-OK-2"], got
    assert b"M-ARG-BAD" not in server_log(unique_name)
    recs = [
        r.data
        for r in audit_chain.read_records(audit_chain.session_path(sid))
        if r.type == "mcp.request" and r.data.get("method") == "tools/call"
    ]
    assert [(d["rule"], d["decision"]) for d in recs] == [(0, "auto_allow")] * 2 + [
        (2, "deny")
    ] * 6


def test_rate_limited_rule_turns_into_prompt(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=PROFILE, timeout=4)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        for i in (1, 2):
            args = {"text": f"M-RATE-{i}"}
            resp = s.request(i, "tools/call", {"name": "echo", "arguments": args})
            assert text(resp) == f"echo:M-RATE-{i}"
        # Past 2/h: a person is asked, and told why. This one a person approves ...
        s.send(
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
             "params": {"name": "echo", "arguments": {"text": "M-RATE-3"}}}
        )  # fmt: skip
        ev = wait_pending()
        assert "rate 2/h exceeded" in ev["reason"], ev
        tty = pexpect.spawn(
            sys.executable,
            ["-m", "linpodx", "approve", ev["approval_id"]],
            env=dict(os.environ),
            timeout=30,
        )
        tty.expect(rb"decision: approved")
        tty.expect(pexpect.EOF)
        assert text(s.recv_id(3)) == "echo:M-RATE-3"
        # ... and this one nobody answers: denied when the window closes.
        resp = s.request(4, "tools/call", {"name": "echo", "arguments": {"text": "M-RATE-4"}})
        assert resp["result"]["isError"] is True and "timeout" in text(resp), resp
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    got = [c["params"]["arguments"]["text"] for c in calls(unique_name)]
    assert got == ["M-RATE-1", "M-RATE-2", "M-RATE-3"], got
    recs = [
        r.data
        for r in audit_chain.read_records(audit_chain.session_path(sid))
        if r.type == "mcp.request" and r.data.get("method") == "tools/call"
    ]
    assert [d["decision"] for d in recs] == ["auto_allow", "auto_allow", "prompt", "prompt"]
    assert all(d["rule"] == 1 for d in recs)
    assert all("rate 2/h exceeded" in d["reason"] for d in recs[2:])


DENY_PROFILE = """\
version: 1
name: {name}
mcp_policy:
  - method: tools/call
    tool_name: write_file
    arguments:
      path: {{glob: "/etc/**"}}
    decision: deny
  - method: tools/call
    decision: auto_allow
mcp:
  approval_timeout_seconds: {timeout}
"""


def test_odd_values_do_not_slip_past_a_deny_rule(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=DENY_PROFILE)
    s = RawSession(unique_name)
    try:
        s.handshake()
        odd: list[Any] = [
            "/etc/passwd",
            "/proj/../etc/passwd",
            "//etc/./passwd",
            "/etc/passwd\u0000",
            "../../etc/passwd",
            ["/etc/passwd"],
            {"p": "/etc/passwd"},
            "etc/passwd",  # relative: /etc/passwd to a server whose working directory is /
            "~/../etc/passwd",
            "file:///etc/passwd",
        ]
        for i, path in enumerate(odd, start=1):
            resp = write(s, i, path, f"M-ODD-{i}")
            assert resp["result"]["isError"] is True, (path, resp)
            assert "rule 0 (tools/call write_file path~glob): deny" in text(resp)
        # The name in another case (a Go server binds `PATH` to its `Path` field).
        for i, args in enumerate(
            [{"PATH": "/etc/passwd"}, {"path": "/tmp/ok", "Path": "/etc/passwd"}], start=50
        ):
            params = {"name": "write_file", "arguments": {**args, "content": f"M-ODD-{i}"}}
            resp = s.request(i, "tools/call", params)
            assert resp["result"]["isError"] is True, (args, resp)
            assert "rule 0 (tools/call write_file path~glob): deny" in text(resp)
        assert "wrote" in text(write(s, 99, "/tmp/ok", "M-ODD-OK"))
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    assert [c["params"]["arguments"]["content"] for c in calls(unique_name)] == ["M-ODD-OK"]
