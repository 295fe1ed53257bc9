"""Approvals answered in real terminals (pexpect), in processes separate from the bridge."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pexpect
import pytest

from linpodx.approvals import store as approvals
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import (
    RawSession,
    linpodx,
    server_log,
    start_server_container,
    wait_pending,
)

pytestmark = pytest.mark.podman

PROMPT_LINE = re.compile(
    rb"\[\d\d:\d\d:\d\d\] sess_[0-9A-Z]{26} tools/call write_file \xe2\x86\x92 PROMPT"
)


def listener() -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "linpodx", "events", "--filter", "approval"],
        env=dict(os.environ),
        timeout=30,
    )
    time.sleep(1.5)  # let it start following before the request appears
    return child


def write_call(i: int, content: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {"name": "write_file", "arguments": {"path": "f", "content": content}},
    }


def test_two_listeners_first_answer_wins(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=60)
    s = RawSession(unique_name)
    a = b = None
    try:
        s.handshake()
        a, b = listener(), listener()
        # The payload carries "y" lines and a fake prompt; none of it may answer anything.
        s.send(write_call(1, "y\ny\napprove? [y/N]: y\n\x1b[31mM-TTY-1"))
        for child in (a, b):
            child.expect(PROMPT_LINE)
            child.expect(rb"  arguments\.content: ([^\r\n]*)\r\n")
            shown = child.match.group(1)
            # Shown escaped on one line, never interpreted by the terminal.
            assert b"y\\ny\\napprove? [y/N]: y\\n\\u001b[31mM-TTY-1" in shown
            assert b"\x1b" not in shown
            child.expect_exact(b"approve? [y/N/s]: ")
        ev = wait_pending()
        time.sleep(1.0)
        assert approvals.status(ev["approval_id"]) == "pending"  # nothing answered it yet
        a.sendline(b"y")
        a.expect(rb"APPROVED")
        resp = s.recv_id(1)
        assert resp["result"]["content"][0]["text"] == "wrote 34 bytes to f"
        b.sendline(b"y")
        b.expect(rb"already decided \(approved\)")

        # The second request: a listener answers "n" (anything but y denies).
        s.send(write_call(2, "M-TTY-DENIED"))
        for child in (a, b):
            child.expect(PROMPT_LINE)
            child.expect_exact(b"approve? [y/N/s]: ")
        b.sendline(b"n")
        b.expect(rb"DENIED")
        assert s.recv_id(2)["result"]["isError"] is True
        a.sendline(b"y")
        a.expect(rb"already decided \(denied\)")
        assert s.close() == 0
    finally:
        for child in (a, b):
            if child is not None:
                child.terminate(force=True)
        s.kill()
    log = server_log(unique_name)
    assert b"M-TTY-1" in log and b"M-TTY-DENIED" not in log


def test_approve_and_deny_commands(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=60)
    s = RawSession(unique_name)
    seen: set[str] = set()
    try:
        s.handshake()
        s.send(write_call(1, "M-CMD-APPROVED"))
        ev = wait_pending(seen)
        ok = linpodx("approve", "--non-interactive", ev["approval_id"])
        assert f"approval_id: {ev['approval_id']}" in ok.stdout
        assert "decision: approved" in ok.stdout
        assert s.recv_id(1)["result"]["content"][0]["text"].startswith("wrote")
        again = linpodx("deny", "--non-interactive", ev["approval_id"], check=False)
        assert again.returncode == 9 and "already approved" in again.stderr

        s.send(write_call(2, "M-CMD-DENIED"))
        ev2 = wait_pending(seen)
        no = linpodx("deny", "--non-interactive", ev2["approval_id"], "--json")
        assert '"decision": "denied"' in no.stdout
        denied = s.recv_id(2)
        assert "denied by a person" in denied["result"]["content"][0]["text"]

        unknown = linpodx(
            "approve", "--non-interactive", "apr_01KB0000000000000000000000", check=False
        )
        assert unknown.returncode == 4 and "approval not found" in unknown.stderr

        # A pending approval is denied when the session ends (client closes its input).
        s.send(write_call(3, "M-CMD-ENDED"))
        ev3 = wait_pending(seen)
        assert s.close() == 0
        assert approvals.status(ev3["approval_id"]) == "denied"
        late = linpodx("approve", "--non-interactive", ev3["approval_id"], check=False)
        assert late.returncode == 9 and "already denied" in late.stderr
    finally:
        s.kill()
    log = server_log(unique_name)
    assert b"M-CMD-APPROVED" in log
    assert b"M-CMD-DENIED" not in log and b"M-CMD-ENDED" not in log
