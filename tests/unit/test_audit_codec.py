"""The audit codec's fast stage against its oracle, the strict reference parser, on fuzzed lines.

`core.fast_fields` may say "unsure" (None) for anything, but when it returns fields they must
be exactly what `core.parse_strict` returns for the same line; and whatever `core.parse` says
(fields, or BadRecord with a reason) is the strict parser's verdict. The lines are generated and
mutated by a seeded generator (hand-written: no property-testing dependency), so a failure is
reproducible from the seed printed with it.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from linpodx.audit import batch as audit_batch
from linpodx.audit import core, walk
from linpodx.audit.core import DOMAIN, ZERO_HASH, BadRecord
from linpodx.canonical import SAFE_INT, CanonicalError, canonical_bytes
from linpodx.digest import sha256
from linpodx.errors import AuditError

_CHARS = [
    "a", "z", "k", "0", " ", '"', "\\", "/", "\x00", "\x01", "\x1f", "\x7f", "é", "ü", "\u2028",
    "\uffff", "\ufeff", "\U0001f600", "{", "}", "[", "]", ",", ":", "hash", '"hash":"',
]  # fmt: skip
_INTS = [0, 1, -1, 7, 10**15, SAFE_INT, -SAFE_INT, SAFE_INT + 1, -(SAFE_INT + 1)]
_TOKENS = [
    b"1.0", b"-0", b"1e3", b"NaN", b"Infinity", b"true", b"null", b" ", b"\\u0076", b"\\ud800",
    b"\\udc00\\ud800", b"\xff", b"\xed\xa0\x80", b"\xf0\x9f\x98\x80", b'"', b"\\", b",", b":",
    b"{", b"}", b"[", b"]", b'"k":1,', b'"log":null,', b'"seq":01,', b"02-30",
]  # fmt: skip


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_CHARS) for _ in range(rng.randrange(0, 6)))


def _value(rng: random.Random, depth: int) -> Any:
    pick = rng.randrange(9 if depth < 4 else 5)
    if pick == 0:
        return _text(rng)
    if pick == 1:
        return rng.choice(_INTS)
    if pick == 2:
        return rng.choice([True, False, None])
    if pick == 3:
        return rng.randrange(-1000, 1000)
    if pick == 4:
        return _text(rng) + "x"
    if pick in (5, 6):
        return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]


def _record(rng: random.Random) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "seq": rng.choice([0, 1, 41, SAFE_INT]),
        # Days 29-31 with and without a month that has them (02-29 in a leap year or not).
        "ts": rng.choice(
            ["2026-01-01T00:00:00.000000Z", "2028-02-29T23:59:59.999999Z",
             "2027-02-29T23:59:59.999999Z", "2026-04-30T12:00:00.500000Z",
             "2026-04-31T12:00:00.500000Z", "2026-12-31T00:00:00.000001Z"]
        ),
        "type": rng.choice(["a.b", "mcp.request", "audit.repair", "x.y_z.w9"]),
        "prev": rng.choice([ZERO_HASH, "ab" * 32]),
        "data": {_text(rng): _value(rng, 1) for _ in range(rng.randrange(0, 5))},
    }
    if rng.random() < 0.5:
        rec["log"] = "log_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    return rec


def _forge(rec: dict[str, Any]) -> bytes | None:
    """The stored line of `rec` with a correct hash, or None if it has no canonical form."""
    try:
        body = canonical_bytes(rec)
    except (CanonicalError, RecursionError):
        return None
    h = sha256(DOMAIN + body).hexdigest()
    return canonical_bytes({**rec, "hash": h})


def _rehash(line: bytes) -> bytes:
    """`line` with its hash field set to the hash of the rest of the line as it stands: an
    attacker's edit that keeps the hash right, leaving only form and structure to catch."""
    i = line.rfind(b',"hash":"')
    if i < 0 or len(line) < i + 9 + 65:
        return line
    rest = line[:i] + line[i + 9 + 65 :]
    h = sha256(DOMAIN + rest).hexdigest().encode()
    return line[: i + 9] + h + line[i + 9 + 64 :]


def _mutate(rng: random.Random, line: bytes) -> bytes:
    out = bytearray(line)
    for _ in range(rng.randrange(1, 3)):
        at = rng.randrange(len(out) + 1)
        kind = rng.randrange(6)
        i = bytes(out).rfind(b',"hash":"')
        if kind == 5 and i > 0:
            # A top-level member between data and hash (in key order): an extra key, or a
            # second `data`, that only the member count or the strict key check can catch.
            member = rng.choice([b',"e":1', b',"data":{}', b',"f":"x"', b',"dat":[]'])
            out[i:i] = member
        elif kind == 0 and at < len(out):
            out[at] = rng.randrange(256)
        elif kind == 1 and at < len(out):
            del out[at : at + rng.randrange(1, 4)]
        elif kind == 2:
            out[at:at] = rng.choice(_TOKENS)
        elif kind == 3 and at < len(out):
            out[at : at + rng.randrange(1, 6)] = rng.choice(_TOKENS)
        else:
            # Swap two members' text (breaks key order, or moves a field into data).
            j = rng.randrange(len(out) + 1)
            a, b = sorted((at, j))
            out[a:b] = bytes(out[a:b])[::-1] if rng.random() < 0.2 else out[a:b]
    mutated = bytes(out)
    return _rehash(mutated) if rng.random() < 0.7 else mutated


def _typed(value: Any) -> Any:
    """`value` with its types spelled out (True == 1 in Python, not in a record)."""
    if isinstance(value, dict):
        return ("dict", sorted((k, _typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    return (type(value).__name__, value)


def _strict(line: bytes) -> tuple[Any, str | None]:
    try:
        return core.parse_strict(line), None
    except BadRecord as exc:
        return None, str(exc)


def _agree(line: bytes) -> tuple[bool, bool]:
    """Assert fast == strict on `line`; (fast stage answered, strict parser accepted)."""
    fast = core.fast_fields(line)
    strict, why = _strict(line)
    if fast is not None:
        assert strict is not None, (line, why)
        assert fast[:5] + fast[6:] == strict[:5] + strict[6:], line
        assert _typed(fast[5]) == _typed(strict[5]), line
    try:
        got = core.parse(line)
    except BadRecord as exc:
        assert str(exc) == why, line
    else:
        assert strict is not None and _typed(got) == _typed(strict), line
    return fast is not None, strict is not None


@pytest.mark.parametrize("seed", range(8))
def test_fast_stage_agrees_with_the_strict_parser_on_fuzzed_lines(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible fuzz, not a secret
    answered = accepted = refused = 0
    for _ in range(300):
        line = _forge(_record(rng))
        if line is None:
            continue
        fast, ok = _agree(line)
        answered += fast
        accepted += ok
        for _ in range(3):
            fast, ok = _agree(_mutate(rng, line))
            answered += fast
            refused += not ok
    # Agreement must not be the trivial kind: the fast stage answers for most well-formed lines
    # and the strict parser refuses many mutated ones.
    assert answered > accepted // 2, (seed, answered, accepted)
    assert refused > 200, (seed, refused)


@pytest.mark.parametrize("seed", range(4))
def test_what_the_writer_builds_takes_the_fast_stage(seed: int) -> None:
    """Every line `build_line` writes parses (strictly) to what it was built from, and the fast
    stage answers for it unless it holds a character beyond the BMP or nests deeply."""
    rng = random.Random(100 + seed)  # noqa: S311 - a reproducible fuzz, not a secret
    for seq in range(300):
        data = {_text(rng): _value(rng, 1) for _ in range(rng.randrange(0, 5))}
        try:
            log_id = None if seq else "log_01ARZ3NDEKTSV4RRFFQ69G5FAV"
            h, ts, line, stored = core.build_line(seq, ZERO_HASH, "", "a.b", data, log_id)
        except AuditError:
            continue  # no canonical form (an integer out of range): refused, never written
        strict = core.parse_strict(line[:-1])
        assert strict[:5] == (seq, ts, "a.b", ZERO_HASH, h)
        assert _typed(strict[5]) == _typed(stored)
        fast = core.fast_fields(line[:-1])
        if not core.ASTRAL.search(line):
            assert fast is not None, line
            assert _typed(fast[5]) == _typed(stored)


def _chain(rng: random.Random, n: int) -> list[bytes]:
    """n linked lines as the writer writes them (seq 0 with its log id)."""
    lines, prev, ts = [], ZERO_HASH, ""
    for seq in range(n):
        data = {_text(rng): rng.choice([1, "x", None]) for _ in range(rng.randrange(0, 3))}
        h, ts, line, _ = core.build_line(
            seq, prev, ts, rng.choice(["a.b", "mcp.request"]), data,
            "log_01ARZ3NDEKTSV4RRFFQ69G5FAV" if seq == 0 else None,
        )  # fmt: skip
        lines.append(line[:-1])
        prev = h
    return lines


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_gives_each_line_what_the_fast_stage_gives_it_alone(seed: int) -> None:
    """`batch.fast_batch` (the verifier's: one json stage for many lines, checks shared with
    the lines before) answers for each line exactly what `fast_fields` answers for it alone,
    on batches mixing well-formed, mutated and linked lines."""
    rng = random.Random(200 + seed)  # noqa: S311 - a reproducible fuzz, not a secret
    chain = _chain(rng, 40)
    pool = list(chain)
    for _ in range(150):
        line = _forge(_record(rng))
        if line is not None:
            pool += [line, _mutate(rng, line)]
    answered = 0
    for _ in range(300):
        if rng.random() < 0.5:  # a run of the chain, one of its lines mutated at times
            at = rng.randrange(len(chain))
            batch = chain[at : at + rng.randrange(1, 16)]
            if rng.random() < 0.5:
                k = rng.randrange(len(batch))
                batch[k] = _mutate(rng, batch[k])
        else:
            batch = [rng.choice(pool) for _ in range(rng.randrange(1, 12))]
        got = audit_batch.fast_batch(batch)
        assert len(got) == len(batch)
        for line, fast in zip(batch, got, strict=True):
            alone = core.fast_fields(line)
            assert (fast is None) == (alone is None), line
            if fast is not None and alone is not None:
                answered += 1
                assert fast[:5] + fast[6:] == alone[:5] + alone[6:], line
                assert _typed(fast[5]) == _typed(alone[5]), line
            _agree(line)
    assert answered > 1000, (seed, answered)


def test_a_batch_keeps_each_line_to_itself() -> None:
    """Lines that join into one valid record (split at a comma between a nested `{"data":{`
    and what comes before it) are not taken for it: each line must be a record on its own."""
    data = {"k": [1, {"data": {}}]}
    _h, _ts, whole, _ = core.build_line(3, ZERO_HASH, "", "a.b", data, None)
    assert audit_batch.fast_batch([whole[:-1]])[0] is not None
    cut = whole.index(b',{"data":{}}')
    parts = [whole[:cut], whole[cut + 1 : -1]]
    assert parts[1].startswith(b'{"data":{')
    assert audit_batch.fast_batch(parts) == [None, None]
    assert [_strict(p)[0] for p in parts] == [None, None]


_TIMES = [
    "2026-01-01T00:00:00.000000Z", "2026-01-01T00:00:00.000001Z", "2026-02-28T10:00:00.000000Z",
    "2028-02-29T23:59:59.999999Z", "2028-04-30T12:00:00.500000Z", "2028-12-31T00:00:00.000001Z",
]  # fmt: skip
_NO_DAY = ["2027-02-29T23:59:59.999999Z", "2028-04-31T12:00:00.500000Z"]  # days months lack


def _linked(rng: random.Random, n: int) -> list[tuple[bytes, str, str]]:
    """n forged records linked as a chain (seq 0 with its log id), at times that only go up,
    with varied types and data, now and then one that is not a record the walk takes (a day
    its month lacks, a second log id, seq `true`): (line, hash, ts)."""
    out, prev, at = [], ZERO_HASH, 0
    while len(out) < n:
        at = min(len(_TIMES) - 1, at + (rng.random() < 0.05))
        seq = len(out)
        odd = rng.random() < 0.03
        rec: dict[str, Any] = {
            "seq": True if odd and seq == 1 else seq,
            "ts": rng.choice(_NO_DAY) if odd and rng.random() < 0.5 else _TIMES[at],
            "type": rng.choice(["a.b", "mcp.request", "audit.repair"]),
            "prev": prev,
            "data": {_text(rng): _value(rng, 1) for _ in range(rng.randrange(0, 3))},
        }
        if seq == 0 or (odd and rng.random() < 0.5):
            rec["log"] = "log_01ARZ3NDEKTSV4RRFFQ69G5FAV"
        line = _forge(rec)
        if line is None:
            continue
        prev = sha256(DOMAIN + canonical_bytes(rec)).hexdigest()
        out.append((line, prev, rec["ts"]))
    return out


def _walked(batch: list[bytes], seq: int, tail: str, ts: str) -> list[Any] | None:
    """What the verifier's line-by-line path makes of `batch` after a record (seq - 1, hash
    `tail`, `ts`): the fields of every line if each passes `fast_batch` and the walk's step,
    else None."""
    w = walk._Walk(ZERO_HASH, True)
    w.n, w.tail, w.last_ts = seq, tail, ts
    out = []
    for rec in audit_batch.fast_batch(batch):
        if rec is None or w.step(rec) is not None:
            return None
        out.append(rec)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_chained_batch_is_what_the_walk_makes_of_it_line_by_line(seed: int) -> None:
    """`batch.chain_batch` (the verifier's common case: a whole batch of records that follow
    each other, checked a column at a time) accepts a batch only with exactly the fields the
    line-by-line path (`fast_batch`, then `_Walk.step`) gives, and only when that path passes
    every line; on batches of a chain cut anywhere, started from the right or a wrong record,
    with lines mutated, swapped or dropped."""
    rng = random.Random(300 + seed)  # noqa: S311 - a reproducible fuzz, not a secret
    chain = _linked(rng, 120)
    answered = refused = unsure = 0
    for _ in range(600):
        at = rng.randrange(1, len(chain))
        batch = [line for line, _, _ in chain[at : at + rng.randrange(1, 12)]]
        seq, tail, ts = at, chain[at - 1][1], chain[at - 1][2]
        kind = rng.randrange(12)  # 6 and up: as cut from the chain
        if kind == 0:
            k = rng.randrange(len(batch))
            batch[k] = _mutate(rng, batch[k])
        elif kind == 1 and len(batch) > 1:
            i, j = sorted(rng.sample(range(len(batch)), 2))
            batch[i], batch[j] = batch[j], batch[i]
        elif kind == 2 and len(batch) > 1:
            del batch[rng.randrange(len(batch))]
        elif kind == 3:
            seq += rng.choice([-1, 1])
        elif kind == 4:
            tail = rng.choice([ZERO_HASH, "ab" * 32, "AB" * 32, chain[at][1]])
        elif kind == 5:
            ts = rng.choice(_TIMES + _NO_DAY)
        want = _walked(batch, seq, tail, ts) if seq >= 1 else None
        got = audit_batch.chain_batch(batch, seq, tail, ts)
        if got is None:
            refused += want is None
            unsure += want is not None
            continue
        assert want is not None, (seed, batch, seq, tail, ts)
        assert [r[:5] + r[6:] for r in got] == [r[:5] + r[6:] for r in want]
        assert [_typed(r[5]) for r in got] == [_typed(r[5]) for r in want]
        assert all(type(r[0]) is int for r in got)
        answered += 1
    # Not the trivial kind of agreement: it answers for many batches and refuses many.
    assert answered > 100 and refused > 100, (seed, answered, refused, unsure)


def test_a_chained_batch_takes_no_seq_that_only_equals_its_number() -> None:
    """`true` == 1 in Python: a record whose seq is `true` where 1 is due is refused by the
    column checks as by the line-by-line path, however well it is linked and hashed."""
    first = {"seq": 0, "ts": _TIMES[0], "type": "a.b", "prev": ZERO_HASH, "data": {}}
    first["log"] = "log_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    tail = sha256(DOMAIN + canonical_bytes(first)).hexdigest()
    rec = {"seq": True, "ts": _TIMES[0], "type": "a.b", "prev": tail, "data": {}}
    line = _forge(rec)
    assert line is not None and b'"seq":true' in line
    assert _walked([line], 1, tail, _TIMES[0]) is None
    assert audit_batch.chain_batch([line], 1, tail, _TIMES[0]) is None
    rec["seq"] = 1
    good = _forge(rec)
    assert good is not None and audit_batch.chain_batch([good], 1, tail, _TIMES[0]) is not None


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_the_fast_stage_bounds_nesting_whatever_the_data_holds() -> None:
    """The fast stage skips counting brackets only for data of scalars (then the record nests
    two deep); a record nested one level deeper than MAX_DEPTH, in its data or in another
    field, is left to the strict parser, which refuses it."""
    base = {"seq": 1, "ts": _TIMES[0], "type": "a.b", "prev": ZERO_HASH}
    at_bound = _forge({**base, "data": {"k": _nested(core.MAX_DEPTH - 2)}})
    assert at_bound is not None and core.fast_fields(at_bound) is not None
    for rec in (
        {**base, "data": {"k": _nested(core.MAX_DEPTH - 1)}},
        {**base, "data": {"k": 1}, "type": _nested(core.MAX_DEPTH)},
    ):
        line = _forge(rec)
        assert line is not None
        assert core.fast_fields(line) is None
        assert _strict(line)[0] is None
