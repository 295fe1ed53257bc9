"""Helpers for the MCP integration tests: a linpodx container running the logging test server,
and a raw stdio session with the real bridge."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

SERVER_SRC = Path(__file__).with_name("mcp_test_server.py")
SERVER_PATH = "/tmp/server.py"
SERVER_LOG = "/tmp/mcp-recv.log"

TEST_PROFILE = """\
version: 1
name: {name}
description: MCP bridge integration tests
mcp_policy:
  - method: tools/call
    tool_name: echo
    decision: auto_allow
  - method: tools/call
    tool_name: emit_raw
    decision: auto_allow
  - method: tools/call
    tool_name: slow
    decision: auto_allow
  - method: tools/call
    tool_name: write_file
    decision: prompt
  - method: tools/call
    decision: deny
mcp:
  approval_timeout_seconds: {timeout}
  max_line_bytes: 1048576
"""


def linpodx(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the real linpodx CLI in a subprocess (inherits the test's isolated state env)."""
    res = subprocess.run(
        [sys.executable, "-m", "linpodx", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and res.returncode != 0:
        raise AssertionError(
            f"linpodx {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        )
    return res


def start_server_container(
    tmp_path: Path,
    name: str,
    image: str,
    *,
    timeout: int = 30,
    profile_name: str = "mcp-test",
    profile_text: str = TEST_PROFILE,
) -> None:
    """Apply the test profile (or `profile_text`, formatted with `name` and `timeout`),
    `linpodx run -d` a container with it, copy the server in."""
    prof = tmp_path / f"{profile_name}.yml"
    prof.write_text(profile_text.format(name=profile_name, timeout=timeout))
    from linpodx.profile import store

    store.apply(prof)
    linpodx(
        "run",
        "-d",
        "--name",
        name,
        "--profile",
        profile_name,
        "--image",
        image,
        "--",
        "sleep",
        "infinity",
    )
    subprocess.run(
        ["podman", "cp", str(SERVER_SRC), f"{name}:{SERVER_PATH}"],
        check=True,
        capture_output=True,
        timeout=60,
    )


def attach_argv(name: str, *command: str) -> list[str]:
    """The server command an MCP client launches (`command`: another server than the test
    server, e.g. one that ignores its input closing)."""
    server = list(command) or ["python3", SERVER_PATH]
    return [sys.executable, "-m", "linpodx", "mcp", "attach", "--container", name, "--", *server]


def server_log(name: str) -> bytes:
    """Everything the test server received (read back from the container)."""
    res = subprocess.run(
        ["podman", "exec", name, "cat", SERVER_LOG], capture_output=True, timeout=60
    )
    return res.stdout if res.returncode == 0 else b""


class RawSession:
    """The real bridge as a subprocess, driven over raw stdio bytes."""

    def __init__(self, name: str, command: list[str] | None = None) -> None:
        argv = attach_argv(name)
        if command is not None:
            argv = [*argv[: argv.index("--") + 1], *command]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.others: list[dict[str, Any]] = []
        self.stderr = b""
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        self._e = threading.Thread(target=self._read_err, daemon=True)
        self._e.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr += line

    def send(self, msg: Any) -> None:
        data = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 30) -> dict[str, Any]:
        line = self.lines.get(timeout=timeout)
        obj = json.loads(line)
        assert isinstance(obj, dict), line
        return obj

    def recv_id(self, msg_id: Any, timeout: float = 30) -> dict[str, Any]:
        """The next message with this id (other messages are kept in `others`)."""
        end = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.1, end - time.monotonic()))
            if msg.get("id") == msg_id and "method" not in msg:
                return msg
            self.others.append(msg)

    def no_output(self, wait: float = 1.0) -> None:
        try:
            line = self.lines.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected output from the bridge: {line[:300]!r}")

    def request(
        self, msg_id: Any, method: str, params: dict[str, Any] | None = None, timeout: float = 30
    ) -> dict[str, Any]:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.recv_id(msg_id, timeout)

    def handshake(self, version: str = "2025-06-18") -> dict[str, Any]:
        res = self.request(
            0,
            "initialize",
            {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "1"},
            },
            timeout=60,
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return res

    def close(self, timeout: float = 30) -> int:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        code = self.proc.wait(timeout)
        self._e.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def session_id(self) -> str:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            for line in self.stderr.decode(errors="replace").splitlines():
                if line.startswith("mcp_session_id: "):
                    return line.split(": ", 1)[1].strip()
            time.sleep(0.05)
        raise AssertionError(f"no mcp_session_id on stderr: {self.stderr!r}")


def wait_pending(seen: set[str] | None = None, timeout: float = 30) -> dict[str, Any]:
    """The next approval.pending event not in `seen`, read from the event stream the way
    `linpodx events` reads it (in-process: a subprocess per poll is too slow under load for
    short approval windows)."""
    from linpodx.events.reader import EventFile

    seen = seen if seen is not None else set()
    reader = EventFile()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for ev in reader.read_new():
            if ev.get("type") == "approval.pending" and ev["approval_id"] not in seen:
                seen.add(ev["approval_id"])
                return dict(ev)
        time.sleep(0.05)
    raise AssertionError("no approval.pending event")


def env() -> dict[str, str]:
    """The environment for a client-launched bridge (the isolated state dirs included)."""
    return dict(os.environ)
