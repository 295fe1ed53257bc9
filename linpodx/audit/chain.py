"""Append-only, hash-chained audit logs (JSONL).

Each line of a chain file is the canonical JSON (RFC 8785 subset, see `linpodx.canonical`) of
one record::

    {"data": {...}, "hash": H, ["log": LOG_ID,] "prev": P, "seq": N, "ts": T, "type": TYPE}

`hash` is sha256(DOMAIN + canonical_bytes(record without "hash")), `prev` is the hash of the
record before it (for seq 0: the chain's genesis, 64 zeros for the admin chain, the profile
revision's audit_hash for a session chain), and `log` is a random id carried by the first record
only, so records spliced in from another log are told apart.

Appends take an exclusive flock, read only the tail of the file, write the whole line in one
write and fsync before returning: when `append` returns, the record is on disk; when it raises
`AuditError`, the file is as it was and the caller must not perform the action.

A crash (kill -9, power loss) can leave a last line without its newline. That is reported as a
crash, not tampering, and the next append cuts it off and first records an `audit.repair` record
saying what it removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from json import encoder as json_encoder
from pathlib import Path
from typing import Any

from linpodx.canonical import MAX_DEPTH, SAFE_INT, CanonicalError, canonical_bytes, strict_loads
from linpodx.errors import AuditError
from linpodx.fsutil import fsync_dir
from linpodx.ids import new_id
from linpodx.paths import FILE_MODE, audit_dir, ensure_dir, sessions_audit_dir

DOMAIN = b"linpodx-audit-v1\n"
ZERO_HASH = "0" * 64
MAX_LINE = 1024 * 1024
"""Longest record line we write or read (bytes, without the newline)."""

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TYPE_RE = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+$")
_TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
_LOG_RE = re.compile(r"^log_[0-9A-HJKMNP-TV-Z]{26}$")
_SESSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_KEYS = frozenset({"data", "hash", "prev", "seq", "ts", "type"})
_KEYS_FIRST = _KEYS | {"log"}
_TAIL_CHUNK = 8 * 1024

HINT_WRITE = (
    "check that the state dir is writable and the disk is not full (df -h); "
    "nothing was done because it could not be recorded"
)
HINT_VERIFY = "run `linpodx audit verify` to see what is wrong with the log"


@dataclass(frozen=True)
class Record:
    """One audit record as stored."""

    seq: int
    """Position in the chain, from 0, without gaps."""
    ts: str
    """UTC time of the append, `YYYY-MM-DDTHH:MM:SS.ffffffZ`; never decreases along a chain."""
    type: str
    """Dotted event type, e.g. `profile.apply`, `session.close`, `audit.repair`."""
    prev: str
    """Hash of the previous record (the genesis for seq 0)."""
    hash: str
    """sha256 hex over the domain prefix and the canonical record without `hash`."""
    data: Mapping[str, Any]
    """What happened (canonical-JSON values only: no floats)."""
    log_id: str | None = None
    """The log's random id; set on the first record only."""

    def to_dict(self) -> dict[str, Any]:
        """The record as it is stored (with `hash`; `log` only on the first record)."""
        d: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "prev": self.prev,
            "hash": self.hash,
            "data": dict(self.data),
        }
        if self.log_id is not None:
            d["log"] = self.log_id
        return d


@dataclass(frozen=True)
class VerifyReport:
    """What `verify_file` found."""

    ok: bool
    """True if every complete record checks out (a torn last line alone does not clear this)."""
    events: int
    """Number of valid records before the first bad one (all of them when ok)."""
    head: str
    """The hash the chain starts from (prev of seq 0; the genesis when the file is empty)."""
    tail: str
    """Hash of the last valid record (the head when there is none)."""
    first_bad_seq: int | None
    """Seq (position) of the first record that fails, None when ok."""
    reason: str | None
    """Why it failed (or, when ok, the torn-tail warning), None when clean."""
    torn_tail: bool
    """A last line without newline was found: a crash during an append, not tampering."""
    log_id: str | None
    """The log id from the first record."""
    torn_offset: int | None = None
    """Byte offset where the torn last line starts."""
    torn_bytes: int = 0
    """Length of the torn last line."""
    path: str = ""
    """The file verified."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `--json`."""
        return {
            "path": self.path,
            "ok": self.ok,
            "events": self.events,
            "head": self.head,
            "tail": self.tail,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
            "torn_tail": self.torn_tail,
            "torn_offset": self.torn_offset,
            "torn_bytes": self.torn_bytes,
            "log_id": self.log_id,
        }


class BadRecord(ValueError):
    """A line that is not a well-formed record (internal: verification turns it into a reason)."""


def record_hash(body: Mapping[str, Any]) -> str:
    """sha256 hex of DOMAIN + canonical bytes of a record without its `hash`."""
    return hashlib.sha256(DOMAIN + canonical_bytes(body)).hexdigest()


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
    after = b"".join(
        (
            b',"log":"' + log_id.encode("ascii") + b'"' if log_id is not None else b"",
            b',"prev":"',
            prev.encode("ascii"),
            b'","seq":',
            str(seq).encode("ascii"),
            b',"ts":"',
            ts.encode("ascii"),
            b'","type":"',
            typ.encode("ascii"),
            b'"}',
        )
    )
    return b'{"data":' + data_bytes, after


def torn_reason(offset: int, length: int) -> str:
    """The words used everywhere for a torn last line."""
    return (
        f"torn last line at byte {offset} ({length} bytes without newline): "
        "crash during append, not tampering; the next append repairs it"
    )


def parse_line(line: bytes) -> Record:
    """Parse and check one stored line (without its newline) on its own.

    Checks: strict JSON (no duplicate keys, floats, NaN, lone surrogates, invalid UTF-8), the
    exact set of keys and their types, the canonical encoding, and the hash. Linkage to other
    records is the caller's business. Raises BadRecord with the reason.
    """
    if len(line) > MAX_LINE:
        raise BadRecord(f"line longer than {MAX_LINE} bytes")
    try:
        obj = strict_loads(line)
    except CanonicalError as exc:
        raise BadRecord(f"not a valid record: {exc}") from None
    rec = _record_from_obj(obj)
    body = {k: v for k, v in obj.items() if k != "hash"}
    try:
        encoded = canonical_bytes(obj)
    except CanonicalError as exc:  # pragma: no cover - strict_loads already refused these
        raise BadRecord(f"not a valid record: {exc}") from None
    if encoded != line:
        raise BadRecord("record is not in canonical form (re-encoded or edited by hand)")
    if record_hash(body) != rec.hash:
        raise BadRecord("hash mismatch: the record's content was changed after it was written")
    return rec


def _refuse_number(text: str) -> Any:
    raise ValueError(f"non-integer number {text}")


def _safe_int(text: str) -> int:
    value = int(text)
    if not -SAFE_INT <= value <= SAFE_INT:
        raise ValueError("integer outside the I-JSON range")
    return value


def _no_default(value: Any) -> Any:  # pragma: no cover - json.loads output is always encodable
    raise TypeError(f"cannot encode {type(value).__name__}")


# The C-accelerated json codec, configured so that its output for the values we allow is
# byte-identical to canonical_bytes (same string escaping: canonical.py uses json.dumps for
# strings; same integers; keys sorted by code point, which equals UTF-16 order as long as no
# character lies outside the BMP; see _fast_record for the conditions).
_FAST_DECODER = json.JSONDecoder(
    parse_float=_refuse_number, parse_constant=_refuse_number, parse_int=_safe_int
)
_FAST_ENCODER = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))
_c_make_encoder = getattr(json_encoder, "c_make_encoder", None)
_c_encode_basestring = getattr(json_encoder, "c_encode_basestring", None)
_encode_sorted: Callable[[Any], str] = _FAST_ENCODER.encode
if _c_make_encoder is not None and _c_encode_basestring is not None:
    # One C encoder built once (json.JSONEncoder.encode builds a new one per call). Same
    # arguments JSONEncoder passes: markers, default, string encoder, indent, separators,
    # sort_keys, skipkeys, allow_nan.
    _c_encode = _c_make_encoder(
        None, _no_default, _c_encode_basestring, None, ":", ",", True, False, False
    )

    def _encode_c(value: Any) -> str:
        return "".join(_c_encode(value, 0))

    _encode_sorted = _encode_c

_ASTRAL = re.compile(rb"[\xf0-\xf4]")  # lead bytes of 4-byte UTF-8 sequences (> U+FFFF)
_HASH_KEY = b',"hash":"'
_SUFFIX = re.compile(
    rb',"hash":"(?P<hash>[0-9a-f]{64})"'
    rb'(?:,"log":"(?P<log>log_[0-9A-HJKMNP-TV-Z]{26})")?'
    rb',"prev":"(?P<prev>[0-9a-f]{64})"'
    rb',"seq":(?P<seq>0|[1-9][0-9]{0,14})'
    rb',"ts":"(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)"'
    rb',"type":"(?P<type>[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)+)"\}'
)


def _fast_record(line: bytes) -> Record | None:
    """The Record `parse_line` would return, computed at C speed, or None if unsure.

    None never means "bad": the caller then runs the strict reference parser, which gives the
    exact verdict and reason. A Record is only returned when it is provably what parse_line
    returns:
    - the line decodes as strict UTF-8 (no encoded surrogates) and json parses it with floats,
      NaN and Infinity refused and every integer checked to be within +-(2^53-1);
    - re-encoding the parsed value with sorted keys and no whitespace gives back the line
      exactly. That implies no duplicate keys (the parsed value would have lost one and could
      not re-encode to the same text), no escaped lone surrogates (they re-encode raw, not as
      a `\\udXXX` escape), and the minimal escapes of canonical_bytes;
    - the line is ASCII, or no byte of it starts a 4-byte UTF-8 sequence: every key is in the
      BMP, where code-point order (json's sort) and UTF-16 order (RFC 8785's sort) agree;
    - the line has at most MAX_DEPTH brackets in all, so it nests no deeper than MAX_DEPTH;
    - it starts with `{"data":{` and, from its last `,"hash":"`, ends with exactly the fields
      hash, optional log, prev, seq, ts, type in the patterns _record_from_obj enforces, and
      the object has no other key. Those fields hold no quote or backslash, so they are the
      top-level members (read back from the final `}`, every token is structural).
    Then the line IS canonical_bytes(record), and removing that `,"hash":"H"` pair gives
    canonical_bytes(record without hash): the bytes that were hashed.
    """
    if (
        len(line) > MAX_LINE
        or not line.startswith(b'{"data":{')
        or line.count(b"{") + line.count(b"[") > MAX_DEPTH
        or (not line.isascii() and _ASTRAL.search(line))
    ):
        return None
    i = line.rfind(_HASH_KEY)
    m = _SUFFIX.fullmatch(line, i) if i > 0 else None
    if m is None:
        return None
    try:
        text = line.decode("utf-8")
        obj = _FAST_DECODER.decode(text)
        if _encode_sorted(obj) != text:
            return None
    except (ValueError, RecursionError):
        return None
    log = m.group("log")
    if len(obj) != (6 if log is None else 7):
        return None
    h = m.group("hash")
    if hashlib.sha256(DOMAIN + line[:i] + line[m.end("hash") + 1 :]).hexdigest().encode() != h:
        return None
    return Record(
        seq=int(m.group("seq")),
        ts=m.group("ts").decode("ascii"),
        type=m.group("type").decode("ascii"),
        prev=m.group("prev").decode("ascii"),
        hash=h.decode("ascii"),
        data=obj["data"],
        log_id=log.decode("ascii") if log is not None else None,
    )


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
    canonical_bytes (the same argument as _fast_record): it parses back, with floats refused
    and integers range-checked, to a value equal to `data` (so every key was a string and every
    container a dict or list), encodes to UTF-8 (no lone surrogates), has no character beyond
    the BMP (json's key order is RFC 8785's) and at most MAX_DEPTH brackets. Otherwise the
    reference encoder decides, and raises CanonicalError for what it refuses.

    A flat record (`_flat`: most audit records are) needs no parsing back: its types are checked
    directly, and a copy of the dict is the parsed-back value (its values are immutable). The
    UTF-8 and BMP conditions are checked as above.
    """
    try:
        text = _encode_sorted(data)
        raw = text.encode("utf-8")
        if _flat(data) and (raw.isascii() or not _ASTRAL.search(raw)):
            return raw, dict(data)
        back = _FAST_DECODER.decode(text)
        if (
            back == data
            and raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH
            and (raw.isascii() or not _ASTRAL.search(raw))
        ):
            return raw, back
    except (ValueError, TypeError, RecursionError):
        pass
    raw = canonical_bytes(data)
    return raw, json.loads(raw)


def check_line(line: bytes) -> Record:
    """parse_line, with the fast path first (same result, see _fast_record)."""
    rec = _fast_record(line)
    return rec if rec is not None else parse_line(line)


def _record_from_obj(obj: Any) -> Record:
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
    if not isinstance(typ, str) or not _TYPE_RE.fullmatch(typ):
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
    return Record(seq=seq, ts=ts, type=typ, prev=prev, hash=h, data=data, log_id=log)


def iter_lines(path: Path) -> Iterator[tuple[int, bytes, bool]]:
    """Yield (offset, line without newline, complete) for each line of the file."""
    with open(path, "rb") as f:
        offset = 0
        for raw in f:
            complete = raw.endswith(b"\n")
            line = raw[:-1] if complete else raw
            yield offset, line, complete
            offset += len(raw)


def verify_file(
    path: Path,
    genesis: str | None = None,
    *,
    check_genesis: bool = True,
    anchors: Mapping[int, str] | None = None,
    collect: Callable[[Record], None] | None = None,
) -> VerifyReport:
    """Check a whole chain file: every hash, seq continuity from 0, prev linkage, the genesis,
    a log id on the first record only, non-decreasing timestamps.

    A missing file raises AuditError (the caller decides whether "no log yet" is fine). With
    `check_genesis=False` the first record's prev is taken as the head whatever it is (used when
    the genesis is established afterwards, e.g. from a session's profile anchor). `anchors`
    maps seq -> the hash that record must have (sealed checkpoints, admin-chain cross-anchors);
    `collect` is called with each valid record in order.
    """
    expected_genesis = genesis if genesis is not None else ZERO_HASH
    try:
        if collect is None and _PARALLEL_MIN_BYTES <= path.stat().st_size:
            fast = _verify_parallel(path, expected_genesis, check_genesis, anchors)
            if fast is not None:
                return fast
        return _verify(path, expected_genesis, check_genesis, anchors, collect)
    except FileNotFoundError:
        raise AuditError(f"no audit log at {path}", "nothing has been recorded there yet") from None
    except OSError as exc:
        raise AuditError(
            f"could not read the audit log {path}: {exc.strerror or exc}",
            "check the file's permissions",
        ) from None


def _in_flight(path: Path, offset: int) -> bool:
    """Was the unterminated line at `offset` an append still being written, not a crash?

    Verification reads without the lock, so it can catch an append mid-write. Waiting for a
    shared lock lets any writer finish (or a repair run); if the line at `offset` now ends
    with a newline, it was in flight, and is simply not part of what was verified.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        return b"\n" in os.pread(fd, MAX_LINE + 1, offset)
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock


class _Walk:
    """Sequential linkage checks over records, shared by the one-process and parallel verifiers."""

    def __init__(
        self,
        genesis: str,
        check_genesis: bool,
        anchors: Mapping[int, str] | None = None,
        start_seq: int = 0,
    ):
        self.anchors = anchors or {}
        self.genesis = genesis
        self.check_genesis = check_genesis
        self.head = genesis
        self.tail = genesis
        self.log_id: str | None = None
        self.last_ts = ""
        self.n = start_seq

    def missing_anchor(self) -> str | None:
        """After the last record: the reason if an anchor names a seq the log does not reach."""
        beyond = [seq for seq in self.anchors if seq >= self.n]
        if not beyond:
            return None
        last = f"seq {self.n - 1}" if self.n else "no record"
        return (
            f"the log ends at {last} but an anchor names seq {min(beyond)}: "
            "records were removed from the end (truncated) or the log was replaced"
        )

    def step(self, rec: Record) -> str | None:
        """Check `rec` as the next record; return the reason it is bad, or None."""
        n = self.n
        if rec.seq != n:
            return f"seq {rec.seq} where {n} was expected: a record was removed, inserted or moved"
        if n == 0:
            if rec.log_id is None:
                return "the first record carries no log id"
            if self.check_genesis and rec.prev != self.genesis:
                return (
                    f"the first record starts from {rec.prev[:12]}…, expected genesis "
                    f"{self.genesis[:12]}…: the log was replaced or belongs elsewhere"
                )
            self.log_id = rec.log_id
            self.head = rec.prev
            self.tail = rec.prev
        else:
            if rec.log_id is not None:
                return (
                    f"log id {rec.log_id} on a record other than the first: "
                    "records spliced in from another log"
                )
            if rec.prev != self.tail:
                return (
                    f"prev {rec.prev[:12]}… does not match the hash of seq {n - 1} "
                    f"({self.tail[:12]}…): a record was removed, inserted, reordered or spliced in"
                )
        if rec.ts < self.last_ts:
            return f"timestamp {rec.ts} is earlier than the record before it ({self.last_ts})"
        want = self.anchors.get(n)
        if want is not None and rec.hash != want:
            return (
                f"record seq {n} has hash {rec.hash[:12]}…, the anchor says {want[:12]}…: "
                "the log was rewritten up to here or replaced"
            )
        self.last_ts = rec.ts
        self.tail = rec.hash
        self.n = n + 1
        return None


def _verify(
    path: Path,
    genesis: str,
    check_genesis: bool,
    anchors: Mapping[int, str] | None = None,
    collect: Callable[[Record], None] | None = None,
) -> VerifyReport:
    """The reference verifier: one pass, one process, exact first failure."""
    w = _Walk(genesis, check_genesis, anchors)

    def report(ok: bool, reason: str | None, torn: tuple[int, int] | None = None) -> VerifyReport:
        return VerifyReport(
            ok=ok,
            events=w.n,
            head=w.head,
            tail=w.tail,
            first_bad_seq=None if ok else w.n,
            reason=reason,
            torn_tail=torn is not None,
            log_id=w.log_id,
            torn_offset=torn[0] if torn else None,
            torn_bytes=torn[1] if torn else 0,
            path=str(path),
        )

    torn: tuple[int, int] | None = None
    for offset, line, complete in iter_lines(path):
        if not complete:
            torn = (offset, len(line))
            break
        try:
            rec = check_line(line)
        except BadRecord as exc:
            return report(False, f"{exc} (line at byte {offset})")
        problem = w.step(rec)
        if problem is not None:
            return report(False, problem)
        if collect is not None:
            collect(rec)
    if torn is not None and _in_flight(path, torn[0]):
        torn = None
    problem = w.missing_anchor()
    if problem is not None:
        return report(False, problem, torn)
    if torn is not None:
        return report(True, torn_reason(*torn), torn)
    return report(True, None)


_PARALLEL_MIN_BYTES = 16 * 1024 * 1024
"""Logs at least this big are verified by one forked worker per CPU (each checks a byte range,
the parent checks the seams). Any doubt sends the whole file through the one-process
verifier, so the report (first bad seq, reason) is always the reference one."""
_READ_CHUNK = 8 * 1024 * 1024


def _range_lines(path: Path, start: int, end: int) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, line, complete) for the lines that start in [start, end)."""
    with open(path, "rb") as f:
        f.seek(start)
        pos = start
        rest = b""
        while pos < end:
            chunk = f.read(min(_READ_CHUNK, end - pos))
            if not chunk:
                break
            pos += len(chunk)
            buf = rest + chunk
            lines = buf.split(b"\n")
            rest = lines.pop()
            offset = pos - len(buf)
            for line in lines:
                yield offset, line, True
                offset += len(line) + 1
        if rest:
            yield end - len(rest), rest, False


def _check_range(
    path: Path,
    start: int,
    end: int,
    genesis: str,
    check_genesis: bool,
    anchors: Mapping[int, str] | None,
) -> dict[str, Any]:
    """Verify the records starting in [start, end) as far as possible without the rest."""
    w = _Walk(genesis, check_genesis, anchors)
    first: dict[str, Any] | None = None
    torn = None
    for offset, line, complete in _range_lines(path, start, end):
        if not complete:
            torn = [offset, len(line)]
            break
        try:
            rec = check_line(line)
        except BadRecord:
            return {"ok": False}
        if first is None:
            first = {"seq": rec.seq, "prev": rec.prev, "ts": rec.ts}
            if start > 0:
                # Prime the walk as if the record before this range had been seen; the parent
                # checks that seam against the previous range's last record.
                w.n, w.tail, w.last_ts = rec.seq, rec.prev, rec.ts
        if w.step(rec) is not None:
            return {"ok": False}
    return {
        "ok": True,
        "first": first,
        "n": w.n,
        "tail": w.tail,
        "ts": w.last_ts,
        "head": w.head,
        "log_id": w.log_id,
        "torn": torn,
    }


def _workers() -> int:
    """How many verify workers: the CPUs this process may run on (at most 16)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, 16))


def _split(path: Path, size: int, parts: int) -> list[int]:
    """Range starts: offset 0 and the first line start after each k*size/parts."""
    starts = [0]
    with open(path, "rb") as f:
        for k in range(1, parts):
            f.seek(k * size // parts)
            f.readline()  # skip to the next line start
            pos = f.tell()
            if starts[-1] < pos < size:
                starts.append(pos)
    return starts


def _verify_parallel(
    path: Path, genesis: str, check_genesis: bool, anchors: Mapping[int, str] | None
) -> VerifyReport | None:
    """Verify with one forked worker per CPU; None when anything is off (use the reference)."""
    size = path.stat().st_size
    starts = _split(path, size, _workers())
    if len(starts) < 2:
        return None
    bounds = list(zip(starts, [*starts[1:], size], strict=True))
    children: list[tuple[int, int]] = []
    results: list[dict[str, Any] | None] = []
    try:
        for a, b in bounds:
            rfd, wfd = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child (coverage does not see it)
                code = 1
                try:
                    os.close(rfd)
                    doc = _check_range(path, a, b, genesis, check_genesis, anchors)
                    with os.fdopen(wfd, "wb") as out:
                        out.write(json.dumps(doc).encode())
                    code = 0
                finally:
                    os._exit(code)
            os.close(wfd)
            children.append((pid, rfd))
        for pid, rfd in children:
            with os.fdopen(rfd, "rb") as inp:
                raw = inp.read()
            _, status = os.waitpid(pid, 0)
            results.append(json.loads(raw) if status == 0 and raw else None)
    except OSError:
        return None
    # Seams: each range must continue exactly where the previous one ended.
    total = 0
    prev_tail = prev_ts = ""
    done: list[dict[str, Any]] = []
    for k, res in enumerate(results):
        if res is None or not res["ok"] or res["first"] is None:
            return None
        done.append(res)
        first = res["first"]
        if k > 0 and (first["seq"] != total or first["prev"] != prev_tail or first["ts"] < prev_ts):
            return None
        if k < len(results) - 1 and res["torn"] is not None:
            return None
        total, prev_tail, prev_ts = res["n"], res["tail"], res["ts"]
    if anchors and max(anchors) >= total:
        return None
    head, log_id, torn = done[0]["head"], done[0]["log_id"], done[-1]["torn"]
    if torn is not None and _in_flight(path, torn[0]):
        torn = None
    return VerifyReport(
        ok=True,
        events=total,
        head=head,
        tail=prev_tail,
        first_bad_seq=None,
        reason=torn_reason(*torn) if torn else None,
        torn_tail=torn is not None,
        log_id=log_id,
        torn_offset=torn[0] if torn else None,
        torn_bytes=torn[1] if torn else 0,
        path=str(path),
    )


def read_records(path: Path) -> list[Record]:
    """All complete, individually valid records of a file (linkage not checked; see verify)."""
    out: list[Record] = []
    try:
        for offset, line, complete in iter_lines(path):
            if not complete:
                break
            try:
                out.append(check_line(line))
            except BadRecord as exc:
                raise AuditError(
                    f"audit log {path} has a damaged record at byte {offset}: {exc}", HINT_VERIFY
                ) from None
    except FileNotFoundError:
        raise AuditError(f"no audit log at {path}", "nothing has been recorded there yet") from None
    except OSError as exc:
        raise AuditError(f"could not read the audit log {path}: {exc.strerror or exc}") from None
    return out


class Chain:
    """One chain file. Cheap to create; every append opens, locks, writes and closes."""

    def __init__(self, path: Path, genesis: str | None = None):
        if genesis is not None and not _HEX64.fullmatch(genesis):
            raise AuditError(
                "the chain's genesis is not a sha256 hex digest",
                "pass the audit_hash of an applied profile revision",
            )
        self.path = Path(path)
        self.genesis = genesis if genesis is not None else ZERO_HASH

    def __repr__(self) -> str:
        return f"Chain({str(self.path)!r})"

    def append(self, type: str, data: Mapping[str, Any]) -> Record:
        """Record one event durably, or raise AuditError (then the action must not happen)."""
        if not _TYPE_RE.fullmatch(type):
            raise AuditError(
                f"could not record to the audit log: invalid event type {type!r}",
                "event types are dotted lower-case names such as profile.apply",
            )
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            try:
                fd = os.open(self.path, flags, FILE_MODE)
            except FileNotFoundError:
                ensure_dir(self.path.parent)  # first record of this log: dirs are 0700
                fd = os.open(self.path, flags, FILE_MODE)
        except OSError as exc:
            raise AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}", HINT_WRITE
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                raise AuditError(
                    f"could not record to the audit log {self.path}: lock failed: "
                    f"{exc.strerror or exc}",
                    HINT_WRITE,
                ) from None
            return self._append_locked(fd, type, data)
        finally:
            os.close(fd)  # closing releases the flock

    def _append_locked(self, fd: int, typ: str, data: Mapping[str, Any]) -> Record:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise AuditError(
                    f"could not record to the audit log {self.path}: not a regular file",
                    "move it away; linpodx creates the log itself",
                )
            if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
            size = st.st_size
            last, torn_at = _read_tail(fd, size)
        except AuditError:
            raise
        except OSError as exc:
            raise AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}", HINT_WRITE
            ) from None

        out: list[bytes] = []
        records: list[Record] = []
        if last is None:
            seq, prev, last_ts = 0, self.genesis, ""
        else:
            seq, prev, last_ts = last.seq + 1, last.hash, last.ts
        if torn_at is not None:
            removed = _pread_all(fd, torn_at, size - torn_at)
            repair = {
                "reason": "torn last line removed (crash during an earlier append)",
                "offset": torn_at,
                "removed_bytes": len(removed),
                "removed_sha256": hashlib.sha256(removed).hexdigest(),
            }
            rec, line = self._build(seq, prev, last_ts, "audit.repair", repair)
            out.append(line)
            records.append(rec)
            seq, prev, last_ts = rec.seq + 1, rec.hash, rec.ts
        rec, line = self._build(seq, prev, last_ts, typ, data)
        out.append(line)
        records.append(rec)
        payload = b"".join(out)

        base = torn_at if torn_at is not None else size
        try:
            if torn_at is not None:
                os.ftruncate(fd, torn_at)
            _write_all(fd, payload)
            os.fsync(fd)
        except OSError as exc:
            # Leave no partial line behind: the action is not going to happen, so no record of
            # it may remain either. (A torn tail we cut off stays cut: it was never a record.)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, base)
                os.fsync(fd)
            raise AuditError(
                f"could not record to the audit log {self.path}: {exc.strerror or exc}", HINT_WRITE
            ) from None
        if base == 0:
            with contextlib.suppress(OSError):
                fsync_dir(self.path.parent)
        return records[-1]

    def _build(
        self, seq: int, prev: str, last_ts: str, typ: str, data: Mapping[str, Any]
    ) -> tuple[Record, bytes]:
        # A clock stepping back must not make the chain look reordered: never go below the tail.
        ts = max(now_ts(), last_ts)
        log_id = new_id("log") if seq == 0 else None
        try:
            if not isinstance(data, Mapping):
                raise CanonicalError("event data must be an object")
            data_bytes, stored = encode_data(data)
        except (CanonicalError, RecursionError) as exc:
            raise AuditError(
                f"could not record to the audit log: the event data cannot be recorded: {exc}",
                "this is a bug in linpodx: event data must be canonical JSON (no floats)",
            ) from None
        head, after = encode_record(seq, ts, typ, prev, data_bytes, log_id)
        h = hashlib.sha256(DOMAIN + head + after).hexdigest()
        line = head + b',"hash":"' + h.encode("ascii") + b'"' + after
        if len(line) > MAX_LINE:
            raise AuditError(
                f"could not record to the audit log: record larger than {MAX_LINE} bytes",
                "this is a bug in linpodx: record a digest of large data instead",
            )
        rec = Record(
            seq=seq,
            ts=ts,
            type=typ,
            prev=prev,
            hash=h,
            data=stored,
            log_id=log_id,
        )
        return rec, line + b"\n"

    def verify(self) -> VerifyReport:
        """Verify this chain against its genesis."""
        return verify_file(self.path, self.genesis)

    def last(self) -> Record | None:
        """The last complete record (no lock: a snapshot), None for an empty or missing log."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise AuditError(f"could not read the audit log {self.path}: {exc.strerror}") from None
        try:
            last, _ = _read_tail(fd, os.fstat(fd).st_size)
            return last
        finally:
            os.close(fd)


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    parts = []
    while length > 0:
        chunk = os.pread(fd, min(length, 1 << 20), offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # pragma: no cover - write(2) reports errors by raising
            raise OSError(28, "short write")
        view = view[n:]


def _read_tail(fd: int, size: int) -> tuple[Record | None, int | None]:
    """The last complete record and, if the file ends in a torn line, where that line starts.

    Reads backwards from the end in chunks; never more than the last line plus one chunk.
    """
    if size == 0:
        return None, None
    buf = b""
    pos = size
    # Find the end of the last complete line (the last newline) and the line before it.
    end_nl: int | None = None  # offset of the newline ending the last complete line
    while pos > 0:
        step = min(_TAIL_CHUNK, pos)
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
        if size - pos > 2 * MAX_LINE + 2 * _TAIL_CHUNK:
            raise AuditError(
                "the audit log's last line is longer than any record we write", HINT_VERIFY
            )
    torn_at: int | None
    if end_nl is None:
        # No newline at all: the whole file is one torn line (the very first append crashed).
        return None, 0
    torn_at = end_nl + 1 if end_nl + 1 < size else None
    try:
        rec = check_line(line)
    except BadRecord as exc:
        raise AuditError(
            f"the audit log's last record is damaged ({exc}); refusing to chain onto it",
            HINT_VERIFY,
        ) from None
    return rec, torn_at


def admin_chain() -> Chain:
    """The chain of administrative actions (profile.apply, container.run, …)."""
    return Chain(audit_dir() / "admin.jsonl")


def session_path(session_id: str) -> Path:
    """Where a session's chain lives. Refuses ids that could name another path."""
    if not _SESSION_RE.fullmatch(session_id) or session_id in {".", ".."}:
        raise AuditError(
            f"invalid session id {session_id!r}",
            "session ids look like sess_01J…; see `linpodx audit show`",
        )
    return sessions_audit_dir() / f"{session_id}.jsonl"


def session_chain(session_id: str, genesis: str) -> Chain:
    """The chain of one MCP session; its first prev is the profile revision's audit_hash."""
    return Chain(session_path(session_id), genesis)


def open_session(
    session_id: str, profile_id: str, audit_hash: str, data: Mapping[str, Any] | None = None
) -> tuple[Chain, Record]:
    """Start a session chain and anchor it in the admin chain.

    The session's first record (`session.start`) starts from the profile revision's audit_hash
    and names `profile_id`/`audit_hash` in its data, so verification can find the anchor; the
    admin chain then gets `session.open` with the session's head and first hash. Rewriting
    either log alone then no longer matches the other.
    """
    chain = session_chain(session_id, audit_hash)
    first = chain.append(
        "session.start",
        {
            **(data or {}),
            "session_id": session_id,
            "profile_id": profile_id,
            "audit_hash": audit_hash,
        },
    )
    admin_chain().append(
        "session.open",
        {
            "session_id": session_id,
            "profile_id": profile_id,
            "head": audit_hash,
            "first": first.hash,
        },
    )
    return chain, first


def anchor_session(session_id: str, tail_hash: str, events: int) -> Record:
    """Record a session's end in the admin chain with its tail hash and record count.

    After this, truncating or rewriting the session log is detected by `verify --session`.
    """
    if not _HEX64.fullmatch(tail_hash):
        raise AuditError(
            "could not record to the audit log: the session tail is not a sha256 hex digest"
        )
    session_path(session_id)  # validates the id
    return admin_chain().append(
        "session.close", {"session_id": session_id, "tail": tail_hash, "events": events}
    )
