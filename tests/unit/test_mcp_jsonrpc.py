"""Strict JSON-RPC parsing: every THREATS.md "MCP bridge" parsing class."""

from __future__ import annotations

import json
from typing import Any

import pytest

from linpodx.mcp import jsonrpc
from linpodx.mcp.jsonrpc import Batch, ProtocolError, parse


def test_valid_request_notification_response() -> None:
    req = parse(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}')
    assert not isinstance(req, Batch)
    assert req.kind == "request" and req.tool_name == "x" and req.id_key == ("i", 1)
    note = parse(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    assert not isinstance(note, Batch) and note.kind == "notification"
    resp = parse(b'{"jsonrpc":"2.0","id":"a","result":{}}')
    assert not isinstance(resp, Batch) and resp.kind == "response" and resp.id_key == ("s", "a")
    err = parse(b'{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"m"}}')
    assert not isinstance(err, Batch) and err.kind == "error"


def test_escaped_method_name_is_the_same_method() -> None:
    msg = parse(b'{"jsonrpc":"2.0","id":1,"method":"tools\\u002fcall","params":{"name":"w"}}')
    assert not isinstance(msg, Batch)
    assert msg.method == "tools/call" and msg.tool_name == "w"


@pytest.mark.parametrize(
    "line",
    [
        # duplicate keys: method, params.name, id
        b'{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call"}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}',
        b'{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}',
        # case variants, NUL and look-alike keys, unknown top-level keys
        b'{"jsonrpc":"2.0","id":1,"Method":"tools/call"}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call"}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","method\\u0000":"tools/call"}',
        '{"jsonrpc":"2.0","id":1,"method":"ping","m\u0435thod":"tools/call"}'.encode(),
        b'{"jsonrpc":"2.0","id":1,"method":"ping","extra":1}',
        b'{"jsonrpc":"2.0","id":1,"result":{},"method":"tools/call"}',
        # invalid UTF-8, lone surrogates, NaN/Infinity, big numbers, deep nesting
        b'{"jsonrpc":"2.0","id":1,"method":"p\xffing"}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":"\\ud800"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":NaN}}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":Infinity}}',
        b'{"jsonrpc":"2.0","id":9007199254740993,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":' + b"[" * 200 + b"]" * 200 + b"}}",
        # shape: wrong version, wrong types, missing parts
        b'{"jsonrpc":"1.0","id":1,"method":"ping"}',
        b'{"id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":5}',
        b'{"jsonrpc":"2.0","id":true,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":null,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}',
        b'{"jsonrpc":"2.0","id":1}',
        b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}',
        b'{"jsonrpc":"2.0","id":1,"error":{"code":"1","message":"x"}}',
        b'"just a string"',
        b"[]",
        b"not json",
    ],
)
def test_refused(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse(line)


def test_refusal_keeps_a_safe_id_for_the_answer() -> None:
    with pytest.raises(ProtocolError) as exc:
        parse(b'{"jsonrpc":"2.0","id":7,"method":"ping","extra":1}')
    assert exc.value.msg_id == 7
    with pytest.raises(ProtocolError) as exc:
        parse(b'{"jsonrpc":"2.0","id":7,"id":8,"method":"ping"}')
    assert exc.value.msg_id is None and exc.value.code == jsonrpc.PARSE_ERROR


def test_trailing_space_and_fullwidth_slash_are_other_methods() -> None:
    a = parse(b'{"jsonrpc":"2.0","id":1,"method":"tools/call ","params":{"name":"w"}}')
    b = parse('{"jsonrpc":"2.0","id":1,"method":"tools\uff0fcall","params":{"name":"w"}}'.encode())
    assert not isinstance(a, Batch) and not isinstance(b, Batch)
    assert a.method != "tools/call" and b.method != "tools/call"
    assert a.tool_name is None and b.tool_name is None


def test_batch_elements_parsed_individually() -> None:
    b = parse(b'[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"Method":"x"}]')
    assert isinstance(b, Batch)
    assert not isinstance(b.items[0], ProtocolError) and b.items[0].method == "ping"
    assert isinstance(b.items[1], ProtocolError)


def test_forward_is_reserialized_not_raw() -> None:
    raw = b'{ "jsonrpc" : "2.0", "id":1, "method":"tools\\u002fcall", "params":{"name":"w"} }'
    msg = parse(raw)
    assert not isinstance(msg, Batch)
    out = jsonrpc.serialize(msg.raw)
    assert out != raw + b"\n"
    assert out.endswith(b"\n") and out.count(b"\n") == 1
    assert json.loads(out) == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "w"},
    }
    # U+2028 inside a string survives and does not split the frame.
    m2 = parse('{"jsonrpc":"2.0","id":1,"method":"ping","params":{"s":"a\u2028b"}}'.encode())
    assert not isinstance(m2, Batch)
    assert jsonrpc.serialize(m2.raw).count(b"\n") == 1


def test_floats_allowed_in_params() -> None:
    msg = parse(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"x":1.5}}}')
    assert not isinstance(msg, Batch) and msg.params == {"arguments": {"x": 1.5}}


@pytest.mark.parametrize(
    "value",
    [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "result": {"content": [{"type": "text", "text": "é\u2028\x00"}]},
        },
        {"b": [1, -2, 9007199254740991, 1.5, -0.0, 1e300, True, False, None], "a": "\U0001f600"},
        {"z": {"y": {"x": []}}, "q": '"\\/\b\f\n\r\t'},
    ],
)
def test_serialize_is_compact_json_dumps(value: Any) -> None:
    """The encoder built once writes exactly what json.dumps with the same options writes."""
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert jsonrpc.serialize(value) == (expected + "\n").encode()


def test_serialize_refuses_nan_and_unknown_types() -> None:
    with pytest.raises(ValueError):
        jsonrpc.serialize({"x": float("nan")})
    with pytest.raises(TypeError):
        jsonrpc.serialize({"x": {1, 2}})
