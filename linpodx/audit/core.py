"""The audit record codec and the one writer of chain files.

Codec: `build_line` encodes a record (canonical bytes, hash), `parse` reads one back: a fast
stage (`fast_fields`, C-speed, returns None when unsure; `linpodx.audit.batch` has the
verifier's forms of it for many lines at once) and the strict reference parser
(`parse_strict`), which gives the verdict and the reason whenever the fast stage is unsure.
Fuzz tests hold them equal (tests/unit/test_audit_codec.py).

Writer: `append_locked` is the only code that appends records. `chain.Chain.append` (one record,
fsync), `mcp.auditlog.GroupCommitChain` (batches, fsync by its sync role) and `append_simple`
(the fast run path: an intact tail only, else the full append decides) are its three modes.

`linpodx.audit.chain` is the chain API (records, verification, sessions) and builds on this.
This module is kept to the standard library's cheapest modules (no dataclasses, pathlib or
typing at run time) because `linpodx.fastpath.run` appends its `container.run` record with
`append_simple` before it starts podman, where every millisecond of imports shows.
"""

from __future__ import annotations

import codecs
import json
import re
import time
from collections.abc import Mapping
from json import encoder as json_encoder

from linpodx.canonical import (
    MAX_DEPTH,
    SAFE_INT,
    CanonicalError,
    canonical_bytes,
    check_depth,
    strict_loads,
)
from linpodx.digest import sha256, sha256_maker
from linpodx.errors import AuditError

TYPE_CHECKING = False  # not typing's: see the module docstring
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DOMAIN = b"linpodx-audit-v1\n"
ZERO_HASH = "0" * 64
MAX_LINE = 1024 * 1024
"""Longest record line we write or read (bytes, without the newline)."""
TAIL_CHUNK = 8 * 1024

HINT_WRITE = (
    "check that the state dir is writable and the disk is not full (df -h); "
    "nothing was done because it could not be recorded"
)
HINT_VERIFY = "run `linpodx audit verify` to see what is wrong with the log"
_NOT_DONE = "what could not be recorded was not done"
_FULL_ARGUMENTS = (
    "if this was an MCP tool call under a profile with `mcp.record_arguments: true`, its "
    "arguments are recorded in full and {why}: set record_arguments to false (their sha256 is "
    "still recorded), apply the profile and start the container again; otherwise this is a bug "
    "in linpodx, please report it; " + _NOT_DONE
)
HINT_UNCANONICAL = _FULL_ARGUMENTS.format(why="floats have no canonical form")
"""For a record whose data has no canonical form (a float, say)."""
HINT_TOO_LARGE = _FULL_ARGUMENTS.format(why=f"a record is at most {MAX_LINE} bytes")
"""For a record longer than MAX_LINE."""
HINT_EVENT_TYPE = (
    "this is a bug in linpodx (event types are dotted lower-case names such as mcp.request), "
    "please report it; " + _NOT_DONE
)
"""For an event type that is not a dotted lower-case name (always linpodx's own constant)."""

Fields = tuple[int, str, str, str, str, "Any", "str | None"]
"""(seq, ts, type, prev, hash, data, log_id) of one record: `chain.Record`'s fields in order."""

_second: tuple[int, str] = (-1, "")
"""The last second formatted by now_ts (formatting is most of its cost; busy logs reuse it)."""


def now_ts() -> str:
    """The current UTC time in the record format (microseconds, `Z`)."""
    global _second
    secs, micros = divmod(time.time_ns() // 1000, 1_000_000)
    cached, text = _second
    if cached != secs:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
        _second = (secs, text)
    return f"{text}.{micros:06d}Z"


def encode_record(
    seq: int, ts: str, typ: str, prev: str, data_bytes: bytes, log_id: str | None
) -> tuple[bytes, bytes]:
    """The canonical record without hash, split where the `hash` pair goes: (head, after).

    head + after is canonical_bytes of the record without `hash`; the stored line is head +
    `,"hash":"H"` + after. Assembled by hand so the data is encoded once: the keys in RFC 8785
    order are data, hash, log, prev, seq, ts, type, and every field but data is pattern-checked
    ASCII needing no escapes (a unit test holds this equal to canonical_bytes).
    """
    log = f',"log":"{log_id}"' if log_id is not None else ""
    after = f'{log},"prev":"{prev}","seq":{seq},"ts":"{ts}","type":"{typ}"}}'.encode("ascii")
    return b'{"data":' + data_bytes, after


def _refuse_number(text: str) -> Any:
    raise ValueError(f"non-integer number {text}")


def _safe_int(text: str) -> int:
    if len(text) < 16:  # at most 15 digits: below 10**15 < SAFE_INT (the common case, cheaply)
        return int(text)
    value = int(text)
    if not -SAFE_INT <= value <= SAFE_INT:
        raise ValueError("integer outside the I-JSON range")
    return value


def _no_default(value: Any) -> Any:  # pragma: no cover - json.loads output is always encodable
    raise TypeError(f"cannot encode {type(value).__name__}")


# The C-accelerated json codec, configured so that its output for the values we allow is
# byte-identical to canonical_bytes (same string escaping: canonical.py uses json.dumps for
# strings; same integers; keys sorted by code point, which equals UTF-16 order as long as no
# character lies outside the BMP; see fast_fields for the conditions).
FAST_DECODER = json.JSONDecoder(
    parse_float=_refuse_number, parse_constant=_refuse_number, parse_int=_safe_int
)
_FAST_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))
_c_make_encoder = getattr(json_encoder, "c_make_encoder", None)
_c_encode_basestring = getattr(json_encoder, "c_encode_basestring", None)
encode_sorted: Callable[[Any], str] = _FAST_ENCODER.encode
if _c_make_encoder is not None and _c_encode_basestring is not None:
    # One C encoder built once (json.JSONEncoder.encode builds a new one per call). Same
    # arguments JSONEncoder passes: markers, default, string encoder, indent, separators,
    # sort_keys, skipkeys, allow_nan.
    _c_encode = _c_make_encoder(
        None, _no_default, _c_encode_basestring, None, ":", ",", True, False, False
    )

    def _encode_c(value: Any) -> str:
        return "".join(_c_encode(value, 0))

    encode_sorted = _encode_c

TS_PATTERN = (
    r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
    r"T(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d\.\d{6}Z"
)
"""A record's `ts`: `YYYY-MM-DDTHH:MM:SS.ffffffZ` with every field in its range; the day must
also exist in its month (`real_day`), checked only for days 29-31 so verification pays one
string comparison per record."""


def real_day(ts: str) -> bool:
    """Whether the day of a `ts` that matches TS_PATTERN exists (no 02-30, 04-31, 2027-02-29)."""
    year, month, day = int(ts[0:4]), int(ts[5:7]), int(ts[8:10])
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return day <= (29 if leap else 28)
    return day <= (30 if month in (4, 6, 9, 11) else 31)


ASTRAL = re.compile(rb"[\xf0-\xf4]")  # lead bytes of 4-byte UTF-8 sequences (> U+FFFF)
_HASH_KEY = b',"hash":"'


def fast_fields(line: bytes) -> Fields | None:
    """The fields `parse_strict` would return for `line`, computed at C speed, or None if
    unsure.

    None never means "bad": the caller then runs the strict reference parser, which gives the
    exact verdict and reason. Fields are only returned when they are provably what
    parse_strict returns:
    - the line decodes as strict UTF-8 (no encoded surrogates) and json parses it with floats,
      NaN and Infinity refused and every integer checked to be within +-(2^53-1);
    - re-encoding the parsed value with sorted keys and no whitespace gives back the line
      exactly. That implies no duplicate keys (the parsed value would have lost one and could
      not re-encode to the same text), no escaped lone surrogates (they re-encode raw, not as
      a `\\udXXX` escape), and the minimal escapes of canonical_bytes;
    - the line is ASCII, or no byte of it starts a 4-byte UTF-8 sequence: every key is in the
      BMP, where code-point order (json's sort) and UTF-16 order (RFC 8785's sort) agree;
    - the line has at most MAX_DEPTH brackets in all, so it nests no deeper than MAX_DEPTH;
      or its data holds only scalars, and then (the other fields being strings and an int, as
      the checks below require) it nests exactly two deep.
    Then the line IS canonical_bytes of the parsed value, and the strict parser's own field
    checks (`_fields_of`: the exact keys, each field's type and pattern) run on that value.
    They leave only the hash: the keys sort as data, hash, log, prev, seq, ts, type, and the
    fields after hash hold no quote, so the line's last `,"hash":"` starts the top-level hash
    member, and removing it (`,"hash":"` + 64 hex + `"`) gives canonical_bytes(record without
    hash): the bytes that were hashed.
    """
    # `_decode_batch`'s conditions for one line (the writer's case: its tail), without the
    # batch's lists; the field checks are the batch's (`_checked`). The nesting bound on
    # cheaper data when it can: data holding only scalars (as nearly every record's does) and
    # the other fields as `_checked` requires them (strings, an int) nest exactly two deep.
    if (
        len(line) > MAX_LINE
        or not line.startswith(_RECORD_START)
        or (not line.isascii() and ASTRAL.search(line))
    ):
        return None
    try:
        text = line.decode("utf-8")
        obj, end = _scan(text, 0)
        if end != len(text) or encode_sorted(obj) != text:
            return None
    except (ValueError, RecursionError, StopIteration):
        return None
    data = obj.get("data") if type(obj) is dict else None
    if (
        type(data) is not dict or not _SCALARS.issuperset(map(type, data.values()))
    ) and len(line) - len(line.translate(None, _BRACKETS)) > MAX_DEPTH:
        return None
    return _checked(line, obj, sha256_maker(), None, None)


_BRACKETS = b"{["
"""What a line's nesting is bounded by: len(b) - len(b.translate(None, _BRACKETS)) is
b.count(b"{") + b.count(b"["), counted in one pass instead of two."""


# json's C scanner: what FAST_DECODER.decode runs, without its wrapper.
_scan = FAST_DECODER.scan_once  # type: ignore[attr-defined]


def _checked(
    line: bytes, obj: Any, hasher: Callable[..., Any], good_type: Any, good_hash: Any
) -> Fields | None:
    """The fields of `line`, of which `obj` is the parsed value and the line its canonical
    bytes (`_decode_batch`'s conditions hold), if `_fields_of`'s checks and the hash pass;
    else None. `good_type` and `good_hash`: a type and a hash found good before (or None)."""
    # `_fields_of`'s checks, each as cheap as it gets: the keys by their number once the six
    # are there (a seventh must be log); prev and type equal to ones found good, or else
    # checked (prev: 64 characters none of which is left once hex digits are stripped); hash
    # equal to a hexdigest, so 64 hex digits.
    try:
        seq, ts, typ, prev, h = obj["seq"], obj["ts"], obj["type"], obj["prev"], obj["hash"]
        data = obj["data"]
    except (KeyError, TypeError):  # not a dict, or a key missing
        return None
    size = len(obj)
    log = obj["log"] if size == 7 and "log" in obj else None
    if (
        type(obj) is not dict
        or (size != 6 and log is None)
        or type(seq) is not int
        or seq < 0
        or type(ts) is not str
        or not _TS_RE.fullmatch(ts)
        or (ts[8:10] > "28" and not real_day(ts))
        or (typ != good_type and (type(typ) is not str or not TYPE_RE.fullmatch(typ)))
        or (
            prev != good_hash
            and (type(prev) is not str or len(prev) != 64 or prev.strip(_HEX_DIGITS))
        )
        or type(data) is not dict
        or (log is not None and (type(log) is not str or not _LOG_RE.fullmatch(log)))
    ):
        return None
    # What was hashed: the line without its hash member. The members after data are in key
    # order hash, log, prev, seq, ts, type, and the values after hash's were just checked to
    # hold no quote: the line's last `,"hash":"` starts the top-level hash member, whose value
    # is 64 characters long if it equals a hexdigest (else the comparison fails whatever was
    # cut).
    i = line.rfind(_HASH_KEY)
    if type(h) is not str or hasher(DOMAIN + line[:i] + line[i + _CUT :]).hexdigest() != h:
        return None
    return (seq, ts, typ, prev, h, data, log)


_CUT = len(_HASH_KEY) + 65
"""The hash member's length after its key's first byte: `,"hash":"` + 64 hex + `"`."""


_HEX_DIGITS = "0123456789abcdef"


class BadRecord(ValueError):
    """A line that is not a well-formed record (verification turns it into a reason)."""


_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+\Z")
"""An event type: a dotted lower-case name such as `mcp.request`."""
_TS_RE = re.compile(f"^{TS_PATTERN}\\Z")
_LOG_RE = re.compile(r"^log_[0-9A-HJKMNP-TV-Z]{26}\Z")
_KEYS = frozenset({"data", "hash", "prev", "seq", "ts", "type"})
_KEYS_FIRST = _KEYS | {"log"}


def parse_strict(line: bytes) -> Fields:
    """The reference parser: check one stored line (without its newline) on its own.

    Checks: strict JSON (no duplicate keys, floats, NaN, lone surrogates, invalid UTF-8), the
    exact set of keys and their types, the canonical encoding, and the hash. Linkage to other
    records is the caller's business. Raises BadRecord with the reason. Slow and obviously
    right: `fast_fields` is tested against it.
    """
    if len(line) > MAX_LINE:
        raise BadRecord(f"line longer than {MAX_LINE} bytes")
    try:
        obj = strict_loads(line)
    except CanonicalError as exc:
        raise BadRecord(f"not a valid record: {exc}") from None
    fields = _fields_of(obj)
    body = {k: v for k, v in obj.items() if k != "hash"}
    try:
        encoded = canonical_bytes(obj)
    except CanonicalError as exc:  # pragma: no cover - strict_loads already refused these
        raise BadRecord(f"not a valid record: {exc}") from None
    if encoded != line:
        raise BadRecord("record is not in canonical form (re-encoded or edited by hand)")
    if sha256(DOMAIN + canonical_bytes(body)).hexdigest() != fields[4]:
        raise BadRecord("hash mismatch: the record's content was changed after it was written")
    return fields


def _fields_of(obj: Any) -> Fields:
    if not isinstance(obj, dict):
        raise BadRecord("not a valid record: not a JSON object")
    keys = obj.keys()
    if keys != _KEYS and keys != _KEYS_FIRST:
        missing = sorted(_KEYS - keys)
        extra = sorted(keys - _KEYS_FIRST)
        raise BadRecord(f"not a valid record: missing keys {missing}, unknown keys {extra}")
    seq, ts, typ, prev, h, data = (
        obj["seq"],
        obj["ts"],
        obj["type"],
        obj["prev"],
        obj["hash"],
        obj["data"],
    )
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise BadRecord("not a valid record: seq is not a non-negative integer")
    if not isinstance(ts, str) or not _TS_RE.fullmatch(ts):
        raise BadRecord("not a valid record: ts is not a UTC timestamp")
    if ts[8:10] > "28" and not real_day(ts):
        raise BadRecord(f"not a valid record: ts {ts} names a day its month does not have")
    if not isinstance(typ, str) or not TYPE_RE.fullmatch(typ):
        raise BadRecord("not a valid record: type is not a dotted event name")
    if not isinstance(prev, str) or not _HEX64.fullmatch(prev):
        raise BadRecord("not a valid record: prev is not a sha256 hex digest")
    if not isinstance(h, str) or not _HEX64.fullmatch(h):
        raise BadRecord("not a valid record: hash is not a sha256 hex digest")
    if not isinstance(data, dict):
        raise BadRecord("not a valid record: data is not an object")
    log = obj.get("log")
    if log is not None and (not isinstance(log, str) or not _LOG_RE.fullmatch(log)):
        raise BadRecord("not a valid record: log is not a log id")
    if "log" in obj and log is None:
        raise BadRecord("not a valid record: log is null")
    return (seq, ts, typ, prev, h, data, log)


def parse(line: bytes) -> Fields:
    """The fields of one stored line: the fast stage, else the strict parser's verdict (the
    same fields, or BadRecord with its reason)."""
    fields = fast_fields(line)
    return fields if fields is not None else parse_strict(line)


_SCALARS = frozenset({str, int, bool, type(None)})


def _flat(data: Any) -> bool:
    """A dict (exactly) of str keys to str, bool, None or int values within +-(2^53-1), each of
    exactly those types (no subclass, whose encoding could differ)."""
    if type(data) is not dict:
        return False
    for k, v in data.items():
        t = type(v)
        if type(k) is not str or t not in _SCALARS:
            return False
        if t is int and not -SAFE_INT <= v <= SAFE_INT:
            return False
    return True


def encode_data(data: Any) -> tuple[bytes, Any]:
    """(canonical_bytes(data), a fresh copy of data as parsed back from those bytes).

    Tries the C json encoder first and keeps its output only when it provably equals
    canonical_bytes (the same argument as fast_fields): it parses back, with floats refused
    and integers range-checked, to a value equal to `data` (so every key was a string and every
    container a dict or list), encodes to UTF-8 (no lone surrogates), has no character beyond
    the BMP (json's key order is RFC 8785's) and at most MAX_DEPTH brackets. Otherwise the
    reference encoder decides, and raises CanonicalError for what it refuses.

    A flat record (`_flat`: most audit records are) needs no parsing back: its types are checked
    directly, and a copy of the dict is the parsed-back value (its values are immutable). The
    UTF-8 and BMP conditions are checked as above.
    """
    raw, stored, _ = _encode_data(data)
    return raw, stored


def _encode_data(data: Any) -> tuple[bytes, Any, bool]:
    """encode_data's (bytes, parsed-back value) and whether `data` was flat (`_flat`: then
    it nests exactly one level deep)."""
    try:
        text = encode_sorted(data)
        raw = text.encode("utf-8")
        if _flat(data) and (raw.isascii() or not ASTRAL.search(raw)):
            return raw, dict(data), True
        back = FAST_DECODER.decode(text)
        if (
            back == data
            and len(raw) - len(raw.translate(None, _BRACKETS)) <= MAX_DEPTH
            and (raw.isascii() or not ASTRAL.search(raw))
        ):
            return raw, back, False
    except (ValueError, TypeError, RecursionError):
        pass
    raw = canonical_bytes(data)
    return raw, json.loads(raw), False


def check_type(typ: str) -> None:
    """AuditError unless `typ` is a well-formed event type (TYPE_RE)."""
    if not TYPE_RE.fullmatch(typ):
        raise AuditError(
            f"could not record to the audit log: invalid event type {typ!r}", HINT_EVENT_TYPE
        )


def build_line(
    seq: int, prev: str, last_ts: str, typ: str, data: Mapping[str, Any], log_id: str | None
) -> tuple[str, str, bytes, Any]:
    """(hash, ts, stored line with its newline, data as stored) of a new record after one whose
    ts is `last_ts`. AuditError if the data has no canonical form or the line is too long."""
    # A clock stepping back must not make the chain look reordered: never go below the tail.
    ts = max(now_ts(), last_ts)
    try:
        if not isinstance(data, Mapping):
            raise CanonicalError("event data must be an object")
        data_bytes, stored, flat = _encode_data(data)
        if (
            not flat
            and len(data_bytes) - len(data_bytes.translate(None, _BRACKETS)) >= MAX_DEPTH
        ):
            # The record is one level around the data: a line the verifier (and the next
            # append, which proves the tail) would refuse is never written. (Flat data nests
            # one level deep: nothing to count.)
            check_depth(data_bytes.decode("utf-8"), MAX_DEPTH - 1)
    except (CanonicalError, RecursionError) as exc:
        raise AuditError(
            f"could not record to the audit log: the event data cannot be recorded: {exc}",
            HINT_UNCANONICAL,
        ) from None
    head, after = encode_record(seq, ts, typ, prev, data_bytes, log_id)
    h = sha256(DOMAIN + head + after).hexdigest()
    line = head + b',"hash":"' + h.encode("ascii") + b'"' + after
    if len(line) > MAX_LINE:
        raise AuditError(
            f"could not record to the audit log: record larger than {MAX_LINE} bytes",
            HINT_TOO_LARGE,
        )
    return h, ts, line + b"\n", stored


_RECORD_START = b'{"data":{'
_CONTROL = re.compile(rb"[\x00-\x1f]")


def looks_torn(tail: bytes) -> bool:
    """Could `tail`, an unterminated last line, be a record line cut short by a crash?

    Only then is it a torn append (harmless, repaired by the next append). A record line is at
    most MAX_LINE bytes, starts with `{"data":{`, is strict UTF-8 and holds no byte below 0x20
    (canonical JSON escapes control characters, and the newline ends the line); a prefix of it
    keeps all of that except that it may stop inside a UTF-8 sequence. Anything else (zeros
    from a sparse file, an oversize or foreign tail) is damage, not a crash.
    """
    if not tail or len(tail) > MAX_LINE:
        return False
    n = min(len(tail), len(_RECORD_START))
    if tail[:n] != _RECORD_START[:n] or _CONTROL.search(tail):
        return False
    try:
        # final=False: a crash may cut a multi-byte character in two.
        codecs.getincrementaldecoder("utf-8")().decode(tail, final=False)
    except UnicodeDecodeError:
        return False
    return True


def torn_problem(offset: int, line: bytes) -> str | None:
    """None if the unterminated last line at `offset` looks like a torn append (a crash), else
    why it is damage."""
    if looks_torn(line):
        return None
    return (
        f"unterminated last line at byte {offset} ({len(line)} bytes) is not the start of a "
        "record: not a crash during append, the log was damaged or changed"
    )
