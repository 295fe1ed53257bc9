"""The tamper matrix: each way of changing a log, the first bad seq, and the reason given.

The attacker here has the user's rights and knows the format: forged records carry correct
hashes, so detection must come from seq, prev, the log id, anchors and cross-anchors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from linpodx.audit.chain import (
    DOMAIN,
    ZERO_HASH,
    Chain,
    admin_chain,
    anchor_session,
    open_session,
    session_chain,
    verify_file,
)
from linpodx.canonical import canonical_bytes
from linpodx.integrity import verify_admin, verify_session

N = 8


@pytest.fixture(autouse=True, params=["one-process", "parallel", "batches of 2"])
def verifier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the whole matrix three times: with the reference verifier, with the forked parallel
    verifier forced on for every file (3 workers, so seams fall between records), and with
    the reference verifier parsing 2 lines at a time (so that these short logs reach the
    batches after the first, which `batch.chain_batch` checks a column at a time)."""
    from linpodx.audit import walk

    if request.param == "parallel":
        monkeypatch.setattr(walk, "_PARALLEL_MIN_BYTES", 0)
        monkeypatch.setattr(walk, "_workers", lambda: 3)
    if request.param == "batches of 2":
        monkeypatch.setattr(walk, "BATCH", 2)
    return str(request.param)


def make_log(path: Path, n: int = N, genesis: str | None = None) -> list[bytes]:
    c = Chain(path, genesis)
    for i in range(n):
        c.append("test.event", {"i": i, "who": "alice"})
    return path.read_bytes().splitlines(keepends=True)


def rehash(obj: dict[str, object]) -> bytes:
    """What an attacker does after editing a record: recompute its hash."""
    body = {k: v for k, v in obj.items() if k != "hash"}
    h = hashlib.sha256(DOMAIN + canonical_bytes(body)).hexdigest()
    return canonical_bytes({**body, "hash": h}) + b"\n"


def rewrite(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def forge_chain(path: Path, records: list[dict[str, object]], genesis: str = ZERO_HASH) -> None:
    """A fresh, internally valid chain written by an attacker, record by record."""
    prev = genesis
    out = []
    for i, data in enumerate(records):
        rec: dict[str, object] = {
            "seq": i,
            "ts": f"2026-01-01T00:00:{i:02d}.000000Z",
            "type": "test.event",
            "prev": prev,
            "data": data,
        }
        if i == 0:
            rec["log"] = "log_01ARZ3NDEKTSV4RRFFQ69G5FAV"
        line = rehash(rec)
        prev = json.loads(line)["hash"]
        out.append(line)
    rewrite(path, out)


@pytest.fixture
def applied(tmp_path: Path) -> tuple[str, str]:
    """A profile applied through the real store: (profile_id, audit_hash)."""
    from linpodx.profile import store

    f = tmp_path / "p.yaml"
    f.write_text("name: demo\n")
    res = store.apply(f)
    return res.profile_id, res.audit_hash


@pytest.fixture
def log(tmp_path: Path) -> tuple[Path, list[bytes]]:
    p = tmp_path / "a.jsonl"
    return p, make_log(p)


def test_untouched_log_verifies(log: tuple[Path, list[bytes]]) -> None:
    path, _ = log
    r = verify_file(path)
    assert r.ok and r.events == N and r.first_bad_seq is None and r.reason is None


def test_modified_field(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    lines[3] = lines[3].replace(b'"who":"alice"', b'"who":"mallory"')
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 3 and r.events == 3
    assert "hash mismatch" in (r.reason or "")


def test_modified_field_with_recomputed_hash(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    obj = json.loads(lines[3])
    obj["data"]["who"] = "mallory"
    lines[3] = rehash(obj)
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 4
    assert "does not match the hash of seq 3" in (r.reason or "")


def test_deleted_record(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    del lines[5]
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 5
    assert "seq 6 where 5 was expected" in (r.reason or "")


def test_deleted_first_record(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    del lines[0]
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 0
    assert "seq 1 where 0 was expected" in (r.reason or "")


def test_reordered_records(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    lines[2], lines[3] = lines[3], lines[2]
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 2
    assert "seq 3 where 2 was expected" in (r.reason or "")


def test_reordered_and_renumbered(log: tuple[Path, list[bytes]]) -> None:
    """Swap two records and fix their seq and hash: prev linkage still gives it away."""
    path, lines = log
    a, b = json.loads(lines[2]), json.loads(lines[3])
    a["seq"], b["seq"] = 3, 2
    a["ts"], b["ts"] = b["ts"], a["ts"]
    lines[2], lines[3] = rehash(b), rehash(a)
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 2
    assert "does not match the hash of seq 1" in (r.reason or "")


def test_inserted_forged_record(log: tuple[Path, list[bytes]]) -> None:
    """A forged record with a correct hash and a correct link to its predecessor."""
    path, lines = log
    before = json.loads(lines[3])
    forged = {
        "seq": 4,
        "ts": before["ts"],
        "type": "test.event",
        "prev": before["hash"],
        "data": {"i": 99, "who": "mallory"},
    }
    lines.insert(4, rehash(forged))
    rewrite(path, lines)
    r = verify_file(path)
    # The forged record itself links fine; the original seq 4 after it does not.
    assert not r.ok and r.first_bad_seq == 5
    assert "seq 4 where 5 was expected" in (r.reason or "")


def test_inserted_forged_record_renumbering_the_rest(log: tuple[Path, list[bytes]]) -> None:
    """Insert and renumber + rehash the original record after it: its prev still points
    at the record before the insertion."""
    path, lines = log
    before = json.loads(lines[3])
    forged = {
        "seq": 4,
        "ts": before["ts"],
        "type": "test.event",
        "prev": before["hash"],
        "data": {"i": 99},
    }
    nxt = json.loads(lines[4])
    nxt["seq"] = 5
    lines[4:5] = [rehash(forged), rehash(nxt)]
    rewrite(path, lines[:6])
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 5
    assert "does not match the hash of seq 4" in (r.reason or "")


def test_spliced_records_from_another_log(tmp_path: Path, log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    other = make_log(tmp_path / "b.jsonl")
    lines[3:6] = other[3:6]  # same seqs, valid hashes, but they link to the other log
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 3
    assert "does not match the hash of seq 2" in (r.reason or "")


def test_spliced_first_record_of_another_log(tmp_path: Path, log: tuple[Path, list[bytes]]) -> None:
    """Another log's first record (with its log id), renumbered and relinked by the attacker."""
    path, lines = log
    other = make_log(tmp_path / "b.jsonl")
    foreign = json.loads(other[0])
    prev = json.loads(lines[3])
    foreign["seq"], foreign["prev"] = 4, prev["hash"]
    foreign["ts"] = max(foreign["ts"], prev["ts"])
    lines = [*lines[:4], rehash(foreign)]
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 4
    assert "log id" in (r.reason or "") and "spliced in from another log" in (r.reason or "")


def test_log_id_missing_from_first_record(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    first = json.loads(lines[0])
    del first["log"]
    rewrite(path, [rehash(first)])
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 0 and "no log id" in (r.reason or "")


def test_timestamps_going_backwards(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    obj = json.loads(lines[N - 1])
    obj["ts"] = "2000-01-01T00:00:00.000000Z"
    lines[N - 1] = rehash(obj)
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == N - 1 and "earlier than" in (r.reason or "")


def test_duplicate_key_record_with_valid_hash(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    lines[2] = lines[2].replace(b'"who":"alice"', b'"who":"alice","who":"bob"')
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 2 and "duplicate key" in (r.reason or "")


def test_garbage_line_in_the_middle(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    lines.insert(2, b"this is not json\n")
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 2 and "not a valid record" in (r.reason or "")


def test_blank_line_in_the_middle(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    lines.insert(2, b"\n")
    rewrite(path, lines)
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 2


# --- truncation: invisible to the file alone, visible with an anchor -----------------------


def test_truncated_tail_is_not_detectable_without_an_anchor(log: tuple[Path, list[bytes]]) -> None:
    """The limitation, stated as a test: a clean cut at a record boundary leaves a valid
    (shorter) chain."""
    path, lines = log
    rewrite(path, lines[:5])
    r = verify_file(path)
    assert r.ok and r.events == 5


def test_truncated_tail_is_detected_by_an_anchor(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    sealed = json.loads(lines[N - 1])
    anchors = {N - 1: sealed["hash"]}
    assert verify_file(path, anchors=anchors).ok
    rewrite(path, lines[:5])
    r = verify_file(path, anchors=anchors)
    assert not r.ok and r.first_bad_seq == 5
    assert "truncated" in (r.reason or "")


def test_truncated_session_detected_by_admin_session_close(applied: tuple[str, str]) -> None:
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    chain, _ = open_session(sid, pid, ah)
    for i in range(5):
        last = chain.append("mcp.decision", {"i": i})
    anchor_session(sid, last.hash, 6)
    assert verify_session(sid).ok
    lines = chain.path.read_bytes().splitlines(keepends=True)
    rewrite(chain.path, lines[:4])
    assert verify_file(chain.path, ah).ok  # the file alone cannot tell
    check = verify_session(sid)
    assert not check.ok and check.report.first_bad_seq == 4
    assert "truncated" in (check.report.reason or "")


def test_records_appended_after_session_close_detected(applied: tuple[str, str]) -> None:
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAW"
    chain, first = open_session(sid, pid, ah)
    anchor_session(sid, first.hash, 1)
    chain.append("mcp.decision", {"late": True})
    check = verify_session(sid)
    assert check.report.ok and not check.ok
    assert "after the session was closed" in check.problems[0]


# --- full replacement: a fresh valid chain ---------------------------------------------------


def test_replaced_log_passes_alone_but_fails_its_anchor(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    sealed = json.loads(lines[4])
    forge_chain(path, [{"i": i, "who": "nobody"} for i in range(N)])
    assert verify_file(path).ok  # the limitation: a fresh chain is internally valid
    r = verify_file(path, anchors={4: sealed["hash"]})
    assert not r.ok and r.first_bad_seq == 4
    assert "the anchor says" in (r.reason or "")


def test_replaced_admin_log_detected_by_session_cross_anchor(applied: tuple[str, str]) -> None:
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAX"
    chain, _ = open_session(sid, pid, ah)
    last = chain.append("mcp.decision", {"i": 1})
    anchor_session(sid, last.hash, 2)
    assert verify_session(sid).ok
    assert verify_admin().ok
    forge_chain(admin_chain().path, [{"profile_id": pid}, {"nothing": "here"}])
    assert verify_file(admin_chain().path).ok
    check = verify_session(sid)
    assert not check.ok
    assert any("no profile.apply record" in p for p in check.problems)
    # ... and by the profile store, whose revision names an audit_hash the new log lacks.
    admin = verify_admin()
    assert admin.report.ok and not admin.ok
    assert "not a profile.apply record of the admin chain" in admin.problems[0]


def test_replaced_session_log_detected_by_admin_cross_anchor(applied: tuple[str, str]) -> None:
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAY"
    chain, _ = open_session(sid, pid, ah)
    last = chain.append("mcp.decision", {"i": 1})
    anchor_session(sid, last.hash, 2)
    assert verify_session(sid).ok
    # A fresh chain that starts from the right profile hash and names the right profile:
    forge_chain(
        chain.path,
        [{"session_id": sid, "profile_id": pid, "audit_hash": ah}, {"i": 1}],
        genesis=ah,
    )
    assert verify_file(chain.path, ah).ok
    check = verify_session(sid)
    assert not check.ok and check.report.first_bad_seq == 0
    assert "the anchor says" in (check.report.reason or "")


def test_session_from_unknown_profile_detected(applied: tuple[str, str]) -> None:
    pid, _ = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAZ"
    fake = "ab" * 32  # a session written without open_session, from a made-up profile hash
    session_chain(sid, fake).append("session.start", {"profile_id": pid, "audit_hash": fake})
    check = verify_session(sid)
    assert not check.ok
    assert any("no profile.apply record" in p for p in check.problems)
    assert any("the profile store says" in p for p in check.problems)


def test_session_verifies_against_store_and_admin(applied: tuple[str, str]) -> None:
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FB0"
    chain, _ = open_session(sid, pid, ah, {"container": "box"})
    last = chain.append("mcp.decision", {"i": 1})
    anchor_session(sid, last.hash, 2)
    check = verify_session(sid)
    assert check.ok and check.report.head == ah and check.report.tail == last.hash
    assert check.profile_id == pid
    assert any("matches the profile store" in n for n in check.notes)
    assert any("anchored at admin seq 0" in n for n in check.notes)


def test_admin_verify_with_seal(log: tuple[Path, list[bytes]]) -> None:
    a = admin_chain()
    recs = [a.append("profile.apply", {"i": i}) for i in range(3)]
    check = verify_admin({2: recs[2].hash})
    assert check.ok and check.report.events == 3
    forge_chain(a.path, [{"i": i} for i in range(3)])
    check = verify_admin({2: recs[2].hash})
    assert not check.ok and check.report.first_bad_seq == 2


def test_admin_log_deleted_but_sealed() -> None:
    a = admin_chain()
    r = a.append("profile.apply", {})
    a.path.unlink()
    check = verify_admin({0: r.hash})
    assert not check.ok and "deleted" in (check.report.reason or "")


# --- torn tail: a crash, not tampering ------------------------------------------------------


def test_torn_tail_is_reported_as_a_crash_and_repaired(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    partial = lines[N - 1][:40]
    rewrite(path, [*lines[: N - 1], partial])
    offset = sum(len(x) for x in lines[: N - 1])
    r = verify_file(path)
    assert r.ok and r.torn_tail and r.events == N - 1 and r.first_bad_seq is None
    assert r.torn_offset == offset and r.torn_bytes == 40
    assert f"torn last line at byte {offset}" in (r.reason or "")
    assert "crash during append, not tampering" in (r.reason or "")

    rec = Chain(path).append("test.event", {"after": "crash"})
    assert rec.seq == N  # the repair record took seq N-1
    r2 = verify_file(path)
    assert r2.ok and not r2.torn_tail and r2.events == N + 1 and r2.reason is None
    repair = json.loads(path.read_bytes().splitlines()[N - 1])
    assert repair["type"] == "audit.repair"
    assert repair["data"]["offset"] == offset
    assert repair["data"]["removed_bytes"] == 40
    assert repair["data"]["removed_sha256"] == hashlib.sha256(partial).hexdigest()


def test_torn_first_line_repaired(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"data":{"i":0},"ha')
    r = verify_file(path)
    assert r.ok and r.torn_tail and r.events == 0 and r.torn_offset == 0
    Chain(path).append("test.event", {})
    lines = path.read_bytes().splitlines()
    assert json.loads(lines[0])["type"] == "audit.repair" and json.loads(lines[0])["seq"] == 0
    assert verify_file(path).ok and verify_file(path).events == 2


def test_torn_tail_after_damage_is_still_damage(log: tuple[Path, list[bytes]]) -> None:
    path, lines = log
    lines[1] = lines[1].replace(b"alice", b"eve")
    rewrite(path, [*lines, b'{"partial'])
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == 1


def test_deleted_admin_log_detected_from_a_session(applied: tuple[str, str]) -> None:
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FB1"
    open_session(sid, pid, ah)
    admin_chain().path.unlink()
    check = verify_session(sid)
    assert check.report.ok and not check.ok
    assert "there is no admin log" in check.problems[0]


def test_session_under_builtin_profile(applied: tuple[str, str]) -> None:
    """The built-in default profile has no profile.apply record; session.open anchors it."""
    from linpodx import containers

    ref = containers.builtin_ref()
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FB2"
    chain, _ = open_session(sid, ref.profile_id, ref.audit_hash)
    last = chain.append("mcp.decision", {"i": 1})
    anchor_session(sid, last.hash, 2)
    check = verify_session(sid)
    assert check.ok, check.problems
    assert any("built-in default profile (digest matches" in n for n in check.notes)
    # Without session.open in the admin chain, a "builtin" session is anchored by nothing.
    sid2 = "sess_01ARZ3NDEKTSV4RRFFQ69G5FB3"
    session_chain(sid2, ref.audit_hash).append(
        "session.start", {"profile_id": ref.profile_id, "audit_hash": ref.audit_hash}
    )
    check2 = verify_session(sid2)
    assert not check2.ok
    assert any("must be opened in the admin chain" in p for p in check2.problems)


def test_deleted_session_log_detected(applied: tuple[str, str]) -> None:
    from linpodx.errors import ChainBroken, NotFound

    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FB4"
    chain, _ = open_session(sid, pid, ah)
    assert verify_admin().ok
    chain.path.unlink()
    with pytest.raises(ChainBroken, match="the session log was deleted"):
        verify_session(sid)
    admin = verify_admin()
    assert admin.report.ok and not admin.ok
    assert f"session {sid} was opened at admin seq" in admin.problems[0]
    # A session nobody ever opened is simply unknown.
    with pytest.raises(NotFound):
        verify_session("sess_01ARZ3NDEKTSV4RRFFQ69G5FB5")


def test_copied_session_log_detected(applied: tuple[str, str]) -> None:
    """A byte copy of an opened, closed session's log under another id: its chain is intact and
    starts from an applied profile, but its first record names the other session."""
    import shutil

    from linpodx.audit.chain import session_path

    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FC0"
    chain, _ = open_session(sid, pid, ah)
    last = chain.append("mcp.decision", {"i": 1})
    anchor_session(sid, last.hash, 2)
    copy = "sess_01ARZ3NDEKTSV4RRFFQ69G5FC1"
    shutil.copy(session_path(sid), session_path(copy))
    check = verify_session(copy)
    assert check.report.ok and not check.ok
    assert any(f"names session {sid}, not {copy}" in p for p in check.problems)
    assert verify_session(sid).ok


def test_forged_unopened_session_detected(applied: tuple[str, str]) -> None:
    """A chain forged from scratch from an applied profile, naming itself, never opened."""
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FC2"
    from linpodx.audit.chain import session_path

    session_path(sid).parent.mkdir(parents=True, exist_ok=True)
    forge_chain(
        session_path(sid),
        [{"session_id": sid, "profile_id": pid, "audit_hash": ah}, {"tool": "x"}, {"r": "done"}],
        genesis=ah,
    )
    check = verify_session(sid)
    assert check.report.ok and not check.ok
    assert any("no session.open" in p and "nobody opened" in p for p in check.problems)


def test_crash_between_session_start_and_open_is_a_note(
    applied: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """open_session wrote session.start, then died before the admin chain's session.open: the
    log holds its first record only, and that is a crash, not a forgery."""
    from linpodx.audit import chain as ch
    from linpodx.errors import AuditError

    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FC3"
    real = ch.Chain.append

    def append(self: ch.Chain, typ: str, data: object) -> object:
        if typ == "session.open":
            raise AuditError("disk full", "")
        return real(self, typ, data)  # type: ignore[arg-type]

    with monkeypatch.context() as m, pytest.raises(AuditError):
        m.setattr(ch.Chain, "append", append)
        open_session(sid, pid, ah)
    check = verify_session(sid)
    assert check.ok, check.problems
    assert any("never opened" in n for n in check.notes)


def test_session_opened_after_the_admin_scan_is_not_forged(applied: tuple[str, str]) -> None:
    """verify --all reads the admin chain first; a session opened (and recording) after that
    must not be called forged: the admin chain is read again before saying so."""
    from linpodx.audit.verify import _admin_scan

    pid, ah = applied
    stale = _admin_scan()
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FC4"
    chain, _ = open_session(sid, pid, ah)
    chain.append("mcp.decision", {"i": 1})
    check = verify_session(sid, admin_scan=stale)
    assert check.ok, check.problems
    assert any("opened at admin seq" in n for n in check.notes)


def test_edited_admin_record_does_not_blame_an_intact_session(applied: tuple[str, str]) -> None:
    """The admin chain's session.close edited (its record count) with its hash recomputed:
    the admin chain breaks at the NEXT record's prev. The edited record comes before the break,
    yet must not be used as an anchor: the intact session log is not blamed, the admin break
    is what is reported first."""
    pid, ah = applied
    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FD1"
    chain, _ = open_session(sid, pid, ah)
    last = chain.append("mcp.decision", {"i": 1})
    close = anchor_session(sid, last.hash, 2)
    admin_chain().append("test.event", {"after": "close"})
    path = admin_chain().path
    lines = path.read_bytes().splitlines(keepends=True)
    obj = json.loads(lines[close.seq])
    obj["data"]["events"] = 1
    lines[close.seq] = rehash(obj)
    rewrite(path, lines)
    admin = verify_file(path)
    assert not admin.ok and admin.first_bad_seq == close.seq + 1
    check = verify_session(sid)
    assert not check.ok
    assert check.report.ok, check.report.reason  # the session log itself verifies
    assert check.problems[0].startswith("the admin chain that anchors this session is broken")
    assert len(check.problems) == 1, check.problems


@pytest.mark.parametrize(
    ("ts", "why"),
    [
        ("2026-13-45T25:61:61.000000Z", "ts is not a UTC timestamp"),
        ("2026-00-10T10:00:00.000000Z", "ts is not a UTC timestamp"),
        ("2026-02-30T10:00:00.000000Z", "names a day its month does not have"),
        ("2027-02-29T10:00:00.000000Z", "names a day its month does not have"),
        ("2026-04-31T10:00:00.000000Z", "names a day its month does not have"),
    ],
)
def test_impossible_timestamp_with_recomputed_hash(
    log: tuple[Path, list[bytes]], ts: str, why: str
) -> None:
    """A date that does not exist, in the right shape and with a recomputed hash (so only the
    timestamp check can tell): the last record, so nothing after it notices either."""
    from linpodx.audit.chain import parse_line
    from linpodx.audit.core import fast_fields

    path, lines = log
    obj = json.loads(lines[-1])
    obj["ts"] = ts
    lines[-1] = rehash(obj)
    rewrite(path, lines)
    assert fast_fields(lines[-1][:-1]) is None
    with pytest.raises(ValueError, match=why):
        parse_line(lines[-1][:-1])
    r = verify_file(path)
    assert not r.ok and r.first_bad_seq == N - 1
    assert why in (r.reason or "")


def test_real_leap_days_are_fine(tmp_path: Path) -> None:
    from linpodx.audit.chain import parse_line

    for ts in ("2028-02-29T00:00:00.000000Z", "2000-02-29T23:59:59.999999Z",
               "2026-12-31T23:59:59.000000Z", "2026-04-30T00:00:00.000000Z"):
        rec = rehash({"seq": 0, "ts": ts, "type": "test.event", "prev": ZERO_HASH, "data": {},
                      "log": "log_01ARZ3NDEKTSV4RRFFQ69G5FAV"})
        assert parse_line(rec[:-1]).ts == ts


def test_edited_profile_revision_with_a_recomputed_digest_is_detected(
    applied: tuple[str, str],
) -> None:
    """Someone edits a stored revision (here: MCP calls of any tool allowed) and writes the
    new digest into it, so the store's own check passes and runs would use it. verify
    compares the revision with its profile.apply record, which holds what was applied."""
    from linpodx.paths import profiles_dir
    from linpodx.profile import store

    pid, _ah = applied
    assert verify_admin().ok
    path = profiles_dir() / "revisions" / f"{pid}.json"
    doc = json.loads(path.read_text())
    doc["profile"]["mcp_policy"] = [{"method": "tools/call", "decision": "auto_allow"}]
    edited = store.profile_from_dict(doc["profile"], str(path))
    doc["digest"] = store.digest_of(edited)
    path.write_text(json.dumps(doc, indent=2))
    assert store.get_by_id(pid).digest == doc["digest"]  # the store alone cannot tell
    admin = verify_admin()
    assert admin.report.ok and not admin.ok
    assert "is not what its profile.apply record" in admin.problems[0]
    assert "(digest differ)" in admin.problems[0]
    # The hint names what changed (the store's revision), not "the log".
    from linpodx.audit.verify import raise_broken
    from linpodx.errors import ChainBroken

    with pytest.raises(ChainBroken) as ei:
        raise_broken(admin)
    assert (ei.value.hint or "").startswith("the stored profile revision was changed")
