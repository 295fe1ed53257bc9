"""The audit record codec and the one writer of chain files.

Codec: `build_line` encodes a record (canonical bytes, hash), `parse` reads one back: a fast
stage (`fast_fields`, C-speed, returns None when unsure; `fast_batch` for many lines at once
and `chain_batch` for a batch of records that follow each other, the verifier's) and the
strict reference parser (`parse_strict`), which gives the verdict and the reason whenever the
fast stage is unsure. Fuzz tests hold them equal (tests/unit/test_audit_codec.py).

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
import contextlib
import errno
import fcntl
import json
import operator
import os
import re
import stat
import time
from collections.abc import Mapping
from itertools import repeat
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
from linpodx.errors import AuditError, LinpodxError
from linpodx.paths import FILE_MODE, check_dir_str, ensure_dir_str

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


def _decode_batch(lines: list[bytes]) -> list[Any] | None:
    """The parsed values of `lines`, or None unless every line passes the first half of
    fast_fields's conditions (size, start, nesting, BMP, UTF-8, a strict parse, the canonical
    re-encoding), proved for all of them at once.

    One encoder call for the whole batch: each line is parsed on its own by json's C scanner
    (what FAST_DECODER.decode runs), which must consume it exactly, so each value is what
    FAST_DECODER.decode(line) gives; then the values re-encoded as one list must equal the
    lines joined as one list. Each line is a whole JSON object (it starts with `{` and the
    scan ends at its last byte), and so is each value's encoding; an object's text is
    prefix-free (its opening brace closes at its end, lexing left to right), so neither
    encoding of an element can be a proper prefix of the other: the joined texts are equal only
    if every value re-encodes to its own line exactly.
    Nesting: every line starts with `{"data":{`, two brackets, so brackets in all at most
    2 * (n - 1) + MAX_DEPTH means none of the lines holds more than MAX_DEPTH.
    """
    n = len(lines)
    if not n:
        return []
    try:
        for line in lines:  # first: the nesting bound below counts on every line's start
            if not line.startswith(_RECORD_START):
                return None
        raw = b",".join(lines)
        ascii_ = raw.isascii()
        if (
            max(map(len, lines)) > MAX_LINE
            or len(raw) - len(raw.translate(None, _BRACKETS)) > 2 * (n - 1) + MAX_DEPTH
            or (not ascii_ and ASTRAL.search(raw))
        ):
            return None
        # Strict UTF-8 for all lines at once (a comma is never part of a multi-byte
        # sequence, so the joined bytes decode exactly when each line does, to the decoded
        # lines joined); each line is then scanned in place, from where it starts in `text`.
        text = raw.decode("utf-8")
        sizes = map(len, lines) if ascii_ else [len(line.decode("utf-8")) for line in lines]
        objs: list[Any] = []
        add = objs.append
        at = 0
        for size in sizes:
            obj, end = _scan(text, at)
            at += size
            if end != at:
                return None
            add(obj)
            at += 1  # the comma
        if encode_sorted(objs) != "[" + text + "]":
            return None
    except (ValueError, RecursionError, StopIteration):
        return None
    return objs


def fast_batch(lines: list[bytes]) -> list[Fields | None]:
    """[fast_fields(line) for line in lines], the same results at less cost per line: the
    json stage runs once for the batch (`_decode_batch`); when it is unsure for the batch,
    each line goes on its own."""
    objs = _decode_batch(lines)
    if objs is None:
        return [fast_fields(line) for line in lines]
    out: list[Fields | None] = []
    add = out.append
    hasher = sha256_maker()
    good_hash = good_type = None  # the last hash and type found good in this batch
    for line, obj in zip(lines, objs, strict=True):
        rec = _checked(line, obj, hasher, good_type, good_hash)
        if rec is not None:
            good_hash, good_type = rec[4], rec[2]
        add(rec)
    return out


_COLUMNS = operator.itemgetter("seq", "ts", "type", "prev", "hash", "data")
_DAY = operator.itemgetter(slice(8, 10))
_ONLY_DICT, _ONLY_INT, _ONLY_STR, _ONLY_SIX = {dict}, {int}, {str}, {6}


def chain_batch(lines: list[bytes], seq: int, tail: str, last_ts: str) -> list[Fields] | None:
    """fast_batch(lines) when every line is a record after the first of its log (no log id)
    and each follows the one before as the verifier's walk requires: seq counting on from
    `seq` (>= 1), prev from `tail`, ts never below `last_ts` nor its predecessor's; None when
    any line is not (or unsure): then the lines go one by one (`fast_batch`, the walk's
    checks), which say which and why.

    The same checks as `_checked` and the walk's, a column at a time in C (map, zip, list
    comparisons) instead of a line at a time in Python: every key there and no seventh
    (`len`), each column's type, ts by TS_PATTERN and `real_day`, each type by TYPE_RE once
    per distinct type, prev linked (prev[0] == tail, checked as a hex digest, each later
    prev equal to the hash before it, which equals a hexdigest), and each hash equal to the
    hexdigest of its line without its hash member (`_checked`'s argument: the values after
    the hash member then hold no quote).
    """
    objs = _decode_batch(lines)
    if not objs or seq < 1:
        return None
    if set(map(type, objs)) != _ONLY_DICT or set(map(len, objs)) != _ONLY_SIX:
        return None
    try:
        seqs, tss, typs, prevs, hashes, datas = zip(*map(_COLUMNS, objs), strict=True)
    except KeyError:
        return None
    n = len(objs)
    first = prevs[0]
    if (
        set(map(type, seqs)) != _ONLY_INT
        or seqs != tuple(range(seq, seq + n))
        or set(map(type, tss)) != _ONLY_STR
        or not all(map(_TS_RE.fullmatch, tss))
        or tss[0] < last_ts
        or not all(map(operator.le, tss, tss[1:]))
        or set(map(type, typs)) != _ONLY_STR
        or not all(map(TYPE_RE.fullmatch, set(typs)))
        or first != tail
        or type(first) is not str
        or len(first) != 64
        or first.strip(_HEX_DIGITS)
        or prevs[1:] != hashes[:-1]
        or set(map(type, datas)) != _ONLY_DICT
    ):
        return None
    if max(map(_DAY, tss)) > "28" and not all(
        real_day(ts) for ts in tss if ts[8:10] > "28"
    ):
        return None
    hasher = sha256_maker()
    cut = _CUT
    key = _HASH_KEY
    made = tuple(
        [
            hasher(DOMAIN + line[:i] + line[i + cut :]).hexdigest()
            for line, i in zip(lines, map(bytes.rfind, lines, repeat(key)), strict=True)
        ]
    )
    if made != hashes:
        return None
    return list(zip(seqs, tss, typs, prevs, hashes, datas, repeat(None)))


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


def pread_all(fd: int, offset: int, length: int) -> bytes:
    parts = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 20), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(parts)


def write_all(fd: int, data: bytes) -> None:
    n = os.write(fd, data)
    if n == len(data):  # as good as always: one write of a record or a batch
        return
    if n <= 0:  # pragma: no cover - write(2) reports errors by raising
        raise OSError(28, "short write")
    view = memoryview(data)[n:]
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - write(2) reports errors by raising
            raise OSError(28, "short write")
        view = view[n:]


_LOG_DIRS: dict[tuple[str, int], tuple[int, int, int, str, str]] = {}
"""(a chain file's path as named, euid) -> (an fd held open on its directory, the directory's
st_dev and st_ino, the directory's name, the file's name in it), for the files `open_chain`
has opened in this process: the fd keeps the inode from being reused while it is cached, so
the pair names that directory and no other."""
_LOG_DIRS_MAX = 8
_DIR_OPEN_MASK = stat.S_IFMT(0o777777) | 0o077
"""The file type bits and the group's and others' permission bits of a mode."""


def open_chain(path: str, flags: int, *, create: bool) -> int:
    """Chain file `path` opened with `flags` (mode 0600 if created) after checking its
    directory; the caller closes the fd. OSError or LinpodxError as the checks raise.

    The directory is checked as `paths.ensure_dir_str` (with `create`: made if missing) or
    `paths.check_dir_str` checks it (no link or other user's directory on the way: either
    would put records outside the state dir), then held open, and the file is opened relative
    to it: into the directory that was checked, even if its name is swapped in between.
    Every later open of the same file costs one lstat instead of the checks: the name must
    still be that very directory (same device and inode, pinned by the held fd), still ours,
    closed to others and not a link; anything else gets the full checks again.
    """
    euid = os.geteuid()
    key = (path, euid)
    known = _LOG_DIRS.get(key)
    if known is not None:
        fd, dev, ino, where, name = known
        try:
            st: os.stat_result | None = os.lstat(where)
        except OSError:
            st = None  # gone (made again below) or unreadable (the checks say why)
        if (
            st is not None
            and st.st_ino == ino
            and st.st_dev == dev
            and st.st_uid == euid
            and st.st_mode & _DIR_OPEN_MASK == stat.S_IFDIR  # a directory, closed to others
        ):
            return os.open(name, flags, FILE_MODE, dir_fd=fd)
        del _LOG_DIRS[key]
        os.close(fd)
    where = os.path.dirname(path)
    if create:
        ensure_dir_str(where)
    else:
        check_dir_str(where)
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        # The checks once more, now that the fd is open: what gets cached is a directory the
        # name led to, with no link on the way, both before and after it was opened.
        check_dir_str(where)
        st, now = os.fstat(fd), os.lstat(where)
    except BaseException:
        os.close(fd)
        raise
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        # Reached through a link (allowed outside the state dir) or swapped since the checks:
        # nothing to cache; the file is opened by its name, as the checks saw it.
        os.close(fd)
        return os.open(path, flags, FILE_MODE)
    _LOG_DIRS[key] = (fd, st.st_dev, st.st_ino, where, os.path.basename(path))
    while len(_LOG_DIRS) > _LOG_DIRS_MAX:
        os.close(_LOG_DIRS.pop(next(iter(_LOG_DIRS)))[0])
    return os.open(os.path.basename(path), flags, FILE_MODE, dir_fd=fd)


def open_append(path: str) -> int:
    """The chain file opened for appending (created 0600 in 0700 dirs if missing), not locked;
    the caller closes it. AuditError on failure."""
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        # Every time, not only for a first record: a link (or another user's directory) on the
        # way would put the record outside the state dir (`open_chain`).
        return open_chain(path, flags, create=True)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            # O_NOFOLLOW refused it: "too many levels of symbolic links" and a disk-space
            # hint would send the person looking at the wrong thing.
            raise AuditError(
                f"could not record to the audit log {path}: it is a symbolic link, and "
                "linpodx does not write through links",
                "replace the link with the file it points to; nothing was done because it "
                "could not be recorded",
            ) from None
        raise AuditError(
            f"could not record to the audit log {path}: {exc.strerror or exc}", HINT_WRITE
        ) from None


def lock(fd: int, path: str) -> None:
    """Take the writers' exclusive flock on an open chain file; AuditError on failure."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise AuditError(
            f"could not record to the audit log {path}: lock failed: {exc.strerror or exc}",
            HINT_WRITE,
        ) from None


def open_locked(path: str) -> int:
    """The chain file opened for appending and locked exclusively (`open_append`, `lock`); the
    caller closes it, which releases the lock. AuditError on failure."""
    fd = open_append(path)
    try:
        lock(fd, path)
    except AuditError:
        os.close(fd)
        raise
    return fd


def checked_size(fd: int, path: str) -> int:
    """The size of the open chain file; AuditError unless it is a regular file. Tightens its
    mode to 0600 if it is ours."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise AuditError(
            f"could not record to the audit log {path}: not a regular file",
            "move it away; linpodx creates the log itself",
        )
    if stat.S_IMODE(st.st_mode) != FILE_MODE and st.st_uid == os.getuid():
        os.fchmod(fd, FILE_MODE)
    return st.st_size


def tail_line(fd: int, size: int) -> tuple[bytes | None, int | None]:
    """(the last complete line without its newline, where a torn last line starts).

    (None, None) for an empty file, (None, 0) when the whole file is one torn line. Reads
    backwards from the end in chunks; never more than the last line plus one chunk.
    """
    if size == 0:
        return None, None
    buf = b""
    pos = size
    line = b""
    # Find the end of the last complete line (the last newline) and the line before it.
    end_nl: int | None = None  # offset of the newline ending the last complete line
    while pos > 0:
        step = min(TAIL_CHUNK, pos)
        pos -= step
        buf = os.pread(fd, step, pos) + buf
        if end_nl is None:
            i = buf.rfind(b"\n")
            if i >= 0:
                end_nl = pos + i
        if end_nl is not None:
            j = buf.rfind(b"\n", 0, end_nl - pos)
            if j >= 0 or pos == 0:
                start = pos + j + 1 if j >= 0 else 0
                line = buf[start - pos : end_nl - pos]
                break
        if size - pos > 2 * MAX_LINE + 2 * TAIL_CHUNK:
            raise AuditError(
                "the audit log's last line is longer than any record we write", HINT_VERIFY
            )
    if end_nl is None:
        # No newline at all: the whole file is one torn line (the very first append crashed).
        return None, 0
    return line, (end_nl + 1 if end_nl + 1 < size else None)


def commit(
    fd: int, payload: bytes, base: int, path: str, *, cut_to: int | None = None, sync: bool = True
) -> None:
    """Write `payload` at the end (after cutting the file to `cut_to`, a torn tail) and, unless
    `sync` is False (group commit: its sync role fsyncs), fsync.

    On failure no partial line is left behind (the file is cut back to `base`): the action is
    not going to happen, so no record of it may remain either. AuditError then.
    """
    try:
        if cut_to is not None:
            os.ftruncate(fd, cut_to)
        write_all(fd, payload)
        if sync:
            os.fsync(fd)
    except OSError as exc:
        # A torn tail that was cut off stays cut: it was never a record.
        try:
            os.ftruncate(fd, base)
            os.fsync(fd)
        except OSError:
            pass
        raise AuditError(
            f"could not record to the audit log {path}: {exc.strerror or exc}", HINT_WRITE,
            details={"errno": exc.errno},
        ) from None


Tail = tuple[int, str, str]
"""Where the next append continues: (its seq, its prev, the last record's ts)."""


class Appended:
    """What `append_locked` did."""

    __slots__ = ("base", "end", "last", "results", "tail")

    def __init__(
        self,
        results: list[Fields | AuditError],
        tail: Tail | None,
        base: int,
        end: int,
        last: bytes = b"",
    ) -> None:
        self.results = results
        """Per entry, in order: the record's fields, or why this entry alone was not recorded."""
        self.tail = tail
        """Where the next append continues; None when nothing was written."""
        self.base = base
        """The file's size before the write (after cutting a torn tail): what was there."""
        self.end = end
        """The file's size after the write."""
        self.last = last
        """The last line written, with its newline (b"" when nothing was): what the file must
        still end with for `tail` to hold (group commit's tail proof)."""


_WRITTEN: dict[str, tuple[bytes, Fields]] = {}
"""A chain file's path -> (the last line this process appended to it, without its newline;
its fields), for the next append's tail proof (`_written_tail`)."""
_WRITTEN_MAX = 8


def _remember(path: str, line: bytes, fields: Fields) -> None:
    """Keep the line just written (with its newline) and its fields for the next append's
    tail proof (`_written_tail`). Nothing is checked here: a lone append, the only one of its
    process, pays only for the store."""
    _WRITTEN.pop(path, None)  # re-inserted last: the oldest entry goes first
    _WRITTEN[path] = (line[:-1], fields)
    while len(_WRITTEN) > _WRITTEN_MAX:
        _WRITTEN.pop(next(iter(_WRITTEN)), None)


def _written_tail(path: str, line: bytes) -> Fields | None:
    """The fields of `line`, the locked file's last complete line, if it is exactly the line
    this process appended to `path` last and `fast_fields` provably returns the fields it was
    built from; else None (the codec parses it).

    The same bytes parse to the same fields, whatever happened to the file in between
    (another writer, a truncation, a replaced file, a swapped directory): the line is read
    from the file and compared in full, as ever; only the parse of it is saved.
    build_line made it from checked parts: data by `encode_data` (canonical, its ints in
    range), type by TYPE_RE, ts by now_ts or the parsed tail's, the log id by new_id, the hash
    its own, in canonical order (`encode_record`, held equal to canonical_bytes by a unit
    test); prev is the hash of a record parsed or built, or for seq 0 the caller's genesis.
    Left to check are what fast_fields asks of the whole line that the parts do not imply:
    its nesting, no character beyond the BMP (the canonical_bytes fallback may write one), seq
    in the integer range, a genesis a hex digest. A unit test holds built lines to fast_fields.
    """
    mine = _WRITTEN.get(path)
    if mine is None or mine[0] != line:
        return None
    fields = mine[1]
    if (
        len(line) - len(line.translate(None, _BRACKETS)) <= MAX_DEPTH
        and (line.isascii() or not ASTRAL.search(line))
        and fields[0] <= SAFE_INT
        and (fields[0] or (_HEX64.fullmatch(fields[3]) and _LOG_RE.fullmatch(fields[6] or "")))
    ):
        return fields
    return None


def _read_tail(fd: int, path: str, simple: bool) -> tuple[int, Fields | None, int | None] | None:
    """(size, last record, where a torn last line starts) of the locked file. In simple mode
    None whenever the full append is needed (empty file, torn tail, a tail the fast parser
    cannot vouch for, an I/O error it would report)."""
    try:
        size = checked_size(fd, path)
        line, torn_at = tail_line(fd, size)
    except OSError as exc:
        if simple:
            return None
        raise AuditError(
            f"could not record to the audit log {path}: {exc.strerror or exc}", HINT_WRITE
        ) from None
    if line is not None and torn_at is None:
        mine = _written_tail(path, line)
        if mine is not None:
            return size, mine, None
    if simple:
        last = fast_fields(line) if line is not None and torn_at is None else None
        return None if last is None else (size, last, None)
    if line is None:
        return size, None, torn_at
    try:
        return size, fast_fields(line) or parse_strict(line), torn_at
    except BadRecord as exc:
        raise AuditError(
            f"the audit log's last record is damaged ({exc}); refusing to chain onto it",
            HINT_VERIFY,
        ) from None


def _repair_data(fd: int, path: str, size: int, torn_at: int) -> dict[str, Any]:
    """The `audit.repair` record's data for cutting off the torn tail at `torn_at`.

    Only a tail that looks like a torn append is cut off as a crash; anything else (longer than
    any record, zeros, foreign bytes) is damage for a person to look at, exactly as `verify`
    reports it: AuditError then.
    """
    if size - torn_at > MAX_LINE:
        raise AuditError(
            f"could not record to the audit log {path}: the unterminated last line "
            f"at byte {torn_at} is longer than any record we write; refusing to cut it off",
            HINT_VERIFY,
        )
    removed = pread_all(fd, torn_at, size - torn_at)
    bad = torn_problem(torn_at, removed)
    if bad is not None:
        raise AuditError(
            f"could not record to the audit log {path}: {bad}; refusing to cut it off",
            HINT_VERIFY,
        )
    return {
        "reason": "torn last line removed (crash during an earlier append)",
        "offset": torn_at,
        "removed_bytes": len(removed),
        "removed_sha256": sha256(removed).hexdigest(),
    }


def append_locked(
    fd: int,
    path: str,
    genesis: str,
    entries: list[tuple[str, Mapping[str, Any]]],
    *,
    known: tuple[Tail, int] | None = None,
    sync: bool = True,
    simple: bool = False,
    typed: bool = False,
) -> Appended | None:
    """Append `entries` (type, data) to the chain file open as `fd`, which the caller holds
    locked exclusively: the one writer of every chain file.

    The tail is read from the file (its last record parsed, fast stage then strict) unless
    `known` gives it with the file size it belongs to (group commit, which wrote that tail
    itself); when the last line is exactly the one this process appended last, its fields are
    remembered, not parsed again (`_written_tail`). A torn last line is cut off and an
    `audit.repair` record saying what was removed goes first. An entry that cannot be
    recorded (type, data, size) fails alone, in its result; the others go in, in one write,
    fsync'd unless `sync` is False. AuditError when the log itself cannot be written: then
    nothing was. `simple` (the fast run path): None, having written nothing, whenever the full
    append is needed instead (see `append_simple`). `typed`: the caller has checked every
    entry's type with `check_type` (then it is not checked again).
    """
    torn_at: int | None = None
    if known is not None:
        tail, size = known
    else:
        got = _read_tail(fd, path, simple)
        if got is None:
            return None
        size, last, torn_at = got
        tail = (0, genesis, "") if last is None else (last[0] + 1, last[4], last[1])
    seq, prev, last_ts = tail
    lines: list[bytes] = []
    results: list[Fields | AuditError] = []
    todo = list(entries)
    if torn_at is not None:
        todo.insert(0, ("audit.repair", _repair_data(fd, path, size, torn_at)))
    for typ, data in todo:
        try:
            if not typed:
                check_type(typ)
            log_id = None
            if seq == 0:
                from linpodx.ids import new_id  # only for a new log: off the fast path

                log_id = new_id("log")
            h, ts, line, stored = build_line(seq, prev, last_ts, typ, data, log_id)
        except AuditError as exc:
            results.append(exc)
            continue
        lines.append(line)
        written: Fields = (seq, ts, typ, prev, h, stored, log_id)
        results.append(written)
        seq, prev, last_ts = seq + 1, h, ts
    if torn_at is not None:
        repaired = results.pop(0)  # the repair record is ours, not an entry's
        if isinstance(repaired, AuditError):  # pragma: no cover - its data is always recordable
            raise repaired
    base = torn_at if torn_at is not None else size
    if not lines or (torn_at is not None and len(lines) == 1):
        return Appended(results, None, base, size)  # nothing of the caller's to write
    payload = b"".join(lines)
    commit(fd, payload, base, path, cut_to=torn_at, sync=sync)
    _remember(path, lines[-1], written)
    if base == 0:
        from linpodx.fsutil import fsync_dir  # a new file: off the fast path

        with contextlib.suppress(OSError):
            fsync_dir(os.path.dirname(path))
    return Appended(results, (seq, prev, last_ts), base, base + len(payload), lines[-1])


def append_simple(path: str, typ: str, data: Mapping[str, Any]) -> bool:
    """Append one record to an existing, intact chain file, durably; False, having written
    nothing, whenever the full append (`chain.Chain.append`) is needed instead: no file yet or
    an empty one (a first record names its log), a torn last line to repair, or a last line the
    fast parser cannot vouch for (the strict parser then decides). AuditError as for append.
    """
    try:
        # No link on the way (`paths.check_dir_str`, by `open_chain`).
        fd = open_chain(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, create=False)
    except (OSError, LinpodxError):
        return False  # the full append refuses it and says why
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            return False
        done = append_locked(fd, path, ZERO_HASH, [(typ, data)], simple=True)
        if done is None:
            return False
        [result] = done.results
        if isinstance(result, AuditError):
            raise result
        return True
    finally:
        os.close(fd)
