"""The walk-through's demo MCP server behind the real bridge: read auto-allowed, write prompted,
shell denied by this test's profile, and paths confined to the workspace."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from linpodx.profile import store
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import RawSession, linpodx, wait_pending

pytestmark = pytest.mark.podman

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-mcp-server" / "server.py"
PROFILE = """\
version: 1
name: demo-test
mcp_policy:
  - {method: tools/call, tool_name: read_file, decision: auto_allow}
  - {method: tools/call, tool_name: list_dir, decision: auto_allow}
  - {method: tools/call, tool_name: write_file, decision: prompt}
  - {method: tools/call, decision: deny}
mcp:
  approval_timeout_seconds: 120
"""


def call(s: RawSession, i: int, tool: str, **args: str) -> dict[str, object]:
    return s.request(i, "tools/call", {"name": tool, "arguments": args})


def test_demo_server_through_the_gate(tmp_path: Path, unique_name: str) -> None:
    (tmp_path / "demo.yml").write_text(PROFILE)
    store.apply(tmp_path / "demo.yml")
    linpodx(
        "run",
        "-d",
        "--name",
        unique_name,
        "--profile",
        "demo-test",
        "--image",
        DEBIAN_IMAGE,
        "--",
        "sleep",
        "infinity",
    )
    subprocess.run(
        ["podman", "cp", str(DEMO), f"{unique_name}:/tmp/demo.py"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [
            "podman",
            "exec",
            unique_name,
            "sh",
            "-c",
            "mkdir -p /tmp/ws && echo hello-demo > /tmp/ws/README.md && ln -s /etc /tmp/ws/escape",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    s = RawSession(
        unique_name,
        command=["env", "DEMO_ROOTS=/tmp/ws", "HOME=/tmp/ws", "python3", "/tmp/demo.py"],
    )
    try:
        s.handshake()
        read = call(s, 1, "read_file", path="/tmp/ws/README.md")
        assert read["result"]["content"][0]["text"] == "hello-demo\n"  # type: ignore[index]
        assert "README.md" in str(call(s, 2, "list_dir", path="."))
        for i, bad in enumerate(("../../etc/passwd", "/etc/passwd", "escape/passwd")):
            res = call(s, 10 + i, "read_file", path=bad)
            assert res["result"]["isError"] is True  # type: ignore[index]
            assert "outside the workspace" in str(res)
        shell = call(s, 3, "run_shell", cmd="id")
        assert shell["result"]["isError"] is True  # type: ignore[index]
        assert "denied by linpodx policy" in str(shell)
        s.send(
            {
                "jsonrpc": "2.0",
                "id": 4,
                "method": "tools/call",
                "params": {
                    "name": "write_file",
                    "arguments": {"path": "notes.md", "content": "hi"},
                },
            }
        )
        ev = wait_pending()
        assert ev["tool"] == "write_file"
        linpodx("approve", "--non-interactive", ev["approval_id"])
        wrote = s.recv_id(4)
        assert wrote["result"]["content"][0]["text"] == "wrote 2 bytes to /tmp/ws/notes.md"
        assert s.close() == 0
    finally:
        s.kill()
    out = subprocess.run(
        ["podman", "exec", unique_name, "cat", "/tmp/ws/notes.md"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout == "hi"


def test_demo_server_serves_the_mount_targets_its_profile_names(
    tmp_path: Path, unique_name: str
) -> None:
    """No DEMO_ROOTS: the roots are the profile's own mount targets (here `/proj` and
    `/data/in put`, not the walk-through's `/workspace`) and $HOME; the engine's mounts
    (/etc/hosts, /proc, …) are not roots."""
    project, other = tmp_path / "project", tmp_path / "other dir"
    for d, text in ((project, "hello-work\n"), (other, "hello-data\n")):
        d.mkdir()
        (d / "README.md").write_text(text)
        d.chmod(0o755)
        (d / "README.md").chmod(0o644)
    (tmp_path / "mounts.yml").write_text(
        PROFILE.replace("name: demo-test", "name: demo-mounts")
        + f"mounts:\n  - {{source: {project}, target: /proj}}\n"
        + f"  - {{source: '{other}', target: '/data/in put'}}\n"
    )
    store.apply(tmp_path / "mounts.yml")
    linpodx(
        "run", "-d", "--name", unique_name, "--profile", "demo-mounts", "--image", DEBIAN_IMAGE,
        "--", "sleep", "infinity",
    )  # fmt: skip
    subprocess.run(
        ["podman", "cp", str(DEMO), f"{unique_name}:/tmp/demo.py"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    s = RawSession(unique_name, command=["python3", "/tmp/demo.py"])
    try:
        s.handshake()
        read = call(s, 1, "read_file", path="/proj/README.md")
        assert read["result"]["content"][0]["text"] == "hello-work\n"  # type: ignore[index]
        read = call(s, 2, "read_file", path="/data/in put/README.md")
        assert read["result"]["content"][0]["text"] == "hello-data\n"  # type: ignore[index]
        for i, bad in enumerate(("/etc/hosts", "/etc/passwd", "/workspace/README.md")):
            res = call(s, 10 + i, "read_file", path=bad)
            assert res["result"]["isError"] is True  # type: ignore[index]
            assert "outside the workspace (/proj, /data/in put, /home/agent)" in str(res)
        assert s.close() == 0
    finally:
        s.kill()
