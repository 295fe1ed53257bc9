"""THREATS.md "MCP bridge" classes over raw stdio against the real bridge and a real server in a
real container. Each forbidden message carries a marker; the server logs every byte it receives,
and no marker may appear there. The bridge must keep running throughout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from linpodx.audit import chain as audit_chain
from linpodx.errors import EXIT_NOT_MANAGED
from tests.conftest import DEBIAN_IMAGE
from tests.servers.harness import (
    RawSession,
    linpodx,
    server_log,
    start_server_container,
    wait_pending,
)

pytestmark = pytest.mark.podman


def call(i: object, tool: str, marker: str) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": {"cmd": marker, "text": marker, "path": "x", "content": marker},
        },
    }


def test_attack_classes(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE, timeout=30)
    s = RawSession(unique_name)
    forbidden: list[str] = []
    try:
        init = s.handshake("2025-06-18")
        assert init["result"]["protocolVersion"] == "2025-06-18"
        sid = s.session_id()

        def refused(line: bytes, marker: str, expect_id: object = None) -> dict[str, object]:
            forbidden.append(marker)
            s.send(line)
            resp = s.recv()
            assert resp["id"] == expect_id, resp
            assert "error" in resp or resp.get("result", {}).get("isError") is True, resp
            return resp

        # Batches (not allowed in 2025-06-18), with a tools/call inside; an empty batch.
        refused(json.dumps([call(10, "echo", "M-BATCH-1")]).encode(), "M-BATCH-1")
        refused(b"[]", "M-EMPTY-BATCH-NONE")
        # Duplicate keys: method, params.name, id.
        refused(
            b'{"jsonrpc":"2.0","id":11,"method":"tools/list","method":"tools/call",'
            b'"params":{"name":"run_shell","arguments":{"cmd":"M-DUP-METHOD"}}}',
            "M-DUP-METHOD",
        )
        refused(
            b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"echo",'
            b'"name":"run_shell","arguments":{"cmd":"M-DUP-NAME"}}}',
            "M-DUP-NAME",
        )
        # Case variant, NUL key, look-alike key, unknown top-level key.
        refused(
            b'{"jsonrpc":"2.0","id":13,"method":"tools/list","Method":"tools/call",'
            b'"params":{"name":"run_shell","arguments":{"cmd":"M-CASE"}}}',
            "M-CASE",
            13,
        )
        refused(
            b'{"jsonrpc":"2.0","id":14,"method":"tools/list","method\\u0000":"x",'
            b'"params":{"arguments":{"cmd":"M-NUL"}}}',
            "M-NUL",
            14,
        )
        refused(
            '{"jsonrpc":"2.0","id":15,"m\u0435thod":"tools/call","method":"tools/list",'
            '"params":{"arguments":{"cmd":"M-LOOKALIKE"}}}'.encode(),
            "M-LOOKALIKE",
            15,
        )
        refused(
            b'{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"M-EXTRA"}},"extra":true}',
            "M-EXTRA",
            16,
        )
        # Escaped method name: it IS tools/call, and run_shell is denied by the rules.
        resp = refused(
            b'{"jsonrpc":"2.0","id":17,"method":"tools\\u002fcall","params":'
            b'{"name":"run_shell","arguments":{"cmd":"M-ESCAPED"}}}',
            "M-ESCAPED",
            17,
        )
        assert resp["result"]["isError"] is True  # type: ignore[index]
        # Trailing space / full-width slash: other methods, no rule matches -> denied.
        refused(
            json.dumps({**call(18, "echo", "M-TRAILING"), "method": "tools/call "}).encode(),
            "M-TRAILING",
            18,
        )
        refused(
            json.dumps(
                {**call(19, "echo", "M-FULLWIDTH"), "method": "tools\uff0fcall"}, ensure_ascii=False
            ).encode(),
            "M-FULLWIDTH",
            19,
        )
        # Invalid UTF-8, lone surrogate, NaN, Infinity, > 2^53, deep nesting.
        refused(
            b'{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"M-UTF8\xff"}}}',
            "M-UTF8",
        )
        refused(
            b'{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"M-SURROGATE\\ud800"}}}',
            "M-SURROGATE",
        )
        refused(
            b'{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"M-NAN","n":NaN}}}',
            "M-NAN",
        )
        refused(
            b'{"jsonrpc":"2.0","id":23,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"M-INF","n":-Infinity}}}',
            "M-INF",
        )
        refused(
            b'{"jsonrpc":"2.0","id":24,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"M-BIGINT","n":9007199254740993}}}',
            "M-BIGINT",
        )
        refused(
            b'{"jsonrpc":"2.0","id":25,"method":"tools/call","params":{"name":"echo",'
            b'"arguments":{"text":"M-DEEP","n":' + b"[" * 100 + b"]" * 100 + b"}}}",
            "M-DEEP",
        )
        # A line over the profile's bound (1 MiB): refused with a null id, bridge alive.
        big = json.dumps(call(26, "echo", "M-OVERSIZE" + "A" * (3 * 1024 * 1024))).encode()
        refused(big, "M-OVERSIZE")
        # U+2028 / U+0085 inside strings: fine, the line is split on \n only.
        ok = s.request(27, "tools/call", {"name": "echo", "arguments": {"text": "a\u2028b\u0085c"}})
        assert ok["result"]["content"][0]["text"] == "echo:a\u2028b\u0085c"
        # The escaped method with an allowed tool goes through, re-serialized.
        s.send(
            b'{"jsonrpc":"2.0","id":28,"method":"tools\\u002fcall","params":{"name":"echo",'
            b'"arguments":{"text":"M-REENCODED"}}}'
        )
        assert s.recv_id(28)["result"]["content"][0]["text"] == "echo:M-REENCODED"

        # Responses from the client with no request: dropped, no answer.
        forbidden.append("M-CLIENT-RESPONSE")
        s.send({"jsonrpc": "2.0", "id": 999, "result": {"x": "M-CLIENT-RESPONSE"}})
        s.no_output(0.5)

        # Id reuse while in flight: a prompted call holds id 30, a second id 30 is refused,
        # with a null id (an answer with id 30 would settle the call still held for a person).
        s.send(call(30, "write_file", "M-PROMPTED-30"))
        ev = wait_pending()
        forbidden.append("M-REUSED-ID")
        s.send(call(30, "echo", "M-REUSED-ID"))
        reuse = s.recv()
        assert reuse["id"] is None and "in flight" in reuse["error"]["message"]
        assert linpodx("deny", "--non-interactive", ev["approval_id"]).returncode == 0
        denied = s.recv_id(30)
        assert denied["result"]["isError"] is True
        forbidden.append("M-PROMPTED-30")

        # Server -> client: sampling and roots requests are denied back to the server; a
        # response with an unknown id, an oversize line and garbage are dropped.
        for i, kind in enumerate(("sampling", "roots", "unknown_response", "oversize", "garbage")):
            r = s.request(40 + i, "tools/call", {"name": "emit_raw", "arguments": {"kind": kind}})
            assert r["result"]["content"][0]["text"] == f"emitted {kind}"
        assert s.others == [], s.others  # nothing of that reached the client
        s.no_output(0.5)

        # Still running, still answering.
        assert s.request(50, "ping")["result"] == {}
        code = s.close()
        assert code == 0, s.stderr
    finally:
        s.kill()

    log = server_log(unique_name)
    assert b"M-REENCODED" in log and b"tools\\u002fcall" not in log  # forwarded re-serialized
    for marker in forbidden:
        assert marker.encode() not in log, marker
    # The server got the bridge's refusals of its own requests.
    refusals = [json.loads(x) for x in log.splitlines() if b'"srv-' in x]
    assert {r["id"] for r in refusals} == {"srv-1", "srv-2"}
    assert all(r["error"]["code"] == -32090 for r in refusals)

    records = audit_chain.read_records(audit_chain.session_path(sid))
    kinds = [r.type for r in records]
    assert kinds.count("mcp.invalid") >= 15 and kinds.count("mcp.drop") >= 2
    assert linpodx("audit", "verify", "--session", sid).returncode == 0


def test_batches_in_2025_03_26_gate_each_element(tmp_path: Path, unique_name: str) -> None:
    start_server_container(tmp_path, unique_name, DEBIAN_IMAGE)
    s = RawSession(unique_name)
    try:
        assert s.handshake("2025-03-26")["result"]["protocolVersion"] == "2025-03-26"
        s.send(
            json.dumps(
                [
                    call(1, "echo", "M-BATCH-OK"),
                    call(2, "run_shell", "M-BATCH-DENIED"),
                    {"jsonrpc": "2.0", "id": 3, "Method": "x"},
                ]
            ).encode()
        )
        got = {m["id"]: m for m in (s.recv(), s.recv(), s.recv())}
        assert got[1]["result"]["content"][0]["text"] == "echo:M-BATCH-OK"
        assert got[2]["result"]["isError"] is True
        assert "error" in got[3]
        refused = s.request(4, "ping")  # the bridge still answers
        assert refused["result"] == {}
        s.send(b"[]")
        assert s.recv()["error"]["code"] == -32600
        assert s.close() == 0
    finally:
        s.kill()
    log = server_log(unique_name)
    assert b"M-BATCH-OK" in log and b"M-BATCH-DENIED" not in log


def test_attach_refuses_unmanaged_or_missing_containers(unique_name: str) -> None:
    missing = linpodx("mcp", "attach", "--container", unique_name, "--", "true", check=False)
    assert missing.returncode == 4 and "container not found" in missing.stderr
    assert missing.stdout == ""
    subprocess.run(
        [
            "podman",
            "run",
            "-d",
            "--name",
            unique_name,
            "--network",
            "none",
            DEBIAN_IMAGE,
            "sleep",
            "infinity",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    plain = linpodx("mcp", "attach", "--container", unique_name, "--", "true", check=False)
    assert plain.returncode == EXIT_NOT_MANAGED and "not managed by linpodx" in plain.stderr
    assert plain.stdout == ""
