"""The state dir named by `events`, `approve` and `deny`, and approvals waiting in another one
("the approval prompt never appears")."""

from __future__ import annotations

import os
import pwd
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from linpodx.approvals import elsewhere, seen, store
from linpodx.paths import state_dir

REQ = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "write_file", "arguments": {"path": "a", "content": "b"}},
}


def pending(timeout: float = 30) -> store.PendingRequest:
    return store.create(
        "sess_01KB0000000000000000000000", "tools/call", "write_file", REQ, REQ["params"], timeout
    )


@pytest.fixture
def default_with_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[str, Path]:
    """One approval pending in the default state dir; the command then runs with
    LINPODX_STATE_DIR pointing at another."""
    pending()
    default = str(state_dir())
    other = tmp_path / "other-state"
    other.mkdir(mode=0o700)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(other))
    return default, other


def test_events_names_its_state_dir_and_the_default_one_with_approvals(
    cli: Any, default_with_one: tuple[str, Path]
) -> None:
    default, other = default_with_one
    res = cli("events", "--filter", "approval", "--no-follow")
    assert res.exit_code == 0 and res.stdout == ""
    lines = res.stderr.splitlines()
    assert lines[0] == f"state dir: {other}"
    assert lines[1] == (
        f"note: 1 approval pending in another state dir, {default}; to answer them: "
        f"LINPODX_STATE_DIR={default} linpodx events --filter approval"
    )
    # Other filters name the state dir only.
    res = cli("events", "--filter", "container", "--no-follow")
    assert res.stderr == f"state dir: {other}\n"


def test_nothing_is_said_of_the_dir_in_use_or_of_answered_or_expired_ones(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    p = pending()
    res = cli("events", "--filter", "approval", "--no-follow")
    assert "note:" not in res.stderr  # (it is the dir in use, shown on stdout)
    store.answer(p.approval_id, p.digest, store.DENY)
    pending(timeout=0)  # its window is over
    other = tmp_path / "other-state"
    other.mkdir(mode=0o700)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(other))
    res = cli("events", "--filter", "approval", "--no-follow")
    assert res.stderr == f"state dir: {other}\n"


def test_links_are_never_followed(default_with_one: tuple[str, Path], tmp_path: Path) -> None:
    default, _ = default_with_one
    assert elsewhere.count_pending(default, os.geteuid()) == 1
    # approvals/ replaced by a link to a copy: not counted.
    approvals = Path(default) / "approvals"
    shutil.move(approvals, tmp_path / "moved")
    approvals.symlink_to(tmp_path / "moved")
    assert elsewhere.count_pending(default, os.geteuid()) == 0
    # The state dir itself a link: not counted either.
    os.unlink(approvals)
    shutil.move(tmp_path / "moved", approvals)
    link = tmp_path / "link-state"
    link.symlink_to(default)
    assert elsewhere.count_pending(str(link), os.geteuid()) == 0
    # A request.json that is a link: not counted.
    (apr,) = [d for d in approvals.iterdir() if d.name.startswith("apr_")]
    (apr / "request.json").rename(tmp_path / "req.json")
    (apr / "request.json").symlink_to(tmp_path / "req.json")
    assert elsewhere.count_pending(default, os.geteuid()) == 0


def test_another_users_dir_is_counted_only_when_it_is_theirs(
    default_with_one: tuple[str, Path],
) -> None:
    default, _ = default_with_one
    assert elsewhere.count_pending(default, os.geteuid() + 12345) == 0


def test_approve_of_an_unknown_id_names_the_state_dir_and_where_approvals_wait(
    cli: Any, default_with_one: tuple[str, Path]
) -> None:
    default, other = default_with_one
    res = cli("approve", "--non-interactive", "apr_01KB0000000000000000000000")
    assert res.exit_code == 4
    lines = res.stderr.splitlines()
    assert lines[0] == (
        f"error: approval not found: apr_01KB0000000000000000000000 (searched the state dir "
        f"{other.resolve()})"
    )
    assert lines[1] == (
        f"hint: approvals wait in another state dir: 1 pending in {default} "
        f"(LINPODX_STATE_DIR={default} linpodx events --filter approval)"
    )


def test_approve_of_an_unknown_id_with_nothing_elsewhere_says_where_to_look(cli: Any) -> None:
    res = cli("deny", "--non-interactive", "apr_01KB0000000000000000000000")
    assert res.exit_code == 4
    assert f"(searched the state dir {state_dir()})" in res.stderr
    assert "another LINPODX_STATE_DIR, or as another user (root through sudo" in res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="reading another user's state dir needs root")
def test_root_through_sudo_looks_at_the_users_own_state_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`sudo linpodx events` while the bridge runs as the person: root may read their dir."""
    user = pwd.getpwnam("linpodx-test")
    home = tmp_path / "user-home"
    d = home / ".local" / "state" / "linpodx"
    pending()
    shutil.copytree(state_dir(), d)
    for p in [home, *home.rglob("*")]:
        os.lchown(p, user.pw_uid, user.pw_gid)
    real = pwd.getpwuid

    def getpwuid(uid: int) -> Any:
        if uid != user.pw_uid:
            return real(uid)
        return pwd.struct_passwd((user.pw_name, "x", uid, user.pw_gid, "", str(home), "/bin/sh"))

    monkeypatch.setattr(elsewhere.pwd, "getpwuid", getpwuid)
    monkeypatch.setenv("SUDO_UID", str(user.pw_uid))
    found = elsewhere.pending_elsewhere(str(state_dir()))
    assert [(e.state_dir, e.pending) for e in found] == [(str(d), 1)]
    assert found[0].command == "linpodx events --filter approval (as linpodx-test, without sudo)"
    # Owned by root (not the user's own), the same files say nothing.
    for p in [home, *home.rglob("*")]:
        os.lchown(p, 0, 0)
    assert elsewhere.pending_elsewhere(str(state_dir())) == []


def test_a_listener_on_the_default_dir_hears_of_an_override_used_recently(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The bridge ran with LINPODX_STATE_DIR (a CI job), the person listens with the default."""
    from linpodx.paths import ensure_dir

    default = ensure_dir(state_dir())  # the person has used linpodx before
    other = tmp_path / "ci state"
    other.mkdir(mode=0o700)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(other))
    pending()
    monkeypatch.delenv("LINPODX_STATE_DIR")
    res = cli("events", "--filter", "approval", "--no-follow")
    assert res.stderr.splitlines() == [
        f"state dir: {default}",
        f"note: 1 approval pending in another state dir, {other}; to answer them: "
        f"LINPODX_STATE_DIR='{other}' linpodx events --filter approval",
    ]
    # A note older than a week is not read back.
    (note,) = (default / seen.SEEN_DIR).iterdir()
    old = time.time() - seen.KEEP_SECONDS - 60
    os.utime(note, (old, old))
    assert cli("events", "--filter", "approval", "--no-follow").stderr == (
        f"state dir: {default}\n"
    )
    # Nor is a note that is a link.
    target = tmp_path / "elsewhere-note"
    target.write_text(str(other))
    note.unlink()
    note.symlink_to(target)
    assert seen.recent(str(default)) == []


def test_notes_are_written_only_under_an_override_into_an_existing_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = state_dir()
    pending()  # no override: nothing noted
    assert not (default / seen.SEEN_DIR).exists()
    shutil.rmtree(default)
    other = tmp_path / "other-state"
    other.mkdir(mode=0o700)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(other))
    pending()  # the default is not there: not made for a note
    assert not default.exists()


def test_approve_names_its_state_dir_once_answered(cli: Any) -> None:
    p = pending()
    res = cli("approve", "--non-interactive", p.approval_id)
    assert res.exit_code == 0 and res.stderr == f"state dir: {state_dir()}\n"
    assert f"approval_id: {p.approval_id}" in res.stdout
