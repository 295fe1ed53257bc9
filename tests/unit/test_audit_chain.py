"""The audit chain library: record format, hashing, appends, strict parsing, the fast path."""

from __future__ import annotations

import enum
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from linpodx.audit import chain as ch
from linpodx.audit import core, record, walk
from linpodx.audit.chain import (
    DOMAIN,
    ZERO_HASH,
    BadRecord,
    Chain,
    admin_chain,
    check_line,
    parse_line,
    session_chain,
    verify_file,
)
from linpodx.canonical import canonical_bytes
from linpodx.errors import AuditError
from linpodx.paths import audit_dir, sessions_audit_dir


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def test_append_builds_a_linked_chain(tmp_path: Path) -> None:
    c = Chain(tmp_path / "logs" / "a.jsonl")
    r0 = c.append("profile.apply", {"name": "demo", "n": 1})
    r1 = c.append("profile.rm", {"name": "demo"})
    r2 = c.append("container.run", {"name": "box", "argv": ["a", "b"], "ok": True, "x": None})
    assert (r0.seq, r1.seq, r2.seq) == (0, 1, 2)
    assert r0.prev == ZERO_HASH
    assert r1.prev == r0.hash and r2.prev == r1.hash
    assert r0.log_id is not None and r0.log_id.startswith("log_")
    assert r1.log_id is None and r2.log_id is None
    assert r0.ts <= r1.ts <= r2.ts
    stored = [json.loads(line) for line in lines_of(c.path)]
    assert [s["seq"] for s in stored] == [0, 1, 2]
    assert "log" in stored[0] and "log" not in stored[1] and "log" not in stored[2]
    assert stored[2]["data"] == {"name": "box", "argv": ["a", "b"], "ok": True, "x": None}
    report = verify_file(c.path)
    assert report.ok and report.events == 3 and report.tail == r2.hash
    assert report.head == ZERO_HASH and report.log_id == r0.log_id and not report.torn_tail


def test_hash_is_domain_separated_sha256_of_canonical_record(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    c.append("a.first", {"k": "v"})
    c.append("a.second", {"é": "ü\u2028", "nested": {"b": [1, 2], "a": "\x00"}})
    for line in lines_of(c.path):
        obj = json.loads(line)
        body = {k: v for k, v in obj.items() if k != "hash"}
        assert obj["hash"] == hashlib.sha256(DOMAIN + canonical_bytes(body)).hexdigest()
        # The stored line is exactly the canonical encoding of the whole record.
        assert line == canonical_bytes(obj)


def test_encode_record_equals_canonical_bytes() -> None:
    data = {"z": 1, "a": ["x", {"q": None}], "é": '\u2028\n"\\'}
    for log in (None, "log_01ARZ3NDEKTSV4RRFFQ69G5FAV"):
        head, after = core.encode_record(
            7, "2026-01-01T00:00:00.000001Z", "a.b", "f" * 64, canonical_bytes(data), log
        )
        rec: dict[str, object] = {
            "seq": 7,
            "ts": "2026-01-01T00:00:00.000001Z",
            "type": "a.b",
            "prev": "f" * 64,
            "data": data,
        }
        if log:
            rec["log"] = log
        assert head + after == canonical_bytes(rec)
        assert head + b',"hash":"' + b"0" * 64 + b'"' + after == canonical_bytes(
            {**rec, "hash": "0" * 64}
        )


def test_genesis_is_the_first_prev(tmp_path: Path) -> None:
    g = hashlib.sha256(b"profile").hexdigest()
    c = Chain(tmp_path / "s.jsonl", genesis=g)
    r = c.append("session.start", {})
    assert r.prev == g
    assert verify_file(c.path, g).ok
    bad = verify_file(c.path)  # against the default all-zero genesis
    assert not bad.ok and bad.first_bad_seq == 0 and "expected genesis" in (bad.reason or "")


def test_invalid_genesis_refused(tmp_path: Path) -> None:
    with pytest.raises(AuditError):
        Chain(tmp_path / "s.jsonl", genesis="not-a-hash")


def test_modes_and_paths() -> None:
    a = admin_chain()
    assert a.path == audit_dir() / "admin.jsonl"
    a.append("profile.apply", {})
    s = session_chain("sess_01ARZ3NDEKTSV4RRFFQ69G5FAV", "a" * 64)
    assert s.path == sessions_audit_dir() / "sess_01ARZ3NDEKTSV4RRFFQ69G5FAV.jsonl"
    s.append("session.start", {})
    for f in (a.path, s.path):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    for d in (audit_dir(), sessions_audit_dir()):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


@pytest.mark.parametrize("bad_id", ["../x", "a/b", "", ".", "..", "x" * 200, "sess\n"])
def test_session_id_cannot_name_another_path(bad_id: str) -> None:
    with pytest.raises(AuditError):
        session_chain(bad_id, "a" * 64)


@pytest.mark.parametrize(
    "data",
    [
        {"f": 1.5},
        {"nan": float("nan")},
        {"big": 2**60},
        {"s": "\ud800"},
        {1: "non-string key"},
        {"b": b"bytes"},
    ],
)
def test_unrecordable_data_raises_and_leaves_file_alone(tmp_path: Path, data: object) -> None:
    c = Chain(tmp_path / "a.jsonl")
    c.append("a.ok", {"x": 1})
    before = c.path.read_bytes()
    with pytest.raises(AuditError, match="could not record to the audit log"):
        c.append("a.bad", data)  # type: ignore[arg-type]
    assert c.path.read_bytes() == before
    assert verify_file(c.path).ok


@pytest.mark.parametrize("typ", ["", "nodot", "Upper.case", "a..b", "a.b\n", "a.b c"])
def test_invalid_event_type_refused(tmp_path: Path, typ: str) -> None:
    c = Chain(tmp_path / "a.jsonl")
    with pytest.raises(AuditError):
        c.append(typ, {})
    assert not c.path.exists()


def test_symlinked_log_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"")
    (tmp_path / "a.jsonl").symlink_to(target)
    with pytest.raises(AuditError, match="could not record"):
        Chain(tmp_path / "a.jsonl").append("a.b", {})
    assert target.read_bytes() == b""


def test_append_onto_damaged_last_record_refused(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    c.append("a.b", {"x": 1})
    c.append("a.b", {"x": 2})
    raw = c.path.read_bytes().replace(b'"x":2', b'"x":3')
    c.path.write_bytes(raw)
    with pytest.raises(AuditError, match="last record is damaged"):
        c.append("a.b", {"x": 4})
    assert c.path.read_bytes() == raw


def test_existing_log_mode_tightened(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    c.append("a.b", {})
    c.path.chmod(0o644)
    c.append("a.b", {})
    assert stat.S_IMODE(c.path.stat().st_mode) == 0o600


def test_clock_going_back_keeps_timestamps_monotonic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Chain(tmp_path / "a.jsonl")
    monkeypatch.setattr(core, "now_ts", lambda: "2030-01-01T00:00:00.000000Z")
    c.append("a.b", {})
    monkeypatch.setattr(core, "now_ts", lambda: "2020-01-01T00:00:00.000000Z")
    r = c.append("a.b", {})
    assert r.ts == "2030-01-01T00:00:00.000000Z"
    assert verify_file(c.path).ok


def test_tail_read_handles_records_longer_than_a_chunk(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    big = "x" * (3 * core.TAIL_CHUNK + 17)
    c.append("a.b", {"big": big})
    c.append("a.b", {"big": big})
    r = c.append("a.b", {"small": 1})
    assert r.seq == 2
    assert verify_file(c.path).ok


def test_oversized_record_refused(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    with pytest.raises(AuditError, match="larger than"):
        c.append("a.b", {"big": "x" * (ch.MAX_LINE + 1)})
    assert not c.path.exists() or c.path.read_bytes() == b""


# --- strict parsing and the fast path -------------------------------------------------------


def _forge(obj: dict[str, object]) -> bytes:
    """An attacker's record: canonical, with a correct hash over its body."""
    body = {k: v for k, v in obj.items() if k != "hash"}
    h = hashlib.sha256(DOMAIN + canonical_bytes(body)).hexdigest()
    return canonical_bytes({**body, "hash": h})


def _base(**over: object) -> dict[str, object]:
    rec: dict[str, object] = {
        "seq": 0,
        "ts": "2026-01-01T00:00:00.000000Z",
        "type": "a.b",
        "prev": ZERO_HASH,
        "data": {"k": "v"},
        "log": "log_01ARZ3NDEKTSV4RRFFQ69G5FAV",
    }
    rec.update(over)
    return rec


def _good_lines() -> list[bytes]:
    return [
        _forge(_base()),
        _forge(_base(data={"é": "ü", "ctl": "\x01\x1f\u2028", "q": '"\\'})),
        _forge(_base(data={"astral": "\U0001f600", "\U0001f600": 1, "\uffff": 2})),
        _forge(_base(data={"n": 2**53 - 1, "m": -(2**53 - 1), "z": 0, "l": [[], {}]})),
        _forge(_base(data={"deep": [[[[[[1]]]]]]})),
        _forge(_base(data={"s": '@HASH@,"hash":"' + "a" * 64 + '"'})),
        _forge(_base(data={"inner": {"hash": "b" * 64, "a": 1}})),
    ]


def _bad_lines() -> list[tuple[bytes, str]]:
    good = _forge(_base())
    rec = json.loads(good)
    return [
        (good.replace(b'"k":"v"', b'"k":"v","k":"v"'), "duplicate key"),
        (_forge(_base(data={})).replace(b'"data":{}', b'"data":{"f":1.5}'), "floating"),
        (good.replace(b'"v"', b'"\\ud800"'), "surrogate"),
        (good.replace(b'"v"', b'"\xff"'), "UTF-8"),
        (good.replace(b'"k":"v"', b'"k": "v"'), "canonical"),
        (good.replace(b'"k":"v"', b'"k":"\\u0076"'), "canonical"),
        (good.replace(b'"v"', b"NaN"), "NaN"),
        (good.replace(b'"k":"v"', b'"k":12345678901234567'), "integer"),
        (good.replace(b'"k":"v"', b'"k":-0'), "canonical"),
        (good.replace(b'"k":"v"', b'"k":"w"'), "hash mismatch"),
        (good + b" ", "canonical"),
        (b"[" + good + b"]", "not a JSON object"),
        (_forge({**_base(), "extra": 1}), "unknown keys"),
        (_forge({**_base(), "zz": 1}), "unknown keys"),
        (_forge({**_base(), "a": 1}), "unknown keys"),
        (_forge({k: v for k, v in _base().items() if k != "ts"}), "missing keys"),
        (_forge(_base(seq=-1)), "seq"),
        (_forge(_base(seq=True)), "seq"),
        (_forge(_base(ts="yesterday")), "ts"),
        (_forge(_base(type="NotDotted")), "type"),
        (_forge(_base(prev="A" * 64)), "prev"),
        (_forge(_base(log="evil")), "log"),
        (_forge(_base(data=[1])), "data is not an object"),
        (_forge(_base(data={"d": "[" * 70 + "x"})), ""),  # a deep-looking string is fine...
        (json.dumps(rec).encode(), "canonical"),
        (good.replace(b'"k":"v"', b'"k":' + b"[" * 70 + b"1" + b"]" * 70), "nesting"),
    ]


@pytest.mark.parametrize("line", _good_lines())
def test_fast_path_agrees_with_reference_on_good_lines(line: bytes) -> None:
    assert check_line(line) == parse_line(line)


@pytest.mark.parametrize(("line", "why"), _bad_lines())
def test_fast_path_agrees_with_reference_on_bad_lines(line: bytes, why: str) -> None:
    if why == "":
        # the control case: brackets inside a string are not nesting
        assert check_line(line) == parse_line(line)
        return
    assert record._fast_record(line) is None
    with pytest.raises(BadRecord) as ref:
        parse_line(line)
    with pytest.raises(BadRecord) as fast:
        check_line(line)
    assert str(ref.value) == str(fast.value)
    assert why.lower() in str(ref.value).lower()


def test_fast_path_is_taken_for_what_we_write(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    c.append("a.b", {"k": "v", "n": [1, 2, {"x": None}], "é": "\u2028"})
    c.append("a.b", {})
    for line in lines_of(c.path):
        assert record._fast_record(line) is not None


def test_verify_missing_file_is_an_audit_error(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="no audit log"):
        verify_file(tmp_path / "nope.jsonl")


def test_empty_file_verifies_with_no_events(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"")
    r = verify_file(p)
    assert r.ok and r.events == 0 and r.tail == ZERO_HASH


def test_last_returns_tail_record(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    assert c.last() is None
    c.append("a.b", {})
    r = c.append("a.c", {"x": 1})
    assert c.last() == r
    os.truncate(c.path, c.path.stat().st_size - 5)
    last = c.last()
    assert last is not None and last.seq == 0


@pytest.mark.parametrize("workers", [2, 3, 7])
def test_parallel_verify_matches_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    monkeypatch.setattr(walk, "_PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(walk, "_workers", lambda: workers)
    c = Chain(tmp_path / "a.jsonl")
    recs = [c.append("a.b", {"i": i, "pad": "p" * (i * 37 % 300)}) for i in range(40)]
    ref = walk._verify(c.path, ZERO_HASH, True)
    par = walk._verify_parallel(c.path, ZERO_HASH, True, None)
    assert par is not None and par == ref and par.events == 40
    anchored = walk._verify_parallel(c.path, ZERO_HASH, True, {17: recs[17].hash})
    assert anchored == ref
    # A wrong anchor, a torn tail, damage: same report as the reference (parallel defers).
    assert walk._verify_parallel(c.path, ZERO_HASH, True, {17: recs[16].hash}) is None
    with open(c.path, "ab") as f:
        f.write(b'{"data":')
    par = walk._verify_parallel(c.path, ZERO_HASH, True, None)
    assert par is not None and par.torn_tail and par == walk._verify(c.path, ZERO_HASH, True)
    raw = c.path.read_bytes()
    c.path.write_bytes(raw.replace(b'"i":30,', b'"i":31,'))
    assert walk._verify_parallel(c.path, ZERO_HASH, True, None) is None
    r = verify_file(c.path)
    assert not r.ok and r.first_bad_seq == 30 and "hash mismatch" in (r.reason or "")


def test_append_in_flight_is_not_reported_as_a_crash(tmp_path: Path) -> None:
    """verify reads without the lock; an unterminated last line that a lock holder then
    completes was an append in progress, not a torn line."""
    import fcntl

    c = Chain(tmp_path / "a.jsonl")
    first = c.append("a.b", {})
    head, after = core.encode_record(1, first.ts, "a.b", first.hash, b"{}", None)
    h = hashlib.sha256(DOMAIN + head + after).hexdigest().encode()
    line = head + b',"hash":"' + h + b'"' + after
    fd = os.open(c.path, os.O_WRONLY | os.O_APPEND)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, line[:10])
    size_before = c.path.stat().st_size

    import threading

    def finish() -> None:
        time_to_wait = 0.3
        threading.Event().wait(time_to_wait)
        os.write(fd, line[10:] + b"\n")
        fcntl.flock(fd, fcntl.LOCK_UN)

    t = threading.Thread(target=finish)
    t.start()
    r = verify_file(c.path)
    t.join()
    os.close(fd)
    assert c.path.stat().st_size > size_before
    assert r.ok and not r.torn_tail and r.events == 1 and r.reason is None
    assert verify_file(c.path).events == 2
    # Left unterminated with nobody holding the lock: that is a crash.
    with open(c.path, "ab") as f:
        f.write(b'{"data"')
    assert verify_file(c.path).torn_tail


class _Color(str):
    pass


class _Level(enum.IntEnum):
    HIGH = 3


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"b": 1, "a": [True, False, None, "x"], "c": {"z": {}, "y": []}},
        {"é": "\u2028\x00\x7f\u0085", "q": '"\\/', "n": -(2**53 - 1)},
        {"\U0001f600": 1, "\uffff": 2, "a\U0001f600": "\U0001f600"},
        {"t": (1, 2)},
        {"s": _Color("red")},
        {"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
        {"brackets": "[" * 100},
        # flat records (encoded without parsing back)
        {"id": 2**53 - 1, "neg": -(2**53 - 1), "ok": True, "no": None, "s": "é\u2028\x00"},
        {"\U0001f600": "x", "\uffff": "y", "a": 1},
        {"e": _Level.HIGH, "s": _Color("red")},
    ],
)
def test_encode_data_equals_canonical_bytes(data: dict[str, object]) -> None:
    raw, back = core.encode_data(data)
    assert raw == canonical_bytes(data)
    assert back == json.loads(raw)


@pytest.mark.parametrize(
    "data",
    [
        {1: "x"},
        {True: "x"},
        {"f": 1.0},
        {"n": float("inf")},
        {"b": 2**53},
        {"b": -(2**53)},
        {"s": "\udc80"},
        {"k\ud800": 1},
        {"o": object()},
    ],
)
def test_encode_data_refuses_what_canonical_refuses(data: dict[object, object]) -> None:
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    _refused(cyclic)
    _refused(data)


def _refused(data: object) -> None:
    from linpodx.canonical import CanonicalError

    with pytest.raises(CanonicalError):
        canonical_bytes(data)
    with pytest.raises(CanonicalError):
        core.encode_data(data)


def test_read_records(tmp_path: Path) -> None:
    c = Chain(tmp_path / "a.jsonl")
    recs = [c.append("a.b", {"i": i}) for i in range(3)]
    intact = c.path.read_bytes()
    with open(c.path, "ab") as f:
        f.write(b'{"data":{"i":3')  # a torn append: the start of a record
    assert ch.read_records(c.path) == recs
    c.path.write_bytes(intact + b'{"torn')  # no record starts like that: damage, not a crash
    with pytest.raises(AuditError, match="not the start of a record"):
        ch.read_records(c.path)
    c.path.write_bytes(intact)
    c.path.write_bytes(c.path.read_bytes().replace(b'"i":1', b'"i":9'))
    with pytest.raises(AuditError, match="damaged record at byte"):
        ch.read_records(c.path)
    with pytest.raises(AuditError, match="no audit log"):
        ch.read_records(tmp_path / "missing.jsonl")


def test_errors_that_reach_people_carry_a_hint(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="session tail is not a sha256") as err:
        ch.anchor_session("sess_x", "not-a-hash", 1)
    assert err.value.hint
    # Unreadable for a reason other than absence (here: a path under a regular file).
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AuditError, match="could not read the audit log") as err:
        ch.read_records(blocker / "a.jsonl")
    assert err.value.hint
    with pytest.raises(AuditError, match="could not read the audit log") as err:
        Chain(blocker / "a.jsonl").last()
    assert err.value.hint


@pytest.mark.parametrize("depth", [63, 64])
def test_data_too_deep_for_the_record_around_it_is_refused_not_written(
    tmp_path: Path, depth: int
) -> None:
    """Data nested 64 deep (the record one level around it: 65) was written, then refused by
    the verifier and by every later append ("last record is damaged"): one deep argument in an
    MCP call with record_arguments blocked its session's log for good (h22w)."""
    c = Chain(tmp_path / "deep.jsonl")
    c.append("a.b", {"k": 1})
    deep: object = 0
    for _ in range(depth):
        deep = [deep]
    with pytest.raises(AuditError, match="nesting deeper than"):
        c.append("a.b", {"k": deep})
    c.append("a.b", {"k": 2})  # the log still takes records
    assert c.verify().ok
