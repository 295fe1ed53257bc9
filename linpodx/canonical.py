"""Canonical JSON (RFC 8785 for the value types we allow) and a strict JSON parser.

Canonical form is what gets hashed: object keys sorted by UTF-16 code units, no whitespace,
strings with the minimal JSON escapes, integers as decimal digits. We refuse floats in hashed
data (their canonical form is a subtle spec of its own and we have no use for them), integers
outside the I-JSON safe range, and strings with lone surrogates (not encodable as UTF-8).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from typing import Any

SAFE_INT = 2**53 - 1
MAX_DEPTH = 64


class CanonicalError(ValueError):
    """A value that has no canonical form, or JSON text we refuse to parse."""


def _key(k: str) -> bytes:
    return k.encode("utf-16-be", "surrogatepass")


def _check_str(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CanonicalError("string contains a lone surrogate") from exc


def _encode(value: Any, out: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalError(f"nesting deeper than {MAX_DEPTH}")
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if not -SAFE_INT <= value <= SAFE_INT:
            raise CanonicalError("integer outside the range -(2^53-1)..2^53-1")
        out.append(str(value))
    elif isinstance(value, float):
        raise CanonicalError("floating-point numbers are not allowed here")
    elif isinstance(value, str):
        _check_str(value)
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Mapping):
        keys = list(value.keys())
        for k in keys:
            if not isinstance(k, str):
                raise CanonicalError("object keys must be strings")
            _check_str(k)
        out.append("{")
        for i, k in enumerate(sorted(keys, key=_key)):
            if i:
                out.append(",")
            out.append(json.dumps(k, ensure_ascii=False))
            out.append(":")
            _encode(value[k], out, depth + 1)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out, depth + 1)
        out.append("]")
    else:
        raise CanonicalError(f"cannot encode {type(value).__name__}")


def canonical_str(value: Any) -> str:
    """The canonical JSON text of `value`."""
    out: list[str] = []
    _encode(value, out, 0)
    return "".join(out)


def canonical_bytes(value: Any) -> bytes:
    """The canonical JSON of `value` as UTF-8 bytes."""
    return canonical_str(value).encode("utf-8")


def _no_dupes(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # the common case costs one C-level dict build
        seen: set[str] = set()
        for k, _v in pairs:
            if k in seen:
                raise CanonicalError(f"duplicate key {k!r}")
            seen.add(k)
    return obj


def _safe_int(text: str) -> int:
    value = int(text)
    if not -SAFE_INT <= value <= SAFE_INT:
        raise CanonicalError("integer outside the range -(2^53-1)..2^53-1")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise CanonicalError("non-finite number")
    return value


def _no_float(_text: str) -> Any:
    raise CanonicalError("floating-point numbers are not allowed here")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""An escaped UTF-16 surrogate (or what looks like one): the only way JSON text decoded from
valid UTF-8 can produce a lone surrogate."""


def _no_constant(name: str) -> Any:
    raise CanonicalError(f"{name} is not valid JSON")


def _check_tree(value: Any, depth: int, allow_floats: bool) -> None:
    if depth > MAX_DEPTH:
        raise CanonicalError(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        if not -SAFE_INT <= value <= SAFE_INT:
            raise CanonicalError("integer outside the range -(2^53-1)..2^53-1")
    elif isinstance(value, float):
        if not allow_floats:
            raise CanonicalError("floating-point numbers are not allowed here")
        if not math.isfinite(value):
            raise CanonicalError("non-finite number")
    elif isinstance(value, str):
        _check_str(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_str(k)
            _check_tree(v, depth + 1, allow_floats)
    elif isinstance(value, list):
        for v in value:
            _check_tree(v, depth + 1, allow_floats)


# Built once: json.loads with hooks builds a decoder per call. A decoder keeps no state between
# calls that could leak from one to another, so threads share them.
_DECODE = json.JSONDecoder(
    object_pairs_hook=_no_dupes,
    parse_constant=_no_constant,
    parse_int=_safe_int,
    parse_float=_no_float,
).decode
_DECODE_FLOATS = json.JSONDecoder(
    object_pairs_hook=_no_dupes,
    parse_constant=_no_constant,
    parse_int=_safe_int,
    parse_float=_finite_float,
).decode


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """Refuse JSON text nesting deeper than `limit` (brackets inside strings do not count)."""
    depth = 0
    in_str = False
    esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                raise CanonicalError(f"nesting deeper than {limit}")
        elif ch in "]}":
            depth -= 1


def strict_loads(text: str | bytes, *, allow_floats: bool = False) -> Any:
    """Parse JSON, refusing duplicate keys, NaN/Infinity, invalid UTF-8, lone surrogates,
    integers beyond 2^53, nesting deeper than MAX_DEPTH, and (unless allowed) floats.

    Numbers, constants and duplicate keys are checked by the json parser's hooks as it reads;
    the character-level depth scan runs only when the text has more brackets than MAX_DEPTH, and
    the tree walk for lone surrogates only when the text has a surrogate escape (decoded UTF-8
    cannot hold one otherwise), so a small message costs about one C-level parse.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CanonicalError("invalid UTF-8") from exc
    else:
        _check_str(text)  # a str may hold a raw lone surrogate; decoded bytes cannot
    # Bound nesting before json's recursive parser sees it (a deep document would otherwise
    # hit RecursionError deep inside the stdlib).
    if text.count("[") + text.count("{") > MAX_DEPTH:
        check_depth(text)
    try:
        value = (_DECODE_FLOATS if allow_floats else _DECODE)(text)
    except CanonicalError:
        raise
    except (ValueError, RecursionError) as exc:
        raise CanonicalError(f"invalid JSON: {exc}") from exc
    if _SURROGATE_ESCAPE.search(text):
        _check_tree(value, 0, allow_floats)
    return value
