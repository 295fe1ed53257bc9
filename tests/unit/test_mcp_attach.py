"""`mcp attach` end to end without podman: a local responder stands in for `podman exec -i`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from linpodx.mcp import attach as attach_mod

RESPONDER = """
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}) + "\\n")
    sys.stdout.flush()
"""


def fake_podman(monkeypatch: pytest.MonkeyPatch) -> None:
    """The container is found and `podman exec -i` runs RESPONDER on this host instead."""
    real_popen = subprocess.Popen

    def responder(_argv: list[str], **kw: Any) -> Any:
        return real_popen([sys.executable, "-c", RESPONDER], **kw)

    monkeypatch.setattr(
        attach_mod, "find_container", lambda name: attach_mod.Target(name, "0" * 64, "builtin")
    )
    monkeypatch.setattr(attach_mod.subprocess, "Popen", responder)


def run(lines: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    """attach() with `lines` then EOF on its stdin; (what it wrote to stdout, what it said)."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    os.write(in_w, lines)
    os.close(in_w)
    said: list[str] = []
    try:
        attach_mod.attach("c", ["server"], stdin_fd=in_r, stdout_fd=out_w, log=said.append)
    finally:
        os.close(in_r)
        os.close(out_w)
        with os.fdopen(out_r, "rb") as out:
            got = [json.loads(line) for line in out]
    return got, said


def test_request_just_before_eof_is_still_forwarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The request and the EOF arrive together: it is forwarded before the server's input is
    closed, and its answer reaches the client."""
    fake_podman(monkeypatch)
    got, _said = run(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    assert got == [{"jsonrpc": "2.0", "id": 1, "result": {}}]
