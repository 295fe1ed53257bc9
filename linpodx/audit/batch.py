"""The verifier's batched parse: `fast_batch` is `[core.fast_fields(line) for line in lines]`
at less cost per line, `chain_batch` the same for a batch of records that follow each other,
checked a column at a time. Only `audit verify` reads this many lines at once; the writers
(and the fast run path) need `core` alone. tests/unit/test_audit_codec.py holds both to the
strict parser.
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Any

from linpodx.audit.core import (
    _BRACKETS,
    _CUT,
    _HASH_KEY,
    _HEX_DIGITS,
    _RECORD_START,
    _TS_RE,
    ASTRAL,
    DOMAIN,
    MAX_LINE,
    TYPE_RE,
    Fields,
    _checked,
    _scan,
    encode_sorted,
    fast_fields,
    real_day,
)
from linpodx.canonical import MAX_DEPTH
from linpodx.digest import sha256_maker


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
