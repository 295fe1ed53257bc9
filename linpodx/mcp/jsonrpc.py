"""Strict JSON-RPC 2.0 parsing for MCP frames.

Two layers: `canonical.strict_loads` refuses text that JSON parsers disagree on (duplicate keys,
NaN/Infinity, invalid UTF-8, lone surrogates, integers beyond 2^53, deep nesting); then a shape
check accepts exactly the keys JSON-RPC 2.0 defines. A key we do not know (`Method`,
`method\\u0000`, `id `) is refused, never ignored: a peer and the bridge must never read
different meanings out of one message. Method names are compared after JSON decoding, so
`"tools\\u002fcall"` *is* `tools/call`.

What is forwarded is `serialize(message.raw)`: the parsed value re-serialized, never the bytes
that were read.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from linpodx.canonical import CanonicalError, strict_loads

# JSON-RPC 2.0 error codes we answer with.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
# Implementation-defined server-error range (-32000..-32099): the gate said no. Not -32001: both
# official SDKs (Python, TypeScript) raise -32001 for "request timed out", and a client that
# retries a timeout would retry a denial. The SDKs use -32000 (connection closed), -32001,
# -32020..-32022 and -32042, the spec -32002 (resource not found), -32800 a cancelled HTTP
# request; -32090 is none of them.
DENIED_BY_POLICY = -32090

REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
RESPONSE_KEYS = frozenset({"jsonrpc", "id", "result", "error"})
ERROR_KEYS = frozenset({"code", "message", "data"})

IdKey = tuple[str, Any]
"""An id as a dict key: `("s", "1")` and `("i", 1)` are different ids, as JSON-RPC says."""

ID_KEY_CAP = 256
"""A longer string id is kept by its sha256 (`("h", …)`): the in-flight tables hold keys for
thousands of requests, and an id may be megabytes long."""


class ProtocolError(ValueError):
    """A frame that is not an acceptable JSON-RPC 2.0 message."""

    def __init__(self, message: str, code: int = INVALID_REQUEST, msg_id: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.msg_id = msg_id
        """The offending message's id when it could be read safely (else None)."""


@dataclass(frozen=True)
class Message:
    """One valid JSON-RPC message."""

    kind: str
    """`request`, `notification`, `response` or `error`."""
    raw: dict[str, Any] = field(compare=False)
    """The parsed object (what gets re-serialized and forwarded)."""
    method: str | None = None
    id: Any = None
    params: dict[str, Any] | None = None
    may_hold_proto: bool = field(default=True, compare=False, repr=False)
    """False when the frame's bytes cannot spell a `__proto__` key (they hold neither `proto`
    nor a `\\u` escape): the gate's walk for that key (`policy.refusal`) is skipped then."""
    # Derived once, as the message is made: the bridge reads them several times per message
    # (a property or a cached_property is a Python call, and in 3.11 a lock, each time).
    id_key: IdKey | None = field(init=False, compare=False, repr=False)
    """The id as a dict key, or None for notifications / null ids."""
    tool_name: str | None = field(init=False, compare=False, repr=False)
    """`params.name` of a `tools/call` (a string), else None."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "id_key", id_key(self.id))
        name = None
        if self.method == "tools/call" and self.params is not None:
            name = self.params.get("name")
        object.__setattr__(self, "tool_name", name if isinstance(name, str) else None)


@dataclass(frozen=True)
class Batch:
    """A JSON array of messages (JSON-RPC batch); each element parsed on its own."""

    items: tuple[Message | ProtocolError, ...]


def id_key(value: Any) -> IdKey | None:
    """Map a JSON-RPC id to a hashable key that keeps `1` and `"1"` apart."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return ("i", value)
    if isinstance(value, str):
        if len(value) > ID_KEY_CAP:
            return ("h", hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest())
        return ("s", value)
    return None


def _valid_id(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, str))


def _safe_id(obj: dict[str, Any]) -> Any:
    value = obj.get("id")
    return value if _valid_id(value) else None


def check_shape(obj: Any, may_hold_proto: bool = True) -> Message:
    """Check one decoded value against JSON-RPC 2.0 as MCP uses it; raise ProtocolError.
    `may_hold_proto`: see `Message.may_hold_proto`."""
    if not isinstance(obj, dict):
        raise ProtocolError("a JSON-RPC message must be an object")
    msg_id = _safe_id(obj)
    if obj.get("jsonrpc") != "2.0":
        raise ProtocolError('"jsonrpc" must be "2.0"', msg_id=msg_id)
    if "method" in obj:
        unknown = set(obj) - REQUEST_KEYS
        if unknown:
            raise ProtocolError(f"unknown key(s) in request: {_names(unknown)}", msg_id=msg_id)
        method = obj["method"]
        if not isinstance(method, str) or not method:
            raise ProtocolError('"method" must be a non-empty string', msg_id=msg_id)
        params = obj.get("params")
        if "params" in obj and not isinstance(params, dict):
            # JSON-RPC also allows arrays, MCP never uses them: refuse rather than guess.
            raise ProtocolError('"params" must be an object', msg_id=msg_id)
        if "id" in obj:
            if not _valid_id(obj["id"]):
                raise ProtocolError('a request "id" must be a string or an integer')
            return Message(
                "request", obj, method=method, id=obj["id"], params=params,
                may_hold_proto=may_hold_proto,
            )
        return Message(
            "notification", obj, method=method, params=params, may_hold_proto=may_hold_proto
        )
    unknown = set(obj) - RESPONSE_KEYS
    if unknown:
        raise ProtocolError(f"unknown key(s) in message: {_names(unknown)}", msg_id=msg_id)
    if "id" not in obj:
        raise ProtocolError("a message without a method must be a response with an id")
    has_result, has_error = "result" in obj, "error" in obj
    if has_result == has_error:
        raise ProtocolError('a response needs exactly one of "result" and "error"', msg_id=msg_id)
    if has_result:
        if not _valid_id(obj["id"]):
            raise ProtocolError('a result "id" must be a string or an integer')
        if not isinstance(obj["result"], dict):
            raise ProtocolError('"result" must be an object', msg_id=msg_id)
        return Message("response", obj, id=obj["id"])
    if obj["id"] is not None and not _valid_id(obj["id"]):
        raise ProtocolError('an error "id" must be a string, an integer or null')
    err = obj["error"]
    if (
        not isinstance(err, dict)
        or set(err) - ERROR_KEYS
        or isinstance(err.get("code"), bool)
        or not isinstance(err.get("code"), int)
        or not isinstance(err.get("message"), str)
    ):
        raise ProtocolError('"error" must be {code: int, message: str, data?}', msg_id=msg_id)
    return Message("error", obj, id=obj["id"])


def _names(keys: set[str]) -> str:
    return ", ".join(sorted(json.dumps(k, ensure_ascii=True) for k in keys))


BATCH_MAX = 100
"""Messages in one JSON-RPC batch (MCP 2025-03-26), at most."""


def parse(data: bytes) -> Message | Batch:
    """Parse one frame strictly. Raises ProtocolError (code -32700 for undecodable JSON)."""
    try:
        value = strict_loads(data, allow_floats=True)
    except CanonicalError as exc:
        raise ProtocolError(f"refused JSON: {exc}", code=PARSE_ERROR) from None
    # The key `__proto__` in JSON text holds `proto`, or a `\\u` escape for one of its letters.
    may_hold_proto = b"proto" in data or b"\\u" in data
    if isinstance(value, list):
        if not value:
            raise ProtocolError("empty batch")
        if len(value) > BATCH_MAX:
            # Each element is gated, recorded and answered on its own: one line of 500,000
            # tiny elements was half a million records and hundreds of MB.
            raise ProtocolError(f"batch of {len(value)} messages (at most {BATCH_MAX})")
        items: list[Message | ProtocolError] = []
        for element in value:
            try:
                items.append(check_shape(element, may_hold_proto))
            except ProtocolError as exc:
                items.append(exc)
        return Batch(tuple(items))
    return check_shape(value, may_hold_proto)


def _refuse(value: Any) -> Any:
    raise TypeError(f"cannot serialize {type(value).__name__}")


def _compact_encoder() -> Callable[[Any], str]:
    """`json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)`, with the C
    encoder built once instead of per call. It skips the cycle check: what it encodes is parsed
    JSON or built by the bridge, never cyclic."""
    make = getattr(json.encoder, "c_make_encoder", None)
    string = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or string is None:  # pragma: no cover - CPython has the C encoder
        return partial(json.dumps, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    encode = make(None, _refuse, string, None, ":", ",", False, False, False)
    return lambda value: "".join(encode(value, 0))


_encode_compact = _compact_encoder()


def serialize(obj: Any) -> bytes:
    """Compact JSON of an evaluated value plus the frame's `\\n`."""
    return (_encode_compact(obj) + "\n").encode()


def error_response(msg_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error object answering `msg_id` (None when the id is unknown)."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": msg_id if _valid_id(msg_id) else None, "error": error}


def tool_error_result(msg_id: Any, text: str) -> dict[str, Any]:
    """A `tools/call` result the model sees: `isError: true` with the reason as text."""
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "result": {"content": [{"type": "text", "text": text}], "isError": True},
    }
