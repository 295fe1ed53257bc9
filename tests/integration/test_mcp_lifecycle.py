"""How a session ends: server exit code, SIGTERM with a pending approval, container stopped.
In every case pending approvals are denied and the session chain gets its closing record."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from linpodx.approvals import store as approvals
from linpodx.audit import chain as audit_chain
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import (
    RawSession,
    attach_argv,
    linpodx,
    start_server_container,
    wait_pending,
)

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
        attach_argv(unique_name, "python3", "-c", "import sys; sys.exit(3)"),
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


def _marked_in(name: str) -> list[str]:
    """Command lines of the container's processes that carry an `mcp attach` session's mark."""
    res = subprocess.run(
        [
            "podman",
            "exec",
            name,
            "sh",
            "-c",
            'for e in /proc/[0-9]*/environ; do if tr "\\0" "\\n" <"$e" 2>/dev/null | '
            'grep -q "^LINPODX_MCP_SESSION="; then tr "\\0" " " <"${e%/environ}/cmdline"; '
            "echo; fi; done",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return [line for line in res.stdout.splitlines() if line.strip()]


def test_a_server_that_ignores_its_input_closing_is_ended_in_the_container(
    tmp_path: Path, unique_name: str
) -> None:
    """The client closes its input, the server (and a child it started) ignore it: linpodx
    ends its podman exec after the grace period, then kills both processes in the container
    by the session's mark (rootless through `podman unshare`), says so and records it."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    res = subprocess.run(
        attach_argv(unique_name, "sh", "-c", "sleep 1000 & exec sleep 1001 </dev/null"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
    )
    err = res.stderr.decode()
    assert res.returncode == 1, err
    assert res.stdout == b""
    assert "linpodx killed 2 of its processes in the container" in err, err
    sid = next(x.split(": ", 1)[1] for x in err.splitlines() if x.startswith("mcp_session_id: "))
    data = _closing(sid)
    assert data["server_exit"] is None and data["server_killed"] == 2
    assert _marked_in(unique_name) == []
    assert linpodx("audit", "verify", "--session", sid).returncode == 0


def test_only_the_sessions_own_processes_are_ended(tmp_path: Path, unique_name: str) -> None:
    """A process of another session (still running) keeps running when this one is ended."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    other = subprocess.run(
        ["podman", "exec", "-d", "--env", "LINPODX_MCP_SESSION=sess_other", unique_name,
         "sleep", "1002"],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    res = subprocess.run(
        attach_argv(unique_name, "sleep", "1003"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "linpodx killed 1 of its processes in the container" in res.stderr.decode()
    assert _marked_in(unique_name) == ["sleep 1002 "]


def test_ctrl_c_ends_the_server_in_the_container_too(tmp_path: Path, unique_name: str) -> None:
    """Ctrl-C reaches linpodx and its podman exec (one process group); podman exec gives up
    and the server would run on in the container. linpodx ends it and exits 130."""
    import os
    import time

    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    p = subprocess.Popen(
        attach_argv(unique_name, "sleep", "1005"),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while _marked_in(unique_name) != ["sleep 1005 "]:
            assert time.monotonic() < deadline, "the server never started"
            time.sleep(0.2)
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(60) == 130
        assert p.stderr is not None
        err = p.stderr.read().decode()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "linpodx killed 1 processes the server left in the container" in err, err
    sid = next(x.split(": ", 1)[1] for x in err.splitlines() if x.startswith("mcp_session_id: "))
    data = _closing(sid)
    assert data["reason"] == "signal SIGINT" and data["server_killed"] == 1
    assert _marked_in(unique_name) == []


# A server that never reads its input again: whatever the bridge forwards fills the pipe.
NOT_READING = "import time; print('ready', flush=True); time.sleep(600)"


def test_a_server_that_stops_reading_does_not_hang_the_end_of_the_session(
    tmp_path: Path, unique_name: str
) -> None:
    """The client floods allowed notifications at a server that reads nothing, then closes its
    input. The bridge's write to the server blocked, and the session's end waited for it for
    good (a SIGTERM too), with no closing record. Now it ends podman exec and closes."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    proc = subprocess.Popen(
        attach_argv(unique_name, "python3", "-c", NOT_READING),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stderr is not None
    note = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,'
    line = note + b'"progress":1,"message":"' + b"x" * 1000 + b'"}}\n'
    try:
        for _ in range(400):  # ~400 KB: far more than a pipe holds
            proc.stdin.write(line)
    except BrokenPipeError:
        pass
    finally:
        proc.stdin.close()
    proc.wait(timeout=90)
    text = proc.stderr.read().decode()
    assert "ending its podman exec" in text, text
    sid = next(x.split(": ", 1)[1] for x in text.splitlines() if x.startswith("mcp_session_id: "))
    _closing(sid)
    assert linpodx("audit", "verify", "--session", sid).returncode == 0


def test_the_servers_stderr_reaches_the_terminal_escaped(tmp_path: Path, unique_name: str) -> None:
    """podman exec used to inherit linpodx's stderr: a server could write terminal escapes
    (a new window title, a cleared screen, forged linpodx lines) straight to the terminal."""
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    code = "import sys; sys.stderr.write('\\x1b]0;pwned\\x07hello\\nbridge: forged\\r\\n')"
    res = subprocess.run(
        attach_argv(unique_name, "python3", "-c", code),
        stdin=subprocess.PIPE,
        capture_output=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert b"\x1b" not in res.stderr and b"\x07" not in res.stderr and b"\r" not in res.stderr
    assert b"\\x1b]0;pwned\\x07hello" in res.stderr
