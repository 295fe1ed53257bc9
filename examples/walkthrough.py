"""The walk-through, run for real: an AI agent's MCP server inside a linpodx sandbox.

    python examples/walkthrough.py [--dir DIR] [--image IMAGE]

Every step runs the real `linpodx` CLI as a subprocess (the MCP client is the official `mcp`
SDK, the second terminal a real pseudo-terminal driven with pexpect) and prints the command and
its real output. It ends with a table of the walk-through's claims: checked, held or FAILED (and
exits non-zero if any failed). `bash scripts/walkthrough.sh` sets the machine up and runs this.

This machine has no outside network, so a DNS server started here stands in for the internet:
the derived profile points linpodx's resolver at it (`network.upstream_dns`) and it answers the
allowlisted names with this machine's own address, where an HTTP server started here answers.
Nothing is ever sent to an outside address.

State: HOME and LINPODX_STATE_DIR point under DIR (a new temp dir by default), so the demo never
mixes with the person's own linpodx state. The state dir is kept at the end (the audit logs can
be checked again with `linpodx audit verify`); the container and snapshot images are removed.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import io
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pexpect

HERE = Path(__file__).resolve().parent
BASE_PROFILE = HERE / "agent-readonly.yml"
DEMO_IMAGE = "localhost/linpodx-demo/agent:latest"
SERVER_CMD = ["python3", "/opt/demo/server.py"]
LABEL = "before-refactor"
# Names the local stand-in upstream answers (with this machine's address). The first two are the
# example profile's; the third is added by the derived profile to show a local name.
SERVED = ("registry.example.com", "crates.io", "demo-mirror.test")
DENIED_NAME = "github.com"
WINDOW = 30  # the profile's approval window: the real default


# --- output -------------------------------------------------------------------------------------
def say(text: str = "") -> None:
    """A line of the walk-through's narration."""
    print(text, flush=True)


def step(title: str) -> None:
    say()
    say(f"== {title} " + "=" * max(3, 74 - len(title)))


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.rstrip("\n").splitlines())


@dataclass
class Claim:
    what: str
    held: bool
    why: str = ""


@dataclass
class Demo:
    """Everything the scenario shares: where it lives, its servers, what it found."""

    root: Path
    home: Path
    state: Path
    image: str
    name: str
    host_ip: str
    env: dict[str, str]
    linpodx: list[str]
    claims: list[Claim] = field(default_factory=list)
    dns_port: int = 0
    http_port: int = 0
    asked: list[tuple[str, str]] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)

    def check(self, what: str, held: bool, why: str = "") -> bool:
        self.claims.append(Claim(what, held, why))
        mark = "held" if held else f"FAILED: {why}"
        say(f"  -> {what}: {mark}")
        return held

    def run(
        self, *args: str, show: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        """Run `linpodx ARGS` for real and show the command and its output."""
        if show:
            say(f"$ linpodx {shlex.join(args)}")
        try:
            res = subprocess.run(
                [*self.linpodx, *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            say(f"    (no answer within {timeout:.0f} s)")
            return subprocess.CompletedProcess(exc.cmd, 124, "", f"timed out after {timeout} s")
        if show:
            if res.stdout.strip():
                say(indent(res.stdout))
            if res.stderr.strip():
                say(indent(res.stderr, "    stderr| "))
            if res.returncode:
                say(f"    (exit {res.returncode})")
        return res

    def in_container(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`linpodx exec NAME -- sh -c SCRIPT` (exec is audited with its argv)."""
        return self.run("exec", self.name, "--", "sh", "-c", script, timeout=timeout)


def field_of(text: str, key: str) -> str | None:
    """The value of a `key: value` line."""
    m = re.search(rf"^{re.escape(key)}:\s*(.*?)\s*$", text, re.M)
    return m.group(1) if m else None


# --- the local stand-in for the internet --------------------------------------------------------
def host_ipv4() -> str:
    """This machine's own (non-loopback) IPv4 address."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=True).stdout
    for tok in out.split():
        if ":" not in tok and not tok.startswith("127."):
            return tok
    raise SystemExit(
        "error: this machine has no non-loopback IPv4 address\nhint: the demo "
        "serves its allowlisted names on this machine's own address"
    )


def start_dns(demo: Demo) -> None:
    """A tiny DNS server on 127.0.0.1: SERVED names -> this machine; anything else NXDOMAIN.

    It never forwards a query anywhere, and it logs what it was asked so the demo can show that
    a denied name never even reached the upstream."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    demo.dns_port = sock.getsockname()[1]

    def loop() -> None:
        while True:
            try:
                data, peer = sock.recvfrom(4096)
            except OSError:
                return
            try:
                query = dns.message.from_wire(data)
            except Exception:  # noqa: S112 - a bad packet must not stop the stand-in
                continue
            resp = dns.message.make_response(query)
            q = query.question[0]
            name = q.name.to_text(omit_final_dot=True).lower()
            rtype = dns.rdatatype.to_text(q.rdtype)
            demo.asked.append((name, rtype))
            if name not in SERVED:
                resp.set_rcode(dns.rcode.NXDOMAIN)
            elif rtype == "A":
                resp.answer.append(dns.rrset.from_text(name + ".", 60, "IN", "A", demo.host_ip))
            sock.sendto(resp.to_wire(), peer)

    threading.Thread(target=loop, daemon=True).start()


def start_http(demo: Demo) -> ThreadingHTTPServer:
    """An HTTP server on this machine's address answering for the SERVED names."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            host = (self.headers.get("Host") or "?").split(":")[0]
            body = f"local stand-in for {host}: hello from this machine\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer((demo.host_ip, 0), Handler)
    demo.http_port = srv.server_address[1]
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# --- steps --------------------------------------------------------------------------------------
def step_project(demo: Demo) -> None:
    step("1. A project for the agent to read: ~/demo-project")
    proj = demo.home / "demo-project"
    (proj / "src").mkdir(parents=True, exist_ok=True)
    (proj / "README.md").write_text("# demo-project\nA tiny project the agent may read.\n")
    (proj / "src" / "app.py").write_text('print("hello from demo-project")\n')
    (proj / "TODO.md").write_text("- refactor app.py\n")
    say(f"HOME for this demo is {demo.home} (linpodx's state: {demo.state})")
    for p in sorted(proj.rglob("*")):
        if p.is_file():
            say(f"    ~/demo-project/{p.relative_to(proj)}")


def derive_profile(demo: Demo) -> Path:
    """examples/agent-readonly.yml plus the local upstream and one local name."""
    step("2. The profile: examples/agent-readonly.yml, plus what this machine needs")
    base = BASE_PROFILE.read_text()
    lines = base.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    inserted = False
    while i < len(lines):
        out.append(lines[i])
        if lines[i].rstrip() == "  egress_dns_allowlist:":
            i += 1
            while i < len(lines) and lines[i].startswith("    - "):
                out.append(lines[i])
                i += 1
            out += [
                "    - demo-mirror.test   # added: a local name, served by the stand-in upstream\n",
                "  # added: the local HTTP server speaks plain HTTP on its own port; a bare name\n",
                "  # allows TLS on 443 only, so each name gets a NAME:PORT/http entry too.\n",
                *(
                    f"    - {n}:{demo.http_port}/http\n"
                    for n in ("registry.example.com", "crates.io", "demo-mirror.test")
                ),
                "  # added: this machine has no outside network; a local DNS upstream stands in\n",
                "  # for the internet and answers the allowlisted names with this machine's\n",
                "  # own address (where a local HTTP server answers), so it must be allowed.\n",
                f'  upstream_dns: ["127.0.0.1:{demo.dns_port}"]\n',
                "  allow_private_answers: true\n",
            ]
            inserted = True
            continue
        i += 1
    if not inserted:
        raise SystemExit("error: examples/agent-readonly.yml has no network.egress_dns_allowlist")
    derived = demo.root / "agent-readonly.demo.yml"
    derived.write_text("".join(out))
    say(f"Written {derived}; what was added to examples/agent-readonly.yml and why:")
    diff = difflib.unified_diff(
        base.splitlines(keepends=True),
        out,
        "examples/agent-readonly.yml",
        derived.name,
        n=1,
    )
    say(indent("".join(diff)))
    return derived


def step_validate_apply(demo: Demo, profile: Path) -> None:
    step("3. linpodx sandbox validate FILE / linpodx sandbox apply --profile FILE")
    res = demo.run("sandbox", "validate", str(profile))
    demo.check(
        "profile validates (status: ok)",
        res.returncode == 0 and field_of(res.stdout, "status") == "ok",
        f"exit {res.returncode}: {res.stderr.strip()[:200]}",
    )
    res = demo.run("sandbox", "apply", "--profile", str(profile))
    pid = field_of(res.stdout, "profile_id") or ""
    ah = field_of(res.stdout, "audit_hash") or ""
    demo.facts["profile_id"] = pid
    demo.facts["audit_hash"] = ah
    demo.check(
        "apply prints profile_id: prof_… and audit_hash",
        res.returncode == 0
        and re.fullmatch(r"prof_[0-9A-Z]{26}", pid) is not None
        and re.fullmatch(r"[0-9a-f]{64}", ah) is not None,
        f"exit {res.returncode}: {res.stdout.strip()[:200]} {res.stderr.strip()[:200]}",
    )


def step_run(demo: Demo) -> bool:
    step(f"4. linpodx run --profile agent-readonly --image IMG --name {demo.name}")
    say("(the walk-through runs it with --interactive --tty; here it runs detached (-d) with")
    say(" `sleep infinity` so this script can go on to the next steps)")
    res = demo.run(
        "run",
        "-d",
        "--profile",
        "agent-readonly",
        "--image",
        demo.image,
        "--name",
        demo.name,
        "--",
        "sleep",
        "infinity",
    )
    cid = res.stdout.strip()  # `run -d` prints the bare id, as podman does; status on stderr
    if res.returncode == 0:
        demo.facts["ran"] = cid
    elif "already" in res.stderr:
        say(
            f"hint: a container called {demo.name} exists already (not this demo's); run again "
            "with --name OTHER"
        )
    return demo.check(
        "run -d prints the container's id, and state: running on stderr",
        res.returncode == 0
        and re.fullmatch(r"[0-9a-f]{64}", cid) is not None
        and field_of(res.stderr, "state") == "running",
        f"exit {res.returncode}: {res.stderr.strip()[:300]}",
    )


def step_isolation(demo: Demo) -> None:
    step("5. The container has its own rootfs and $HOME; the project is read-only")
    host_home = str(demo.home)
    res = demo.in_container(
        'echo "HOME=$HOME"; echo "hostname=$(hostname)"; '
        f'if [ -e {shlex.quote(host_home)} ]; then echo "host HOME visible"; '
        'else echo "the host HOME is not visible in here"; fi; '
        'touch /etc/agent-was-here && echo "rootfs is writable (the container\'s own copy)"; '
        'echo "agent notes" > "$HOME/agent-notes.md" && ls -l "$HOME"'
    )
    home = field_of(res.stdout.replace("=", ": ", 1), "HOME") or ""
    demo.check(
        "own $HOME inside the container",
        res.returncode == 0 and home not in ("", host_home) and "agent-notes.md" in res.stdout,
        f"exit {res.returncode}: {res.stdout.strip()[:200]} {res.stderr.strip()[:200]}",
    )
    demo.check(
        "own rootfs (host files not visible, writes stay inside)",
        res.returncode == 0
        and "the host HOME is not visible" in res.stdout
        and "rootfs is writable" in res.stdout
        and not Path("/etc/agent-was-here").exists(),
        f"exit {res.returncode}: {res.stdout.strip()[:200]}",
    )
    res = demo.in_container(
        'cat /workspace/README.md; echo changed >> /workspace/README.md; echo "write exit $?"'
    )
    unchanged = "changed" not in (demo.home / "demo-project" / "README.md").read_text()
    demo.check(
        "project mounted read-only at /workspace (reads work, a write fails)",
        "# demo-project" in res.stdout
        and "Read-only file system" in res.stdout + res.stderr
        and re.search(r"write exit [1-9]", res.stdout) is not None
        and unchanged,
        f"exit {res.returncode}: {res.stdout.strip()[:200]} {res.stderr.strip()[:200]}",
    )


def step_egress(demo: Demo) -> None:
    step("6. Egress reaches only the allowlisted names")
    say("this machine has no outside network; a local DNS upstream stands in for the internet:")
    say(f"  127.0.0.1:{demo.dns_port} answers {', '.join(SERVED)} with this machine's address")
    say(
        f"  {demo.host_ip}, where an HTTP server started by this script listens on port "
        f"{demo.http_port}. It forwards nothing."
    )
    res = demo.in_container("getent hosts registry.example.com")
    demo.check(
        "an allowlisted name resolves (registry.example.com)",
        res.returncode == 0 and demo.host_ip in res.stdout,
        f"exit {res.returncode}: {res.stdout.strip()} {res.stderr.strip()[:200]}",
    )
    res = demo.in_container(f"curl -sS --max-time 15 http://registry.example.com:{demo.http_port}/")
    demo.check(
        "an HTTP fetch from an allowlisted name works",
        res.returncode == 0 and "local stand-in for registry.example.com" in res.stdout,
        f"exit {res.returncode}: {res.stdout.strip()[:200]} {res.stderr.strip()[:200]}",
    )
    say(f"Now a name that is not on the list ({DENIED_NAME}): linpodx's resolver refuses it")
    say("here, on this machine; nothing is sent anywhere.")
    res = demo.in_container(
        "t=$(date +%s%N); curl -sS --max-time 15 https://github.com/ ; rc=$?; "
        'echo "curl exit $rc after $(( ($(date +%s%N) - t) / 1000000 )) ms"'
    )
    m = re.search(r"curl exit (\d+) after (\d+) ms", res.stdout)
    fast = m is not None and m.group(1) != "0" and int(m.group(2)) < 5000
    demo.check(
        f"a non-allowlisted name ({DENIED_NAME}) fails at once",
        fast and "Could not resolve host" in res.stdout + res.stderr,
        f"{res.stdout.strip()[:200]} {res.stderr.strip()[:200]}",
    )
    demo.check(
        f"the denial is local: the upstream was never asked for {DENIED_NAME}",
        all(name != DENIED_NAME for name, _ in demo.asked)
        and any(name == "registry.example.com" for name, _ in demo.asked),
        f"upstream saw {sorted(set(demo.asked))}",
    )
    res = demo.run("events", "--no-follow", "--filter", "dns")
    demo.check(
        f"`linpodx events --filter dns` shows dns lookup denied for {DENIED_NAME}",
        f"dns lookup denied for {DENIED_NAME}" in res.stdout,
        f"exit {res.returncode}: {res.stdout.strip()[-300:]}",
    )


class Listener:
    """Terminal 2: `linpodx events --filter approval` in a real pseudo-terminal (pexpect).

    Answers `y` to a write_file prompt and `n` to anything else, like a careful person."""

    def __init__(self, demo: Demo) -> None:
        self.log = io.StringIO()
        self.answers: list[tuple[str, str]] = []
        self.child = pexpect.spawn(
            demo.linpodx[0],
            [*demo.linpodx[1:], "events", "--filter", "approval"],
            env=demo.env,
            encoding="utf-8",
            timeout=None,
            dimensions=(40, 200),
        )
        self.child.logfile_read = self.log
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.child.expect(r"approve\? \[y/N(?:/s)?\]: ", timeout=0.5)
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                return
            m = re.findall(r"tools/call (\S+) → PROMPT", self.child.before or "")
            tool = m[-1] if m else "?"
            answer = "y" if tool == "write_file" else "n"
            time.sleep(1.0)  # a person reads the payload before answering
            self.child.sendline(answer)
            self.answers.append((tool, answer))

    def close(self) -> str:
        self.stop.set()
        self.thread.join(5)
        time.sleep(0.5)
        try:
            self.child.read_nonblocking(65536, timeout=0.5)
        except (pexpect.TIMEOUT, pexpect.EOF):
            pass
        self.child.sendintr()
        self.child.close(force=True)
        return self.log.getvalue()


def _text(result: Any) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


async def mcp_session(demo: Demo, errlog: Any, on_call: Callable[[str], None]) -> dict[str, Any]:
    """The agent side: the official MCP SDK client launching `linpodx mcp attach`."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=demo.linpodx[0],
        args=[*demo.linpodx[1:], "mcp", "attach", "--container", demo.name, "--", *SERVER_CMD],
        env=demo.env,
    )
    out: dict[str, Any] = {}
    async with Client(stdio_client(params, errlog=errlog)) as client:
        out["protocol"] = client.protocol_version
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        on_call("tools/list")
        r = await client.call_tool("read_file", {"path": "/workspace/README.md"})
        out["read_file"] = (r.is_error, _text(r))
        on_call("read_file")
        r = await client.call_tool(
            "write_file", {"path": "notes.md", "content": "refactor plan: split app.py\n"}
        )
        out["write_file"] = (r.is_error, _text(r))
        on_call("write_file")
        r = await client.call_tool("run_shell", {"cmd": "rm -f notes.md; echo pwned > shell-ran"})
        out["run_shell"] = (r.is_error, _text(r))
        on_call("run_shell")
        out["listener_stop"] = True
        on_call("stop-listener")
        t0 = time.monotonic()
        r = await client.call_tool("write_file", {"path": "unanswered.md", "content": "x"})
        out["unanswered"] = (r.is_error, _text(r), time.monotonic() - t0)
        on_call("unanswered")
    return out


def step_mcp(demo: Demo) -> None:
    step("7. linpodx mcp attach: every tool call passes the gate")
    say("Terminal 2 (a pseudo-terminal, a separate process):")
    say("$ linpodx events --filter approval")
    listener = Listener(demo)
    time.sleep(1.5)
    say("Terminal 1: the agent's MCP client (the official `mcp` SDK) launches the server as")
    say(f"$ linpodx mcp attach --container {demo.name} -- {shlex.join(SERVER_CMD)}")
    transcript: dict[str, str] = {}

    def on_call(what: str) -> None:
        if what == "stop-listener":
            transcript["listener"] = listener.close()
            say("(terminal 2 closed: nobody is listening now)")
            say(f"One more prompted call, left unanswered: waiting {WINDOW} s (the default window)")
        elif what != "unanswered":
            say(f"  client: {what} done")

    errpath = demo.root / "mcp-attach.stderr"
    try:
        with open(errpath, "w") as errlog:
            out = asyncio.run(asyncio.wait_for(mcp_session(demo, errlog, on_call), 600))
    except Exception as exc:  # any failure here is reported as a failed claim
        out = {"error": f"{type(exc).__name__}: {exc}"}
    if "listener" not in transcript:
        transcript["listener"] = listener.close()
    stderr = errpath.read_text() if errpath.exists() else ""
    say("Bridge (stderr of linpodx mcp attach):")
    say(indent(stderr))
    say("Terminal 2 showed:")
    say(indent(transcript["listener"].replace("\r", ""), "    term2| "))
    if "error" in out:
        demo.check("the MCP session ran", False, out["error"])
        return
    sid = field_of(stderr, "mcp_session_id") or ""
    demo.facts["session"] = sid
    say("Client results:")
    say(f"    protocol: {out['protocol']}")
    say(f"    tools/list: {', '.join(out['tools'])}")
    for key in ("read_file", "write_file", "run_shell"):
        err, text = out[key]
        say(f"    {key}: {'isError ' if err else ''}{text.strip()[:160]!r}")
    err, text, took = out["unanswered"]
    say(
        f"    write_file (unanswered): {'isError ' if err else ''}{text.strip()[:160]!r} "
        f"after {took:.1f} s"
    )
    demo.check(
        "attach prints mcp_session_id: sess_… and bridges host stdio <-> container stdio",
        re.fullmatch(r"sess_[0-9A-Z]{26}", sid) is not None
        and "bridge: host stdio <-> container stdio" in stderr,
        stderr.strip()[:300],
    )
    demo.check(
        "tools/list passes (read_file, write_file, run_shell, list_dir)",
        out["tools"] == ["list_dir", "read_file", "run_shell", "write_file"],
        str(out["tools"]),
    )
    demo.check(
        "read_file is auto-allowed",
        out["read_file"][0] is False and "# demo-project" in out["read_file"][1],
        str(out["read_file"]),
    )
    log = transcript["listener"]
    demo.check(
        "write_file prompts in terminal 2 (→ PROMPT, every argument, approve? [y/N/s]:)",
        re.search(r"\[\d\d:\d\d:\d\d\] sess_\S+ tools/call write_file → PROMPT", log) is not None
        and 'arguments.path: "notes.md"' in log
        and "arguments.content: " in log
        and "approve? [y/N/s]:" in log,
        log[-300:],
    )
    demo.check(
        "write_file approved from terminal 2 and done",
        ("write_file", "y") in listener.answers
        and out["write_file"][0] is False
        and "wrote" in out["write_file"][1],
        f"answers {listener.answers}, result {out['write_file']}",
    )
    demo.check(
        "run_shell prompts and is denied from terminal 2 (never reaches the server)",
        ("run_shell", "n") in listener.answers and out["run_shell"][0] is True,
        f"answers {listener.answers}, result {out['run_shell']}",
    )
    demo.check(
        f"a prompt nobody answers is denied after the {WINDOW} s window",
        err is True and took >= WINDOW - 1,
        f"isError={err} after {took:.1f} s: {text[:200]}",
    )
    res = demo.in_container('ls "$HOME"; cat "$HOME/notes.md"')
    demo.check(
        "the approved write landed in the container's $HOME; the denied calls never ran",
        "refactor plan" in res.stdout
        and "shell-ran" not in res.stdout
        and "unanswered.md" not in res.stdout,
        res.stdout.strip()[:300],
    )


def step_audit(demo: Demo) -> None:
    step("8. linpodx audit verify --session sess_…")
    sid = demo.facts.get("session", "")
    if not sid:
        demo.check("the session's hash chain verifies (chain: OK)", False, "no session id")
        return
    res = demo.run("audit", "verify", "--session", sid)
    demo.check(
        "the session's hash chain verifies (chain: OK)",
        res.returncode == 0 and (field_of(res.stdout, "chain") or "").startswith("OK"),
        f"exit {res.returncode}: {res.stdout.strip()} {res.stderr.strip()}",
    )
    res = demo.run("audit", "show", "--session", sid, show=False)
    calls = [ln for ln in res.stdout.splitlines() if '"method":"tools/call"' in ln]
    say(f"The session chain holds {len(res.stdout.splitlines())} records; its tools/call requests:")
    for ln in calls:
        tool = re.search(r'"tool":"([^"]+)"', ln)
        dec = re.search(r'"decision":"([^"]+)"', ln)
        if '"kind":"request"' in ln and tool and dec:
            say(f"    {tool.group(1)}: {dec.group(1)}")
    decided = [ln for ln in res.stdout.splitlines() if "approval.decided" in ln]
    for ln in decided:
        d = re.search(r'"decision":"([^"]+)"', ln)
        r = re.search(r'"reason":"([^"]+)"', ln)
        say(f"    approval.decided: {d.group(1) if d else '?'} ({r.group(1) if r else '?'})")
    want = {"read_file": "auto_allow", "write_file": "prompt", "run_shell": "prompt"}
    recorded = all(
        any(f'"tool":"{t}"' in ln and f'"decision":"{d}"' in ln for ln in calls)
        for t, d in want.items()
    )
    demo.check(
        "every tool call was recorded with its decision (4 calls, 3 approval decisions)",
        recorded
        and len([ln for ln in calls if '"kind":"request"' in ln]) == 4
        and len(decided) == 3,
        f"{len(calls)} tools/call records, {len(decided)} decisions",
    )


def step_snapshot(demo: Demo) -> None:
    step("9. linpodx snapshot create / job-status / rollback")
    res = demo.run("snapshot", "create", demo.name, "--label", LABEL)
    job = field_of(res.stdout, "job_id") or ""
    if res.returncode == 0:
        demo.facts["snapshot"] = job
    if not demo.check(
        "snapshot create prints job_id",
        res.returncode == 0 and job.startswith("snap-"),
        f"exit {res.returncode}: {res.stdout.strip()} {res.stderr.strip()}",
    ):
        return
    status = ""
    deadline = time.monotonic() + 300
    res = demo.run("snapshot", "job-status", job)
    polled = False
    while time.monotonic() < deadline:
        status = field_of(res.stdout, "status") or ""
        if status not in ("queued", "running"):
            break
        time.sleep(1)
        polled = True
        res = demo.run("snapshot", "job-status", job, show=False)
    if polled:
        say("(polled until the job finished)")
        say("$ linpodx snapshot job-status " + job)
        say(indent(res.stdout))
    if not demo.check(
        "job-status says status: succeeded",
        status == "succeeded",
        f"status {status!r}: {res.stdout.strip()} {res.stderr.strip()}",
    ):
        return
    say("A destructive change: the agent deletes its $HOME's files and the MCP server.")
    res = demo.in_container(
        'rm -rf "$HOME"/* /opt/demo; echo "files left in HOME: $(ls -A "$HOME" | wc -l)"; '
        "ls /opt/demo 2>&1"
    )
    demo.check(
        "the destructive change happened",
        "files left in HOME: 0" in res.stdout and "No such file" in res.stdout,
        res.stdout.strip()[:200],
    )
    res = demo.run("snapshot", "rollback", demo.name, "--to", LABEL, timeout=300)
    demo.check(
        "rollback prints rolled_back: true",
        res.returncode == 0 and field_of(res.stdout, "rolled_back") == "true",
        f"exit {res.returncode}: {res.stdout.strip()} {res.stderr.strip()}",
    )
    res = demo.in_container(
        'ls "$HOME"; cat "$HOME/notes.md"; ls /opt/demo/server.py; '
        "test -e /etc/agent-was-here && echo rootfs-change-kept"
    )
    demo.check(
        "the change is gone: $HOME's files and /opt/demo are back",
        res.returncode == 0
        and "refactor plan" in res.stdout
        and "agent-notes.md" in res.stdout
        and "/opt/demo/server.py" in res.stdout
        and "rootfs-change-kept" in res.stdout,
        f"exit {res.returncode}: {res.stdout.strip()[:300]} {res.stderr.strip()[:200]}",
    )
    res = demo.run("ps")
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith(demo.name + " ")), "")
    demo.check(
        "after rollback: same profile, running, egress guard healthy",
        "agent-readonly" in line and "running" in line and "healthy" in line,
        line or res.stdout.strip()[:300],
    )
    res = demo.in_container(f"curl -sS --max-time 15 http://crates.io:{demo.http_port}/")
    demo.check(
        "after rollback: allowlisted egress still works (crates.io)",
        res.returncode == 0 and "local stand-in for crates.io" in res.stdout,
        f"exit {res.returncode}: {res.stdout.strip()[:200]} {res.stderr.strip()[:200]}",
    )


def ours(demo: Demo) -> bool:
    """Whether the container called NAME is this demo's (its profile_id label is ours)."""
    res = subprocess.run(
        [
            "podman",
            "container",
            "inspect",
            "--format",
            '{{index .Config.Labels "linpodx.profile_id"}}',
            demo.name,
        ],
        capture_output=True,
        text=True,
        env=demo.env,
        timeout=60,
        check=False,
    )
    pid = demo.facts.get("profile_id")
    return bool(pid) and res.returncode == 0 and res.stdout.strip() == pid


def cleanup(demo: Demo) -> None:
    step("Cleaning up (the state dir is kept)")
    # The container first: a snapshot image still used by a container cannot be deleted.
    if ours(demo):
        demo.run("rm", "-f", demo.name)
    elif demo.facts.get("ran"):
        say(f"(container {demo.name} is gone or no longer ours: nothing to remove)")
    if demo.facts.get("snapshot"):
        demo.run("snapshot", "rm", demo.name, "--label", LABEL)


def summary(demo: Demo) -> int:
    step("Summary: the walk-through's claims")
    width = max(len(c.what) for c in demo.claims) if demo.claims else 10
    failed = 0
    for c in demo.claims:
        if c.held:
            say(f"  {c.what:<{width}}  checked, held")
        else:
            failed += 1
            say(f"  {c.what:<{width}}  checked, FAILED: {c.why}")
    say()
    say(f"{len(demo.claims) - failed} of {len(demo.claims)} claims held.")
    say(f"linpodx state (audit logs, events): {demo.state}")
    say("Check the audit chains yourself:")
    cmd = f"LINPODX_STATE_DIR={demo.state} {shlex.join(demo.linpodx)}"
    say(f"  {cmd} audit verify")
    if demo.facts.get("session"):
        say(f"  {cmd} audit verify --session {demo.facts['session']}")
    say("walkthrough: " + ("all claims held" if not failed else f"{failed} claim(s) FAILED"))
    return 1 if failed else 0


def linpodx_argv() -> list[str]:
    """The real CLI: the `linpodx` script next to this python, else `python -m linpodx`."""
    script = Path(sys.executable).with_name("linpodx")
    return [str(script)] if script.exists() else [sys.executable, "-m", "linpodx"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="where HOME and the state dir go (default: a new temp dir)")
    ap.add_argument("--image", default=DEMO_IMAGE, help="the agent image (demo MCP server in it)")
    ap.add_argument("--name", default="agent-1", help="the container's name (default agent-1)")
    args = ap.parse_args(argv)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="linpodx-walkthrough-"))
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    home, state = root / "home", root / "state"
    home.mkdir(exist_ok=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("XDG_STATE_HOME", "XDG_CONFIG_HOME", "LINPODX_"))
    }
    env.update(HOME=str(home), LINPODX_STATE_DIR=str(state), NO_COLOR="1", TERM="xterm")
    if os.geteuid() != 0:
        # Rootless podman keeps its image store under the person's real HOME.
        real = os.path.expanduser("~")
        env.setdefault("XDG_DATA_HOME", os.path.join(real, ".local", "share"))
        env.setdefault("XDG_CONFIG_HOME", os.path.join(real, ".config"))
    demo = Demo(root, home, state, args.image, args.name, host_ipv4(), env, linpodx_argv())
    if shutil.which("podman") is None:
        say("error: podman is not installed\nhint: run `bash scripts/walkthrough.sh` as root")
        return 1
    say("The linpodx walk-through: an AI agent's MCP server in a sandbox, for real.")
    say("This machine has no outside network; a local DNS upstream stands in for the internet.")
    start_dns(demo)
    http = start_http(demo)
    try:
        step_project(demo)
        profile = derive_profile(demo)
        step_validate_apply(demo, profile)
        if step_run(demo):
            step_isolation(demo)
            step_egress(demo)
            step_mcp(demo)
            step_audit(demo)
            step_snapshot(demo)
    except KeyboardInterrupt:
        demo.check("the walk-through ran to the end", False, "interrupted")
    finally:
        cleanup(demo)
        http.shutdown()
    return summary(demo)


if __name__ == "__main__":
    sys.exit(main())
