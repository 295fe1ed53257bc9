"""Issue 23's gate bypasses against the real bridge and the logging test server in a real
container: what the server received (or did not) is read back from its log."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from linpodx.approvals import store as approvals
from linpodx.audit import chain as audit_chain
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import (
    RawSession,
    linpodx,
    server_log,
    start_server_container,
    wait_pending,
)

pytestmark = pytest.mark.podman

# A deny for one tool, then a catch-all that allows every other tool (issue 23 #1's setup).
CATCH_ALL_PROFILE = """\
version: 1
name: {name}
mcp_policy:
  - method: tools/call
    tool_name: run_shell
    decision: deny
  - method: tools/call
    tool_name: write_file
    decision: prompt
  - method: tools/call
    decision: auto_allow
mcp:
  approval_timeout_seconds: {timeout}
"""


def received(name: str) -> list[dict[str, Any]]:
    """The JSON messages the server received, in order."""
    return [json.loads(line) for line in server_log(name).splitlines() if line.strip()]


def records(sid: str) -> list[audit_chain.Record]:
    return audit_chain.read_records(audit_chain.session_path(sid))


def test_a_tool_name_that_is_no_string_is_refused(tmp_path: Path, unique_name: str) -> None:
    """#1: `["run_shell"]` skipped the run_shell rule and matched the catch-all."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=CATCH_ALL_PROFILE)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        for i, name in enumerate((["run_shell"], {"run_shell": 1}, 7, None), start=1):
            resp = s.request(
                i, "tools/call", {"name": name, "arguments": {"cmd": f"M-NAME-{i}"}}
            )
            assert resp["result"]["isError"] is True, resp
            assert "string params.name" in resp["result"]["content"][0]["text"]
        ok = s.request(9, "tools/call", {"name": "echo", "arguments": {"text": "M-NAME-OK"}})
        assert ok["result"]["content"][0]["text"] == "echo:M-NAME-OK"
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    log = server_log(unique_name)
    assert b"M-NAME-OK" in log
    assert not re.search(rb"M-NAME-[0-9]", log), log[-2000:]
    denied = [r.data for r in records(sid) if r.type == "mcp.request" and r.data["id"] != 0]
    assert [d["tool_type"] for d in denied[:4]] == ["list", "dict", "int", "missing"]
    assert all(d["decision"] == "deny" and d["rule"] is None for d in denied[:4])


def test_name_in_another_case_is_refused(tmp_path: Path, unique_name: str) -> None:
    """`{"name": "echo", "Name": "run_shell"}`: the catch-all allowed `echo`, while a Go server
    (keys bound case-insensitively, last wins) would run `run_shell`. And a `__proto__` key."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=CATCH_ALL_PROFILE)
    s = RawSession(unique_name)
    try:
        s.handshake()
        odd = [
            {"name": "echo", "Name": "run_shell", "arguments": {"cmd": "M-CASE-1"}},
            {"name": "echo", "arguments": {"text": "x"}, "ARGUMENTS": {"cmd": "M-CASE-2"}},
        ]
        for i, params in enumerate(odd, start=1):
            resp = s.request(i, "tools/call", params)
            assert resp["result"]["isError"] is True, resp
            assert "in another case" in resp["result"]["content"][0]["text"]
        # `__proto__`: a prototype to JavaScript that copies by assignment (Object.assign).
        proto = [
            {"name": "echo", "arguments": {"__proto__": {"text": "M-CASE-3"}}},
            {"name": "echo", "__proto__": {"arguments": {"text": "M-CASE-4"}}},
        ]
        for i, params in enumerate(proto, start=3):
            resp = s.request(i, "tools/call", params)
            assert "__proto__ key" in resp["result"]["content"][0]["text"], resp
        ok = s.request(9, "tools/call", {"name": "echo", "arguments": {"text": "M-CASE-OK"}})
        assert ok["result"]["content"][0]["text"] == "echo:M-CASE-OK"
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    log = server_log(unique_name)
    assert b"M-CASE-OK" in log
    assert not re.search(rb"M-CASE-[0-9]", log), log[-2000:]


def test_a_request_sent_as_a_notification_is_dropped(tmp_path: Path, unique_name: str) -> None:
    """#2: a tools/call without an id reached the server when its rule auto-allowed."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, profile_text=CATCH_ALL_PROFILE)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        s.send(
            {
                "jsonrpc": "2.0",
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "M-NOTIFY"}},
            }
        )
        s.send({"jsonrpc": "2.0", "method": "resources/read", "params": {"uri": "M-NOTIFY-2"}})
        s.no_output(1.0)  # (no reply can be sent to a notification)
        assert s.request(5, "ping")["result"] == {}
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    assert b"M-NOTIFY" not in server_log(unique_name)
    refused = [r.data for r in records(sid) if r.type == "mcp.notification"]
    refused = [d for d in refused if d["method"] in ("tools/call", "resources/read")]
    assert [d["decision"] for d in refused] == ["deny", "deny"]
    assert all("sent without an id" in d["reason"] for d in refused)
    said = s.stderr.decode()
    # (said at most once a second, and without the marker, an id or a name)
    assert 1 <= said.count("bridge: dropped a request the client sent without an id") <= 2
    assert "M-NOTIFY" not in said


def test_the_approver_sees_meta_and_every_argument(tmp_path: Path, unique_name: str) -> None:
    """#3, #4: `_meta` was never shown; padding one argument hid the next one."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=60)
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
        time.sleep(1.5)
        s.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "write_file",
                    "arguments": {"content": "harmless " * 300, "path": "/home/agent/.bashrc"},
                    "_meta": {"progressToken": "M-META-SHOWN"},
                },
            }
        )
        child.expect(rb"tools/call write_file \xe2\x86\x92 PROMPT\r\n")
        child.expect_exact(b"approve? [y/N/s]: ")
        shown = child.before.decode()
        assert '  name: "write_file"' in shown
        assert '  arguments.path: "/home/agent/.bashrc"' in shown
        assert '  arguments.content: "harmless harmless' in shown and "(2,700 chars)" in shown
        assert '  _meta.progressToken: "M-META-SHOWN"' in shown
        ev = wait_pending()
        # The whole request, as the digest binds it.
        whole = linpodx("approvals", "show", ev["approval_id"], "--json")
        request = json.loads(whole.stdout)["result"]["request"]
        assert request["params"]["arguments"]["content"] == "harmless " * 300
        assert request["params"]["_meta"] == {"progressToken": "M-META-SHOWN"}
        assert approvals.request_digest(request) == ev["digest"]
        text = linpodx("approvals", "show", ev["approval_id"]).stdout
        assert f"digest: {ev['digest']}" in text and '"progressToken": "M-META-SHOWN"' in text
        child.sendline(b"y")
        child.expect(rb"APPROVED")
        assert "wrote 2700 bytes" in s.recv_id(1)["result"]["content"][0]["text"]
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        if child is not None:
            child.terminate(force=True)
        s.kill()
    # What was forwarded is what was shown: the request the digest covers.
    (call,) = [m for m in received(unique_name) if m.get("method") == "tools/call"]
    assert approvals.request_digest(call) == ev["digest"]


def test_the_client_cannot_approve_its_own_call(tmp_path: Path, unique_name: str) -> None:
    """#5: the id was on the client's stderr, and `linpodx approve ID` needed no terminal."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=60)
    s = RawSession(unique_name)
    try:
        s.handshake()
        sid = s.session_id()
        s.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "write_file", "arguments": {"path": "p", "content": "M-SELF"}},
            }
        )
        ev = wait_pending()
        time.sleep(0.5)
        assert ev["approval_id"] not in s.stderr.decode() and "apr_" not in s.stderr.decode()
        assert "waits for a person" in s.stderr.decode()
        # What a client's shell tool runs: no terminal on stdin.
        self_ = linpodx("approve", ev["approval_id"], check=False)
        assert self_.returncode == 2 and "needs a terminal" in self_.stderr, self_.stderr
        assert approvals.status(ev["approval_id"]) == "pending"
        # From a terminal it works, and the answer says so.
        tty = pexpect.spawn(
            sys.executable,
            ["-m", "linpodx", "approve", ev["approval_id"]],
            env=dict(os.environ),
            timeout=30,
        )
        tty.expect(rb"decision: approved")
        tty.expect(pexpect.EOF)
        assert s.recv_id(1)["result"]["content"][0]["text"] == "wrote 6 bytes to p"
        # A script answers with --non-interactive, recorded as such.
        s.send(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "write_file", "arguments": {"path": "p", "content": "M-2"}},
            }
        )
        ev2 = wait_pending({ev["approval_id"]})
        linpodx("deny", "--non-interactive", ev2["approval_id"])
        assert s.recv_id(2)["result"]["isError"] is True
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    decided = [r.data for r in records(sid) if r.type == "approval.decided"]
    assert [(d["decision"], d["by"]["interactive"]) for d in decided] == [
        ("approve", True),
        ("deny", False),
    ]
    assert decided[1]["reason"] == "denied by a person (non-interactive)"


def test_a_cancellation_storm_frees_the_slots(tmp_path: Path, unique_name: str) -> None:
    """#6: each cancelled call kept its slot; after 4,096 the session refused even ping."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    s = RawSession(unique_name)
    storm = 4200
    try:
        s.handshake()
        sid = s.session_id()
        batch = bytearray()
        for i in range(1, storm + 1):
            call = {
                "jsonrpc": "2.0",
                "id": i,
                "method": "tools/call",
                "params": {"name": "slow", "arguments": {"seconds": 600}},
            }
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": i, "reason": "storm"},
            }
            batch += json.dumps(call).encode() + b"\n" + json.dumps(cancel).encode() + b"\n"
        assert s.proc.stdin is not None
        s.proc.stdin.write(bytes(batch))
        s.proc.stdin.flush()
        ping = s.request("after-the-storm", "ping", timeout=180)
        assert ping["result"] == {}, ping
        ok = s.request("echo", "tools/call", {"name": "echo", "arguments": {"text": "M-ALIVE"}})
        assert ok["result"]["content"][0]["text"] == "echo:M-ALIVE"
        refusals = [m for m in s.others if "error" in m or m.get("id") is None]
        assert refusals == [], refusals[:3]
        assert s.close(timeout=120) == 0
    finally:
        s.kill()
    got = received(unique_name)
    # A call cancelled before it was forwarded is withdrawn: never forwarded, its cancellation
    # absorbed (recorded). One already forwarded reaches the server before its cancellation.
    calls = {m["id"]: n for n, m in enumerate(got) if m.get("method") == "tools/call"
             and m["params"]["name"] == "slow"}  # fmt: skip
    cancels = {m["params"]["requestId"]: n for n, m in enumerate(got)
               if m.get("method") == "notifications/cancelled"}  # fmt: skip
    assert cancels.keys() == calls.keys() and all(calls[i] < cancels[i] for i in calls)
    notes = [r.data for r in records(sid) if r.type == "mcp.notification"]
    absorbed = {d["id"] for d in notes if d.get("decision") == "absorbed"}
    assert absorbed.isdisjoint(calls) and absorbed | calls.keys() == set(range(1, storm + 1))
    assert any(m.get("id") == "after-the-storm" for m in got)
    (close,) = [r.data for r in records(sid) if r.type == "session.close"]
    assert close["in_flight"] == 0


def test_denials_use_no_sdk_code_and_set_level_passes(tmp_path: Path, unique_name: str) -> None:
    """#7: -32001 is the SDKs' "request timed out"; #8: logging/setLevel is housekeeping."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    s = RawSession(unique_name)
    try:
        s.handshake()
        denied = s.request(1, "resources/read", {"uri": "file:///M-DENIED"})
        assert denied["error"]["code"] == -32090, denied
        level = s.request(2, "logging/setLevel", {"level": "debug"})
        # The server's own answer (this one has no logging capability), not linpodx's denial.
        assert level.get("error", {}).get("code") != -32090, level
        assert s.close() == 0, s.stderr[-3000:]
    finally:
        s.kill()
    got = received(unique_name)
    assert b"M-DENIED" not in server_log(unique_name)
    assert [m["params"] for m in got if m.get("method") == "logging/setLevel"] == [
        {"level": "debug"}
    ]
