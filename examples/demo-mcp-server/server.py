"""A small MCP server of the kind a coding agent exposes, built with the official `mcp` SDK.

It runs inside a linpodx container (`linpodx mcp attach --container agent-1 -- python3
/opt/demo/server.py`) and speaks newline-delimited JSON-RPC on stdio. Its tools act on the
container, never on the host:

- `read_file(path)`: the text of a file (for example /workspace/README.md, the read-only project).
- `write_file(path, content)`: write a file (for example notes.md in the container's own $HOME).
- `run_shell(cmd)`: run a shell command in $HOME and return its exit status and output.
- `list_dir(path)`: the names in a directory.

Paths are confined to the workspace roots: the directories the container's profile mounts (its
`mounts[].target`s, `/workspace` in the walk-through, whatever a profile names: read from
/proc/self/mountinfo, as the container sees them) and the container's $HOME; `DEMO_ROOTS`
(colon-separated) replaces them. Relative paths start in $HOME, and a path that leaves the
roots (`..`, an absolute path elsewhere, a symlink pointing out) is refused. The server trusts nothing
it is told about policy: the gate in front of it (linpodx's MCP bridge) decides which calls ever
reach it.
"""

from __future__ import annotations

import os
import subprocess

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

HOME = os.path.expanduser("~")
# Mount points that are the container engine's, not the profile's.
SYSTEM_DIRS = ("/proc", "/sys", "/dev", "/etc", "/run")
PSEUDO_FS = frozenset({"proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2"})


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def mount_targets(mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """The directories mounted into this container from the host (its profile's mount
    targets): not `/`, nothing under the engine's own dirs, not a fresh pseudo file system."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, fstype = head.split(), (tail.split() or [""])[0]
        if len(fields) < 5:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if point == "/" or any(point == d or point.startswith(d + "/") for d in SYSTEM_DIRS):
            continue
        if fstype in PSEUDO_FS and root == "/":
            continue  # made here (a tmpfs $HOME), not a host directory
        if os.path.isdir(point) and point not in found:
            found.append(point)
    return found


def _roots() -> tuple[str, ...]:
    given = os.environ.get("DEMO_ROOTS")
    roots = given.split(":") if given is not None else [*mount_targets(), HOME]
    return tuple(os.path.realpath(r) for r in roots if r)


ROOTS = _roots()
MAX_READ = 64 * 1024

app = MCPServer("linpodx-demo-agent")


def _path(path: str) -> str:
    """The real path of `path` inside one of the roots; ToolError (the model reads why) if not."""
    full = os.path.realpath(os.path.join(HOME, os.path.expanduser(path)))
    for root in ROOTS:
        if full == root or full.startswith(root.rstrip("/") + "/"):
            return full
    raise ToolError(f"{path!r} is outside the workspace ({', '.join(ROOTS)})")


@app.tool()
def read_file(path: str) -> str:
    """Return the text of a file in the workspace (at most 64 KiB)."""
    with open(_path(path), encoding="utf-8", errors="replace") as f:
        return f.read(MAX_READ)


@app.tool()
def write_file(path: str, content: str) -> str:
    """Write text to a file in the workspace, replacing it."""
    full = _path(path)
    with open(full, "w", encoding="utf-8") as f:
        f.write(content)
    return f"wrote {len(content.encode())} bytes to {full}"


@app.tool()
def run_shell(cmd: str) -> str:
    """Run a shell command in $HOME; return its exit status and combined output (last 4 KiB)."""
    res = subprocess.run(
        ["/bin/sh", "-c", cmd],
        cwd=HOME,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=60,
        check=False,
    )
    return f"exit {res.returncode}\n" + res.stdout.decode(errors="replace")[-4096:]


@app.tool()
def list_dir(path: str) -> list[str]:
    """The names in a workspace directory, sorted."""
    return sorted(os.listdir(_path(path)))


if __name__ == "__main__":
    app.run()
