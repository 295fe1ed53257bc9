"""Test MCP server (official `mcp` SDK) that logs every byte it receives.

Runs inside a test container as `python3 /tmp/server.py`. Before the SDK reads stdin, a thread
takes the real stdin, appends everything to $MCP_TEST_LOG (default /tmp/mcp-recv.log), and
passes it on through a pipe the SDK reads as its stdin. Tests read the log back to prove that a
message the bridge refused never arrived.

Tools:
- `echo(text)`: returns `echo:TEXT` (auto-allowed in the test profile).
- `write_file(path, content)`, `run_shell(cmd)`: harmless stand-ins the profile prompts/denies.
- `slow(seconds)`: answers after that long (auto-allowed; for cancellations).
- `emit_raw(kind)`: writes hostile output straight to stdout (a sampling request, a response with
  an unknown id, an oversize line, invalid JSON) so tests can check the bridge drops it.
"""

from __future__ import annotations

import json
import os
import threading

import anyio

LOG = os.environ.get("MCP_TEST_LOG", "/tmp/mcp-recv.log")

_real_stdin = os.dup(0)
_r, _w = os.pipe()
os.dup2(_r, 0)
os.close(_r)
_real_stdout = os.dup(1)


def _pump() -> None:
    with open(LOG, "ab", buffering=0) as log:
        while True:
            chunk = os.read(_real_stdin, 65536)
            if not chunk:
                break
            log.write(chunk)
            os.write(_w, chunk)
    os.close(_w)


threading.Thread(target=_pump, daemon=True).start()

from mcp.server.mcpserver import MCPServer  # noqa: E402 - stdin must be swapped first

app = MCPServer("linpodx-test-server")


@app.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return "echo:" + text


@app.tool()
def write_file(path: str, content: str) -> str:
    """Pretend to write a file (the test only checks whether the call arrived)."""
    return f"wrote {len(content)} bytes to {path}"


@app.tool()
def run_shell(cmd: str) -> str:
    """Pretend to run a command."""
    return "ran " + cmd


@app.tool()
async def slow(seconds: float) -> str:
    """Answer after `seconds` (a call the client cancels before then gets no answer)."""
    await anyio.sleep(seconds)
    return "slept"


def _raw(line: bytes) -> None:
    view = memoryview(line)
    while view:
        view = view[os.write(_real_stdout, view) :]


@app.tool()
def emit_raw(kind: str) -> str:
    """Write hostile output to stdout before answering."""
    if kind == "sampling":
        msg = {
            "jsonrpc": "2.0",
            "id": "srv-1",
            "method": "sampling/createMessage",
            "params": {"messages": [], "maxTokens": 5},
        }
        _raw(json.dumps(msg).encode() + b"\n")
    elif kind == "roots":
        _raw(b'{"jsonrpc":"2.0","id":"srv-2","method":"roots/list"}\n')
    elif kind == "unknown_response":
        _raw(
            b'{"jsonrpc":"2.0","id":424242,"result":{"content":[{"type":"text","text":"forged"}]}}\n'
        )
    elif kind == "oversize":
        _raw(
            b'{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"'
            + b"A" * (2 * 1024 * 1024)
            + b'"}}\n'
        )
    elif kind == "garbage":
        _raw(b"this is not json\n")
    return "emitted " + kind


app.run()
