"""`linpodx audit verify|show|seal`: output lines, --json, exit codes, error/hint."""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from linpodx.audit.chain import admin_chain, anchor_session, open_session, session_path
from linpodx.audit.core import MAX_LINE
from linpodx.errors import EXIT_AUDIT, EXIT_BUG, EXIT_NOT_FOUND, EXIT_TAMPERED, EXIT_USAGE
from tests.conftest import linpodx_argv, run_linpodx

Cli = Callable[..., Any]
SID = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAV"


@pytest.fixture
def applied(tmp_path: Path) -> tuple[str, str]:
    from linpodx.profile import store

    f = tmp_path / "p.yaml"
    f.write_text("name: demo\n")
    res = store.apply(f)
    return res.profile_id, res.audit_hash


@pytest.fixture
def session(applied: tuple[str, str]) -> str:
    pid, ah = applied
    chain, _ = open_session(SID, pid, ah)
    last = chain.append("mcp.decision", {"method": "tools/call", "decision": "deny"})
    anchor_session(SID, last.hash, 2)
    return SID


def test_verify_admin_ok(cli: Cli, applied: tuple[str, str]) -> None:
    res = cli("audit", "verify")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "events:  1"
    tail = applied[1]
    assert lines[1] == f"chain:   OK (head {'0' * 12}…, tail {tail[:12]}…)"
    assert res.stderr == ""


def test_verify_session_ok(cli: Cli, session: str, applied: tuple[str, str]) -> None:
    res = cli("audit", "verify", "--session", session)
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"session: {session}"
    assert lines[1] == f"profile: {applied[0]}"
    assert lines[2] == "events:  2"
    assert lines[3].startswith(f"chain:   OK (head {applied[1][:12]}…, tail ")


def test_verify_session_says_when_the_session_has_no_closing_record(
    cli: Cli, applied: tuple[str, str]
) -> None:
    """`mcp attach` that could not write its closing record (a full disk) says `audit verify
    --session` reports it; the text output said only OK (the note was in `--json` alone)."""
    pid, ah = applied
    chain, _ = open_session(SID, pid, ah)
    last = chain.append("mcp.decision", {"method": "tools/call", "decision": "deny"})
    res = cli("audit", "verify", "--session", SID)
    assert res.exit_code == 0, res.stderr
    warning = "warning: no session.close yet: records after the last seal are not anchored"
    assert f"{warning} (normal while the session runs)" in res.stdout.splitlines()
    anchor_session(SID, last.hash, 2)
    res = cli("audit", "verify", "--session", SID)
    assert res.exit_code == 0 and "warning:" not in res.stdout, res.stdout


def test_verify_json_has_full_hashes(cli: Cli, session: str, applied: tuple[str, str]) -> None:
    res = cli("audit", "verify", "--session", session, "--json")
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert doc["ok"] is True and doc["command"] == "audit verify"
    r = doc["result"]
    assert r["head"] == applied[1] and len(r["tail"]) == 64 and r["events"] == 2
    assert r["session_id"] == session and r["first_bad_seq"] is None


def test_verify_broken_chain_exit_7(cli: Cli, applied: tuple[str, str]) -> None:
    a = admin_chain()
    a.append("test.event", {"who": "alice"})
    a.append("test.event", {"who": "bob"})
    a.path.write_bytes(a.path.read_bytes().replace(b"alice", b"mallory"))
    res = cli("audit", "verify")
    assert res.exit_code == EXIT_TAMPERED
    assert "chain:   BROKEN at seq 1: hash mismatch" in res.stdout
    assert res.stderr.startswith("error: audit chain broken at seq 1: hash mismatch")
    assert "\nhint: " in res.stderr
    js = cli("audit", "verify", "--json")
    assert js.exit_code == EXIT_TAMPERED
    doc = json.loads(js.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "ChainBroken"
    assert doc["error"]["details"]["first_bad_seq"] == 1


def test_verify_unknown_session_exit_4(cli: Cli, applied: tuple[str, str]) -> None:
    for sid in ("sess_nope", "../admin"):
        res = cli("audit", "verify", "--session", sid)
        assert res.exit_code == EXIT_NOT_FOUND
        assert res.stderr.startswith("error: no audit log for session")
        assert "hint: " in res.stderr
        assert res.stdout == ""


def test_verify_without_any_log_is_not_found(cli: Cli) -> None:
    res = cli("audit", "verify")
    assert res.exit_code == EXIT_NOT_FOUND
    assert "error: no admin audit log yet" in res.stderr
    assert "hint: it is created by the first recorded action" in res.stderr


def test_torn_tail_is_ok_with_a_warning(cli: Cli, applied: tuple[str, str]) -> None:
    with open(admin_chain().path, "ab") as f:
        f.write(b'{"data":{"half')
    res = cli("audit", "verify")
    assert res.exit_code == 0
    assert "chain:   OK" in res.stdout
    assert "warning: torn last line at byte" in res.stdout
    assert "crash during append, not tampering" in res.stdout


def test_seal_then_verify_anchor(cli: Cli, applied: tuple[str, str]) -> None:
    res = cli("audit", "seal")
    assert res.exit_code == 0, res.stderr
    kv = dict(line.split(":", 1) for line in res.stdout.splitlines())
    anchor = kv["anchor"].strip()
    assert anchor == f"0:{applied[1]}"
    assert kv["log_id"].strip().startswith("log_")
    ok = cli("audit", "verify", "--anchor", anchor)
    assert ok.exit_code == 0 and "chain:   OK" in ok.stdout
    # Replace the whole log with a fresh chain: only the anchor (and the store) can tell.
    admin_chain().path.unlink()
    admin_chain().append("profile.apply", {"name": "demo"})
    bad = cli("audit", "verify", "--anchor", anchor)
    assert bad.exit_code == EXIT_TAMPERED
    assert "chain:   BROKEN at seq 0: record seq 0 has hash" in bad.stdout
    assert "the anchor says" in bad.stdout


def test_seal_session_and_truncation(cli: Cli, session: str) -> None:
    res = cli("audit", "seal", "--session", session, "--json")
    doc = json.loads(res.stdout)["result"]
    assert doc["seq"] == 1 and doc["anchor"] == f"1:{doc['hash']}"


def test_bad_anchor_is_a_usage_error(cli: Cli, applied: tuple[str, str]) -> None:
    for bad in ("12", "x:abc", "1:" + "g" * 64, "-1:" + "a" * 64):
        res = cli("audit", "verify", "--anchor", bad)
        assert res.exit_code == EXIT_USAGE, bad
        assert res.stderr.startswith("error: invalid anchor")


def test_show_lists_records_escaping_untrusted_text(cli: Cli, applied: tuple[str, str]) -> None:
    admin_chain().append("test.event", {"tool": "evil\x1b[31mred\x07", "u": "\u2028\x85"})
    res = cli("audit", "show")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].split()[0] == "0" and "profile.apply" in lines[0]
    assert applied[1][:12] in lines[0]
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert lines[1].endswith('{"tool":"evil\\u001b[31mred\\u0007","u":"\\u2028\\x85"}')
    limited = cli("audit", "show", "--limit", "1")
    assert limited.stdout.splitlines() == lines[1:]


def test_show_json_and_session(cli: Cli, session: str) -> None:
    res = cli("audit", "show", "--session", session, "--json")
    assert res.exit_code == 0
    doc = json.loads(res.stdout)["result"]
    assert doc["events"] == 2
    assert [r["type"] for r in doc["records"]] == ["session.start", "mcp.decision"]
    assert doc["records"][0]["log"].startswith("log_")


def test_show_stops_at_damage(cli: Cli, applied: tuple[str, str]) -> None:
    a = admin_chain()
    a.append("test.event", {"who": "alice"})
    a.path.write_bytes(a.path.read_bytes().replace(b"alice", b"eve"))
    res = cli("audit", "show")
    assert res.exit_code == EXIT_TAMPERED
    assert len(res.stdout.splitlines()) == 1
    assert "error: stopped at a damaged record" in res.stderr


def test_verify_as_a_subprocess(applied: tuple[str, str]) -> None:
    out = run_linpodx("audit", "verify")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1].startswith("chain:   OK (head 000000000000…")


def test_verify_all_checks_every_session(cli: Cli, session: str, applied: tuple[str, str]) -> None:
    pid, ah = applied
    other = "sess_01ARZ3NDEKTSV4RRFFQ69G5FAW"
    chain, _ = open_session(other, pid, ah)
    chain.append("mcp.decision", {"tool": "read_file"})
    res = cli("audit", "verify", "--all")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "events:  4" and lines[1].startswith("chain:   OK")
    assert lines[2].startswith(f"session: {session} OK (2 events, tail ")
    assert lines[3].startswith(f"session: {other} OK (2 events, tail ")
    assert lines[4] == "sessions: 2 verified, 0 broken"
    chain.path.write_bytes(chain.path.read_bytes().replace(b"read_file", b"rm_rf"))
    bad = cli("audit", "verify", "--all")
    assert bad.exit_code == EXIT_TAMPERED
    assert f"session: {other} BROKEN at seq 1: hash mismatch" in bad.stdout
    assert "sessions: 2 verified, 1 broken" in bad.stdout
    assert bad.stderr.startswith(f"error: session {other}: audit chain broken at seq 1")
    js = cli("audit", "verify", "--all", "--json")
    doc = json.loads(js.stdout)
    assert js.exit_code == EXIT_TAMPERED and doc["ok"] is False
    assert [s["ok"] for s in doc["error"]["details"]["sessions"]] == [True, False]
    both = cli("audit", "verify", "--all", "--session", session)
    assert both.exit_code == EXIT_USAGE


def _replace_with(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


NOT_REGULAR = {
    "directory": "is a directory, not a regular file",
    "fifo": "is a FIFO (named pipe), not a regular file",
    "devzero": "is a symbolic link (to /dev/zero), not a regular file",
}


@pytest.mark.parametrize("kind", sorted(NOT_REGULAR))
def test_session_log_that_is_not_a_file_is_damage_with_a_hint(
    cli: Cli, session: str, kind: str, watchdog: None
) -> None:
    _replace_with(session_path(session), kind)
    res = cli("audit", "verify", "--session", session)
    assert res.exit_code == EXIT_TAMPERED, res.stderr
    assert f"chain:   BROKEN at seq 0: {session_path(session)} {NOT_REGULAR[kind]}" in res.stdout
    assert "problem:" not in res.stdout  # seq 0 failed: no "first record names no …" echo
    assert res.stderr.startswith("error: audit chain broken at seq 0: ")
    assert "\nhint: linpodx writes each log as a regular file and never through a link" in (
        res.stderr
    )
    shown = cli("audit", "show", "--session", session)
    assert shown.exit_code == EXIT_TAMPERED
    assert shown.stderr.startswith(f"error: the audit log {session_path(session)} ")
    assert NOT_REGULAR[kind] in shown.stderr and "\nhint: " in shown.stderr
    plain = cli("audit", "verify")
    assert plain.exit_code == EXIT_TAMPERED
    assert "its audit log is " + NOT_REGULAR[kind].removeprefix("is ") in plain.stdout
    for r in (res, shown, plain):
        assert "internal error" not in r.stderr and r.exit_code != EXIT_BUG


def test_verify_all_reports_a_directory_and_checks_the_others(
    cli: Cli, session: str, applied: tuple[str, str]
) -> None:
    stray = "sess_01ARZ3NDEKTSV4RRFFQ69G5FA0"
    session_path(stray).mkdir()  # a stray directory named like a session log
    res = cli("audit", "verify", "--all")
    assert res.exit_code == EXIT_TAMPERED, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].startswith("chain:   OK")
    assert f"session: {session} OK (2 events, tail " in res.stdout
    assert (
        f"session: {stray} BROKEN at seq 0: {session_path(stray)} is a directory, "
        "not a regular file" in res.stdout
    )
    assert lines[-1] == "sessions: 2 verified, 1 broken"
    assert res.stderr.startswith(f"error: session {stray}: audit chain broken at seq 0")
    assert "\nhint: " in res.stderr and "internal error" not in res.stderr
    # A session log replaced by a directory: the same, and the admin chain notices it too.
    _replace_with(session_path(session), "directory")
    both = cli("audit", "verify", "--all", "--json")
    assert both.exit_code == EXIT_TAMPERED
    doc = json.loads(both.stdout)
    assert [s["ok"] for s in doc["error"]["details"]["sessions"]] == [False, False]


def _three_sessions(applied: tuple[str, str]) -> list[str]:
    pid, ah = applied
    sids = [f"sess_01ARZ3NDEKTSV4RRFFQ69G5FB{c}" for c in "ABC"]
    for sid in sids:
        chain, _ = open_session(sid, pid, ah)
        chain.append("mcp.decision", {"tool": "read_file"})
    return sids


def _unreadable(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Opening `path` fails as a log of mode 000 does for anyone but root (EACCES)."""
    from linpodx.audit import logfile

    real = logfile.open_log

    def open_log(p: Path) -> int:
        if Path(p) == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))
        return real(p)

    monkeypatch.setattr(logfile, "open_log", open_log)


def test_verify_all_reports_an_unreadable_session_log_and_verifies_the_others(
    cli: Cli, applied: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, middle, last = _three_sessions(applied)
    _unreadable(monkeypatch, session_path(middle))
    res = cli("audit", "verify", "--all")
    assert res.exit_code == EXIT_AUDIT, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].startswith("chain:   OK")
    assert lines[2].startswith(f"session: {first} OK (2 events, tail ")
    assert lines[3] == (
        f"session: {middle} UNREADABLE: could not read the audit log {session_path(middle)}: "
        "Permission denied"
    )
    assert lines[4].startswith(f"session: {last} OK (2 events, tail ")
    assert lines[5] == "sessions: 2 verified, 0 broken, 1 unreadable"
    err = res.stderr.splitlines()
    assert err[0] == (
        f"error: session {middle}: could not read the audit log {session_path(middle)}: "
        "Permission denied"
    )
    assert err[1].startswith("hint: check the file's permissions; then verify it alone with "
                             f"`linpodx audit verify --session {middle}`")
    assert err[2] == (
        f"error: 1 session log of 3 could not be read and was not verified ({middle}); every "
        "other log verified OK"
    )
    assert err[3].startswith("hint: ") and len(err) == 4

    js = cli("audit", "verify", "--all", "--json")
    assert js.exit_code == EXIT_AUDIT
    doc = json.loads(js.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "AuditError"
    sessions = doc["error"]["details"]["sessions"]
    assert [(s["session_id"], s["ok"]) for s in sessions] == [
        (first, True), (middle, False), (last, True)
    ]  # fmt: skip
    assert sessions[1]["unreadable"]["message"].endswith("Permission denied")
    assert "linpodx audit verify --session" in sessions[1]["unreadable"]["hint"]
    assert sessions[0]["unreadable"] is None
    assert js.stderr.startswith(f"error: session {middle}: could not read the audit log")


def test_verify_all_with_a_broken_and_an_unreadable_log_reports_both(
    cli: Cli, applied: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, middle, last = _three_sessions(applied)
    _unreadable(monkeypatch, session_path(first))
    path = session_path(last)
    path.write_bytes(path.read_bytes().replace(b"read_file", b"rm_rf"))
    res = cli("audit", "verify", "--all")
    assert res.exit_code == EXIT_TAMPERED
    assert f"session: {first} UNREADABLE: " in res.stdout
    assert f"session: {middle} OK (2 events" in res.stdout
    assert f"session: {last} BROKEN at seq 1: hash mismatch" in res.stdout
    assert "sessions: 2 verified, 1 broken, 1 unreadable" in res.stdout
    err = res.stderr.splitlines()
    assert err[0].startswith(f"error: session {first}: could not read the audit log")
    assert err[1].startswith("hint: ")
    assert err[2].startswith(f"error: session {last}: audit chain broken at seq 1")


def _apply(tmp_path: Path) -> tuple[str, str]:
    from linpodx.profile import store

    f = tmp_path / "p.yaml"
    f.write_text("name: demo\n")
    res = store.apply(f)
    return res.profile_id, res.audit_hash


def test_verify_all_with_a_log_of_mode_000_as_a_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with a real permission: as a user other than root (root reads any file), a
    log of mode 000 cannot be opened. As root the check runs as LINPODX_TEST_USER (the
    rootless test user scripts/test.sh sets up), on a state dir that user owns."""
    import pwd
    import shutil
    import tempfile

    user = os.environ.get("LINPODX_TEST_USER", "linpodx-test")
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam(user)
        except KeyError:
            pytest.skip(f"running as root and there is no user {user} to run as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser")
    # A fresh state dir that user can reach (tmp_path's parents are root's, mode 0700).
    state = Path(tempfile.mkdtemp(prefix="linpodx-verify-"))
    try:
        monkeypatch.setenv("LINPODX_STATE_DIR", str(state))
        first, middle, last = _three_sessions(_apply(tmp_path))
        session_path(middle).chmod(0)
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LINPODX_STATE_DIR": str(state),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "HOME": str(state),
        }
        argv = [*linpodx_argv(), "audit", "verify", "--all"]
        if os.geteuid() == 0:
            subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(state)], check=True)
            os.chmod(state, 0o700)
            argv = ["runuser", "-u", user, "--", "env", "-i",
                    *(f"{k}={v}" for k, v in env.items()), *argv]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                             env=None if os.geteuid() == 0 else env)  # fmt: skip
        assert out.returncode == EXIT_AUDIT, out.stdout + out.stderr
        assert f"session: {first} OK (2 events" in out.stdout
        assert f"session: {middle} UNREADABLE: " in out.stdout
        assert f"session: {last} OK (2 events" in out.stdout
        assert out.stderr.startswith(f"error: session {middle}: could not read the audit log ")
        assert "Permission denied\nhint: check the file's permissions" in out.stderr
        assert "Traceback" not in out.stderr
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_show_calls_an_oversize_tail_damage_not_a_torn_line(
    cli: Cli, applied: tuple[str, str]
) -> None:
    path = admin_chain().path
    size = path.stat().st_size
    os.truncate(path, 300 * 1024 * 1024)  # sparse: zeros after the one record
    res = cli("audit", "show")
    assert res.exit_code == EXIT_TAMPERED
    assert len(res.stdout.splitlines()) == 1
    assert res.stderr.startswith(
        f"error: stopped at a damaged record at byte {size}: line longer than {MAX_LINE} bytes"
    )
    assert "torn" not in res.stderr and "\nhint: " in res.stderr
    v = cli("audit", "verify")
    assert v.exit_code == EXIT_TAMPERED and "torn" not in v.stdout
    assert f"chain:   BROKEN at seq 1: line longer than {MAX_LINE} bytes" in v.stdout
    # A short tail that is no record's beginning is damage as well.
    os.truncate(path, size)
    with open(path, "ab") as f:
        f.write(b"\0" * 40)
    res = cli("audit", "show")
    assert res.exit_code == EXIT_TAMPERED and "not the start of a record" in res.stderr


def test_verify_memory_stays_bounded_on_a_huge_sparse_log(session: str, tmp_path: Path) -> None:
    """A whole-line read of this 2 GiB zero tail cannot fit in the 512 MiB address space."""
    path = session_path(session)
    os.truncate(path, 2 * 1024 * 1024 * 1024)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 * 1024 * 1024, 512 * 1024 * 1024))

    out = subprocess.run(
        [*linpodx_argv(), "audit", "verify", "--session", session],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
    )
    assert out.returncode == EXIT_TAMPERED, out.stderr
    assert f"line longer than {MAX_LINE} bytes" in out.stdout
    assert "internal error" not in out.stderr and "MemoryError" not in out.stderr


def test_seal_of_an_empty_log_has_a_hint(cli: Cli) -> None:
    path = admin_chain().path
    path.parent.mkdir(parents=True)
    path.touch()
    res = cli("audit", "seal")
    assert res.exit_code == EXIT_NOT_FOUND
    assert res.stderr.startswith(f"error: the audit log {path} has no records to seal\nhint: ")


@pytest.mark.parametrize("command", [("audit", "verify"), ("audit", "show")])
def test_an_admin_log_that_cannot_be_looked_at_is_an_error_not_no_log_yet(
    cli: Any, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    """An audit dir the user may not search (EACCES, e.g. chowned to root) hides the log; that
    must be said, not reported as "no admin audit log yet" (which reads as nothing to check)."""
    admin_chain().append("profile.apply", {"name": "p"})
    path = admin_chain().path
    real = os.lstat

    def lstat(p: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if Path(p) == path:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", lstat)
    res = cli(*command)
    assert res.exit_code != 0 and res.exit_code != EXIT_NOT_FOUND, res.stderr
    assert "no admin audit log yet" not in res.stderr
    assert "Permission denied" in res.stderr and "hint:" in res.stderr
    assert "Traceback" not in res.stderr


def test_deleted_admin_log_is_broken_not_a_fresh_install(cli: Cli, session: str) -> None:
    """The admin log deleted while profile revisions and session logs remain: `verify`,
    `verify --all` and `seal` say the chain is broken (exit 7), not "no admin audit log yet"
    (exit 4, which reads as nothing to check), and `--all` still verifies every session."""
    admin_chain().path.unlink()
    res = cli("audit", "verify")
    assert res.exit_code == EXIT_TAMPERED, res.stderr
    assert "no admin audit log yet" not in res.stderr
    assert "the admin log is missing" in res.stderr and "was deleted" in res.stderr
    every = cli("audit", "verify", "--all")
    assert every.exit_code == EXIT_TAMPERED, every.stderr
    assert f"session: {session} BROKEN: there is no admin log" in every.stdout
    assert "sessions: 1 verified, 1 broken" in every.stdout
    sealed = cli("audit", "seal")
    assert sealed.exit_code == EXIT_TAMPERED and "the admin log is missing" in sealed.stderr


def test_deleted_admin_log_with_only_a_session_left(cli: Cli, session: str) -> None:
    """No profile revision (the store emptied too), but a session log remains: still broken."""
    import shutil

    from linpodx.paths import profiles_dir

    admin_chain().path.unlink()
    shutil.rmtree(profiles_dir())
    res = cli("audit", "verify")
    assert res.exit_code == EXIT_TAMPERED, res.stderr
    assert "1 session log(s)" in res.stderr


@pytest.mark.parametrize("json_mode", [False, True])
def test_show_streams_records_instead_of_holding_the_log(
    cli: Cli, applied: tuple[str, str], monkeypatch: pytest.MonkeyPatch, json_mode: bool
) -> None:
    """`show` without --limit writes each record as it is read (and `--json` writes its
    envelope while reading the records a second time), so a log of any size is shown
    without holding every record: output must already be there while records are read."""
    import io
    import sys

    from linpodx.audit import logfile

    a = admin_chain()
    for i in range(20):
        a.append("test.event", {"i": i})
    seen: list[int] = []
    real = logfile.check_line

    def check_line(line: bytes) -> Any:
        out = sys.stdout
        seen.append(len(out.getvalue()) if isinstance(out, io.StringIO) else -1)
        return real(line)

    monkeypatch.setattr(logfile, "check_line", check_line)
    args = ("audit", "show", "--json") if json_mode else ("audit", "show")
    res = cli(*args)
    assert res.exit_code == 0, res.stderr
    assert seen and max(seen) > 0  # some records were read after output was written
    if json_mode:
        doc = json.loads(res.stdout)
        assert doc["ok"] is True and doc["result"]["events"] == 21
        assert [r["seq"] for r in doc["result"]["records"]] == list(range(21))
        # The same text json.dumps gives for the whole envelope.
        assert res.stdout == json.dumps(doc, ensure_ascii=False, indent=2) + "\n"
    else:
        assert len(res.stdout.splitlines()) == 21


def test_show_json_of_a_damaged_log_is_one_error_envelope(
    cli: Cli, applied: tuple[str, str]
) -> None:
    a = admin_chain()
    a.append("test.event", {"who": "alice"})
    a.append("test.event", {"who": "bob"})
    a.path.write_bytes(a.path.read_bytes().replace(b"alice", b"eve"))
    res = cli("audit", "show", "--json")
    assert res.exit_code == EXIT_TAMPERED
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["details"]["events"] == 1


def test_newlines_in_a_link_target_do_not_forge_lines(cli: Cli, session: str) -> None:
    """A link in a log's place whose target holds newlines and escapes: every message that
    names it shows them escaped, so no forged `chain: OK` line reaches the terminal."""
    path = session_path(session)
    path.unlink()
    os.symlink("x\nchain:   OK (forged)\nhint: fine\x1b[2J\u202e", path)
    for args in (("audit", "verify", "--session", session), ("audit", "verify", "--all"),
                 ("audit", "show", "--session", session)):
        res = cli(*args)
        assert res.exit_code == EXIT_TAMPERED, res.stderr
        for out in (res.stdout, res.stderr):
            assert "\x1b" not in out and "\u202e" not in out
            assert not any(line.startswith(("chain:   OK (forged)", "hint: fine"))
                           for line in out.splitlines())
        assert "x\\x0achain:   OK (forged)" in res.stderr


def test_newline_in_a_recorded_profile_id_does_not_forge_lines(
    cli: Cli, applied: tuple[str, str]
) -> None:
    from linpodx.audit.chain import session_chain

    sid = "sess_01ARZ3NDEKTSV4RRFFQ69G5FD0"
    hostile = "prof_\x1b]0;pwned\x07\u202e\nhint: all good"
    session_chain(sid, applied[1]).append(
        "session.start", {"session_id": sid, "profile_id": hostile, "audit_hash": applied[1]}
    )
    res = cli("audit", "verify", "--session", sid)
    assert res.exit_code == EXIT_TAMPERED
    for out in (res.stdout, res.stderr):
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
        assert not any(line.startswith("hint: all good") for line in out.splitlines())
    assert "\\x0ahint: all good" in res.stderr


def test_sessions_dir_replaced_by_a_file_is_a_missing_log(cli: Cli, session: str) -> None:
    """`sessions/` replaced by a regular file: `verify --session` says what `--all` says (the
    opened session's log is missing, exit 7), not that the state dir is unusable (exit 6)."""
    import shutil

    base = session_path(session).parent
    shutil.rmtree(base)
    base.write_text("x")
    one = cli("audit", "verify", "--session", session)
    assert one.exit_code == EXIT_TAMPERED, one.stderr
    assert f"the audit log of session {session} is missing" in one.stderr
    every = cli("audit", "verify", "--all")
    assert every.exit_code == EXIT_TAMPERED
    assert f"session {session} was opened at admin seq" in every.stdout
    shown = cli("audit", "show", "--session", session)
    assert shown.exit_code == EXIT_NOT_FOUND, shown.stderr
