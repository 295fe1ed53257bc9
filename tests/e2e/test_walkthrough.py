"""The walk-through's steps 1-7 as a person runs them, in real terminals (pexpect), on real podman
(root and rootless), with every printed field checked.

Terminals: T0 `linpodx run … --interactive --tty` (a shell in the container), T1 `linpodx mcp
attach` (newline-delimited JSON-RPC typed into it, responses read back), T2 `linpodx events
--filter approval` (the prompts, answered `y` and `n`).

This machine has no outside network: a DNS server on 127.0.0.1 stands in for the internet (the
profile's `network.upstream_dns`), answering the allowlisted names with this machine's own
address, where an HTTP server answers. It never forwards a query; nothing leaves the machine.

To keep the suite fast the profile sets `mcp.approval_timeout_seconds: 10` (the walk-through
uses the real 30 s default; `scripts/walkthrough.sh` waits for it): long enough for the listener
to answer on a loaded machine, short enough for the unanswered prompt.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pexpect
import pytest

from linpodx.snapshot.freeze import can_freeze
from tests.conftest import ROOTLESS, run_linpodx
from tests.servers.dns_upstream import DnsUpstream

pytestmark = pytest.mark.podman

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DEMO_IMAGE = os.environ.get("LINPODX_DEMO_IMAGE", "localhost/linpodx-demo/agent:latest")
SERVER = ["python3", "/opt/demo/server.py"]
SERVED = ("registry.example.com", "crates.io", "demo-mirror.test")
WINDOW = 10
LABEL = "before-refactor"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _podman_env() -> dict[str, str]:
    """The environment for podman itself: rootless podman keeps its store under the real HOME."""
    env = dict(os.environ)
    if ROOTLESS:
        env["HOME"] = pwd.getpwuid(os.getuid()).pw_dir
        env.pop("XDG_CONFIG_HOME", None)
    return env


@pytest.fixture(scope="session")
def demo_image() -> str:
    """The demo image for whichever user runs the suite, built by the walk-through's own script
    (it does nothing when the image exists with the same recipe)."""
    res = subprocess.run(
        ["bash", str(EXAMPLES / "build-demo-image.sh"), DEMO_IMAGE],
        capture_output=True,
        text=True,
        timeout=900,
        env=_podman_env(),
        stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, f"build-demo-image.sh failed:\n{res.stdout}\n{res.stderr}"
    assert f"image: {DEMO_IMAGE}" in res.stdout
    return DEMO_IMAGE


def host_ipv4() -> str:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout
    return next(t for t in out.split() if ":" not in t and not t.startswith("127."))


class Internet:
    """The local stand-in: a DNS upstream on loopback and an HTTP server on this host."""

    def __init__(self) -> None:
        self.host = host_ipv4()
        self.dns = DnsUpstream(self._records)
        self.dns_port = self.dns.port
        host = self.host

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = (self.headers.get("Host") or "?").split(":")[0]
                body = f"local stand-in for {name}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer((host, 0), Handler)
        self.http_port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    @property
    def asked(self) -> list[str]:
        """The names the guard asked, lower case."""
        return [name.lower() for name, _type in self.dns.asked]

    def _records(self, name: str, rtype: str) -> list[tuple[str, str, str]] | None:
        name = name.lower()
        if name not in SERVED:
            return None
        return [(name, "A", self.host)] if rtype == "A" else []

    def close(self) -> None:
        self.http.shutdown()
        self.dns.close()


@pytest.fixture
def internet() -> Iterator[Internet]:
    net = Internet()
    yield net
    net.close()


def walkthrough_profile(dest: Path, dns_port: int, http_port: int) -> Path:
    """examples/agent-readonly.yml plus the local upstream, one local name, the local HTTP
    server's port (plain HTTP: an `/http` entry per name) and a short window."""
    text = (EXAMPLES / "agent-readonly.yml").read_text()
    anchor = "    - crates.io\n"
    assert anchor in text, "the example profile changed: update this test"
    text = text.replace(
        anchor,
        anchor
        + "    - demo-mirror.test\n"
        + "".join(
            f"    - {n}:{http_port}/http\n"
            for n in ("registry.example.com", "crates.io", "demo-mirror.test")
        )
        + f'  upstream_dns: ["127.0.0.1:{dns_port}"]\n'
        + "  allow_private_answers: true\n",
    )
    text += f"\nmcp:\n  approval_timeout_seconds: {WINDOW}\n"
    dest.write_text(text)
    return dest


def kv(text: str, key: str) -> str:
    m = re.search(rf"^{re.escape(key)}:\s*(.*?)\s*$", text, re.M)
    assert m, f"no `{key}:` line in:\n{text}"
    return m.group(1)


def _as_a_terminal_would() -> None:
    # A person's terminal delivers Ctrl-C: a suite started in the background (`cmd &` in a
    # script ignores SIGINT, and children inherit that) must not make T2 deaf to it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "linpodx", *args],
        env=dict(os.environ),
        encoding="utf-8",
        timeout=90,
        echo=False,
        dimensions=(50, 250),
        preexec_fn=_as_a_terminal_would,
    )
    return child


class Attach:
    """T1: `linpodx mcp attach` in a terminal; JSON-RPC typed in, responses read back."""

    def __init__(self, name: str) -> None:
        self.child = spawn("mcp", "attach", "--container", name, "--", *SERVER)
        self.seen: list[str] = []

    def send(self, msg: dict[str, Any]) -> None:
        self.child.sendline(json.dumps(msg, separators=(",", ":")))

    def response(self, msg_id: int, timeout: float = 90) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.child.readline().strip()
            if not line:
                continue
            self.seen.append(line)
            if line.startswith("{"):
                obj = json.loads(line)
                if obj.get("id") == msg_id and "method" not in obj:
                    return dict(obj)
        raise AssertionError(f"no response {msg_id}; terminal showed: {self.seen}")

    def call(self, msg_id: int, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)

    def text(self) -> str:
        return "\n".join(self.seen)


def tool_call(att: Attach, msg_id: int, tool: str, arguments: dict[str, Any]) -> None:
    att.call(msg_id, "tools/call", {"name": tool, "arguments": arguments})


def result_text(resp: dict[str, Any]) -> tuple[bool, str]:
    res = resp["result"]
    return bool(res.get("isError")), "".join(c.get("text", "") for c in res["content"])


def expect_prompt(t2: pexpect.spawn, tool: str, marker: str) -> str:
    """Wait for the walk-through's three approval lines for `tool`; return what was shown."""
    t2.expect(rf"\[\d\d:\d\d:\d\d\] (sess_[0-9A-Z]{{26}}) tools/call {tool} → PROMPT\r\n")
    sid = t2.match.group(1)
    # Each key on its own line, then the id.
    t2.expect(r"((?:  [^\r\n]*\r\n)+)approval_id: apr_[0-9A-Z]{26}\r\n")
    shown = t2.match.group(1)
    assert marker in shown and f'  name: "{tool}"\r\n' in shown
    t2.expect_exact("approve? [y/N/s]: ")
    return str(sid)


def test_profile_not_found_troubleshooting(tmp_path: Path) -> None:
    """Troubleshooting: running under a profile that was never applied."""
    res = run_linpodx(
        "run", "--profile", "agent-readonly", "--image", DEMO_IMAGE, "--name", "never-made"
    )
    assert res.returncode == 4
    lines = res.stderr.splitlines()
    assert lines[0] == "error: profile not found: agent-readonly"
    assert lines[1].startswith("hint: ") and "linpodx sandbox apply --profile" in lines[1]
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_walkthrough_steps_1_to_7(
    tmp_path: Path, isolated_state: Path, unique_name: str, demo_image: str, internet: Internet
) -> None:
    name = unique_name  # "agent-1" in the walk-through; unique here (tests may run at once)
    home = isolated_state
    # 1. The profile: read-only project mount, egress allowlist, MCP rules, audit on.
    project = home / "demo-project"
    project.mkdir()
    (project / "README.md").write_text("# demo-project\nMARK-README\n")
    profile = walkthrough_profile(
        tmp_path / "agent-readonly.yml", internet.dns_port, internet.http_port
    )

    # 2. validate and apply.
    res = run_linpodx("sandbox", "validate", str(profile))
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[:5] == [
        "profile: agent-readonly",
        "status:  ok",
        "mounts:  1",
        "egress:  6 hosts allowed",
        "mcp:     3 rules",
    ]
    res = run_linpodx("sandbox", "apply", "--profile", str(profile))
    assert res.returncode == 0, res.stderr
    profile_id = kv(res.stdout, "profile_id")
    audit_hash = kv(res.stdout, "audit_hash")
    assert re.fullmatch(r"prof_[0-9A-Z]{26}", profile_id)
    assert re.fullmatch(r"[0-9a-f]{64}", audit_hash)

    snapshot_made = False
    gone = subprocess.CompletedProcess[str]([], 1, "", "snapshot rm never ran")
    t0 = spawn(
        "run", "--profile", "agent-readonly", "--image", demo_image,
        "--interactive", "--tty", "--name", name,
    )  # fmt: skip
    try:
        # 3. run: own rootfs and $HOME; egress only to the allowlisted names.
        t0.expect(r"container_id: ([0-9a-f]{64})\r\n")
        container_id = t0.match.group(1)
        t0.expect(r"state:\s+running\r\n")
        t0.expect(r"[#$] ")
        # (the container's terminal echoes what is typed: expected outputs differ from the input)
        t0.sendline('echo "H=$HOME"; test -e ' + str(home) + ' || echo "NO-HOST-""HOME"')
        t0.expect(r"H=(/\S+)\r\n")
        assert t0.match.group(1) != str(home)
        t0.expect_exact("NO-HOST-HOME")
        t0.sendline("echo mine > ~/agent-notes.md; touch /workspace/x; echo rc=$?")
        t0.expect("Read-only file system")
        t0.expect(r"rc=[1-9]")
        assert not (project / "x").exists()
        t0.sendline(f"curl -sS --max-time 20 http://registry.example.com:{internet.http_port}/")
        t0.expect_exact("local stand-in for registry.example.com")
        t0.sendline("getent hosts github.com; echo getent=$?")
        t0.expect(r"getent=2")
        assert "github.com" not in internet.asked  # refused locally, never forwarded
        ev = run_linpodx("events", "--no-follow", "--filter", "dns")
        assert "dns lookup denied for github.com" in ev.stdout, ev.stdout
        inspect = subprocess.run(
            ["podman", "inspect", "--format", "{{.Id}}", name],
            capture_output=True, text=True, env=_podman_env(), timeout=60,
        )  # fmt: skip
        assert inspect.stdout.strip() == container_id

        # 4./5. attach (T1) with the approval listener (T2).
        t2 = spawn("events", "--filter", "approval")
        att = Attach(name)
        try:
            att.child.expect(r"mcp_session_id: (sess_[0-9A-Z]{26})\r\n")
            session = att.child.match.group(1)
            att.child.expect_exact("bridge: host stdio <-> container stdio")
            att.child.expect_exact("policy: 3 rules loaded")
            att.call(
                0,
                "initialize",
                {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "e2e", "version": "1"},
                },
            )
            assert att.response(0)["result"]["serverInfo"]["name"] == "linpodx-demo-agent"
            att.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            att.call(1, "tools/list")
            tools = sorted(t["name"] for t in att.response(1)["result"]["tools"])
            assert tools == ["list_dir", "read_file", "run_shell", "write_file"]

            tool_call(att, 2, "read_file", {"path": "/workspace/README.md"})
            assert result_text(att.response(2)) == (False, "# demo-project\nMARK-README\n")

            tool_call(att, 3, "write_file", {"path": "notes.md", "content": "MARK-APPROVED"})
            assert expect_prompt(t2, "write_file", "MARK-APPROVED") == session
            t2.sendline("y")
            t2.expect(r"approval: apr_[0-9A-Z]{26} → APPROVED")
            assert result_text(att.response(3)) == (
                False,
                "wrote 13 bytes to /home/agent/notes.md",
            )

            tool_call(att, 4, "run_shell", {"cmd": "echo MARK-DENIED > ~/denied"})
            assert expect_prompt(t2, "run_shell", "MARK-DENIED") == session
            t2.sendline("n")
            t2.expect(r"approval: apr_[0-9A-Z]{26} → DENIED")
            err, text = result_text(att.response(4))
            assert err and "denied by a person" in text

            # Troubleshooting: a prompt with no listener is denied after the window.
            t2.sendintr()
            t2.expect(pexpect.EOF)
            started = time.monotonic()
            tool_call(att, 5, "write_file", {"path": "late.md", "content": "MARK-LATE"})
            err, text = result_text(att.response(5, timeout=WINDOW + 60))
            assert err and "timeout" in text
            assert time.monotonic() - started >= WINDOW - 1
            att.child.sendeof()
            att.child.expect(rf"session {session} ended")
            att.child.expect(pexpect.EOF)
        finally:
            t2.close(force=True)
            att.child.close(force=True)
        t0.sendline("ls ~; cat ~/notes.md; echo; ls ~/denied ~/late.md 2>&1 | wc -l")
        t0.expect(r"MARK-APPROVED\r\n2\r\n")

        # 6. audit verify: every call in the session's hash chain.
        res = run_linpodx("audit", "verify", "--session", session)
        assert res.returncode == 0, res.stderr
        assert kv(res.stdout, "session") == session
        assert kv(res.stdout, "chain").startswith("OK (head ")
        show = run_linpodx("audit", "show", "--session", session).stdout
        calls = [
            m.groups()
            for ln in show.splitlines()
            if " mcp.request " in ln
            and (m := re.search(r'"decision":"(\w+)".*"method":"tools/call".*"tool":"(\w+)"', ln))
        ]
        assert calls == [
            ("auto_allow", "read_file"),
            ("prompt", "write_file"),
            ("prompt", "run_shell"),
            ("prompt", "write_file"),
        ], show
        assert audit_hash in show  # the chain starts from the profile revision's audit_hash

        # 7. snapshot create / job-status / rollback.
        # (Rootless on cgroup v1 there is no freezer: held by signals, as asked for.)
        held = () if can_freeze() else ("--consistency", "best-effort")
        res = run_linpodx("snapshot", "create", *held, name, "--label", LABEL)
        assert res.returncode == 0, res.stderr
        snapshot_made = True
        job = kv(res.stdout, "job_id")
        assert job.startswith("snap-")
        end = time.monotonic() + 240
        while True:
            st = run_linpodx("snapshot", "job-status", job)
            status = kv(st.stdout, "status")
            if status not in ("queued", "running") or time.monotonic() > end:
                break
            time.sleep(0.5)
        assert status == "succeeded", st.stdout + st.stderr
        assert kv(st.stdout, "image") == f"localhost/linpodx/snapshot/{name}:{LABEL}"

        # The destructive change, typed in the container's terminal: $HOME's files go (and
        # /opt/demo where the container's user may delete it: root in the container when
        # linpodx runs as root; rootless, the agent runs as the person's own uid).
        t0.sendline('rm -rf "$HOME"/* /opt/demo 2>/dev/null; echo "go""ne:$(ls ~ | wc -l)"')
        t0.expect(r"gone:0\r\n")
        res = run_linpodx("snapshot", "rollback", name, "--to", LABEL, timeout=300)
        assert res.returncode == 0, res.stderr
        assert kv(res.stdout, "rolled_back") == "true"
        t0.expect(pexpect.EOF, timeout=120)  # the old container went away under the terminal
        script = "cat ~/notes.md; echo; cat ~/agent-notes.md; ls /opt/demo/server.py"
        back = run_linpodx("exec", name, "--", "sh", "-c", script)
        assert back.returncode == 0, back.stderr
        assert back.stdout.split() == ["MARK-APPROVED", "mine", "/opt/demo/server.py"]
        ps = run_linpodx("ps").stdout
        row = next(ln.split() for ln in ps.splitlines() if ln.split()[:1] == [name])
        assert row[1:] == ["agent-readonly", "1", "running", "healthy"], ps
    finally:
        t0.close(force=True)
        # The container first: podman keeps an image a container still uses.
        run_linpodx("rm", "-f", name)
        if snapshot_made:
            gone = run_linpodx("snapshot", "rm", name, "--label", LABEL)
    # Reached only when the steps passed: the snapshot image went with `snapshot rm`.
    assert "image_deleted: true" in gone.stdout, gone.stdout + gone.stderr
