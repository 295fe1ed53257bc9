"""The state dir is the running user's, and nothing inside it sends linpodx elsewhere.

Whoever can write in the state dir decides what linpodx runs (stored run plans, profiles, run
specs) and where it writes: root using another user's state dir (`sudo -E` keeps
XDG_STATE_HOME) ran that user's edited run plan with `--privileged`; a link planted inside
(`containers -> /tmp/x`) made `run -d` write its lock and run spec outside; a FIFO where a run
spec or an egress policy belongs hung `start` and `sandbox apply`.

Run as root, another user's dir is made with chown (the test user, uid 1001); run as that
user, the effective uid is made to look like someone else's instead.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from linpodx import containers, namelock, paths
from linpodx.errors import EXIT_AUDIT, InvalidInput, LinpodxError
from linpodx.fsutil import NotRegularFile, atomic_write, read_regular
from tests.conftest import CliResult

Cli = Callable[..., CliResult]
ROOT = os.geteuid() == 0
OTHER_UID = 1001
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent-readonly.yml"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(paths, "_checked", {})
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    yield


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "fixstate"
    monkeypatch.setenv("LINPODX_STATE_DIR", str(d))
    return d


def _foreign(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `path` (a dir) look like another user's to linpodx."""
    if ROOT:
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        me = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: me + 4242)


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _refused(res: CliResult, *words: str) -> None:
    assert res.exit_code == EXIT_AUDIT, res.stderr
    assert res.stderr.startswith("error: ") and "\nhint: " in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    for w in words:
        assert w in res.stderr, res.stderr


# ---- the state dir itself ------------------------------------------------------------------


def test_a_fresh_state_dir_is_made_0700_and_used(cli: Cli, state: Path) -> None:
    (Path(os.environ["HOME"]) / "demo-project").mkdir()
    res = cli("sandbox", "apply", "--profile", str(EXAMPLE))
    assert res.exit_code == 0, res.stderr
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for d in (state / "profiles", state / "audit"):
        assert stat.S_IMODE(d.lstat().st_mode) == 0o700


def test_an_existing_0755_state_dir_of_ours_is_tightened_and_used(
    cli: Cli, state: Path
) -> None:
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    assert cli("sandbox", "list").exit_code == 0
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_a_linked_state_dir_of_ours_is_fine(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(tmp_path / "link"))
    with namelock.acquire("agent-1"):
        pass
    assert (real / "containers" / ".locks").is_dir()


@pytest.mark.parametrize("mode", [0o700, 0o777])
def test_another_users_state_dir_is_refused_and_left_alone(
    cli: Cli, state: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    """The probe's F2: root ran another user's stored plans, wrote into their 0777 dir."""
    state.mkdir()
    state.chmod(mode)
    (state / "profiles").mkdir()
    _foreign(state, monkeypatch)
    for args in (("sandbox", "list"), ("sandbox", "rm", "nosuch"), ("start", "agent-1")):
        res = cli(*args)
        _refused(res, str(state), "belongs to uid", f"{mode:04o}", "LINPODX_STATE_DIR")
    with pytest.raises(LinpodxError):
        namelock.acquire("agent-1")
    assert _tree(state) == ["profiles"]
    assert stat.S_IMODE(state.stat().st_mode) == mode


def test_a_state_dir_reached_through_xdg_state_home_is_checked_too(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sudo -E` keeps XDG_STATE_HOME, not only LINPODX_STATE_DIR."""
    xdg = tmp_path / "xdg"
    (xdg / "linpodx").mkdir(parents=True)
    monkeypatch.setenv("XDG_STATE_HOME", str(xdg))
    _foreign(xdg / "linpodx", monkeypatch)
    _refused(cli("sandbox", "list"), str(xdg / "linpodx"), "belongs to uid")


def test_a_state_dir_others_may_write_that_cannot_be_tightened_is_refused(
    cli: Cli, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state.mkdir()
    state.chmod(0o777)

    def no_chmod(path: object, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted", str(path))

    monkeypatch.setattr(paths.os, "chmod", no_chmod)
    _refused(cli("sandbox", "list"), str(state), "0777", "writable by others")


def test_doctor_reports_another_users_state_dir_as_a_failure(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from linpodx import doctor

    state.mkdir()
    _foreign(state, monkeypatch)
    report = doctor.Report()
    doctor.check_state(report)
    (check,) = [c for c in report.checks if c.name == "state dir"]
    assert check.status == doctor.FAIL
    assert "belongs to uid" in check.detail and str(state) in check.detail
    assert report.exit_code() != 0


# ---- directories inside it -----------------------------------------------------------------


@pytest.mark.parametrize("inside", ["containers", "audit", "profiles"])
def test_a_linked_directory_inside_the_state_dir_is_never_written_through(
    cli: Cli, state: Path, tmp_path: Path, inside: str
) -> None:
    """The probe's F3: `audit -> /tmp/x/audit`, `containers -> /tmp/x/cont`."""
    (Path(os.environ["HOME"]) / "demo-project").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    state.mkdir(mode=0o700)
    (state / inside).symlink_to(outside)
    if inside == "containers":
        with pytest.raises(LinpodxError, match="symbolic link"):
            namelock.acquire("agent-1")
        with pytest.raises(LinpodxError, match="symbolic link"):
            containers.save_spec("agent-1", {"version": 1})
    else:
        _refused(cli("sandbox", "apply", "--profile", str(EXAMPLE)), "symbolic link")
    assert _tree(outside) == []


def test_every_component_below_the_state_dir_is_checked(state: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "egress").mkdir(parents=True)
    (state / "containers").mkdir(parents=True)
    (state / "containers" / "agent-1").symlink_to(outside)
    deep = state / "containers" / "agent-1" / "egress"
    with pytest.raises(LinpodxError, match="agent-1 in linpodx's state dir is a symbolic link"):
        paths.ensure_dir(deep)
    with pytest.raises(LinpodxError):
        atomic_write(deep / "policy.json", b"{}", make_dir=False)
    (outside / "egress" / "policy.json").write_text("{}")
    with pytest.raises(LinpodxError):
        read_regular(deep / "policy.json", 100)
    assert _tree(outside) == ["egress", "egress/policy.json"]


def test_a_file_where_a_directory_belongs_inside_is_refused(state: Path) -> None:
    (state / "containers").mkdir(parents=True)
    (state / "containers" / ".locks").write_text("")
    with pytest.raises(NotADirectoryError):
        namelock.acquire("agent-1")


def test_an_audit_record_is_not_appended_through_a_linked_audit_dir(
    state: Path, tmp_path: Path
) -> None:
    from linpodx.audit import writer

    outside = tmp_path / "outside"
    outside.mkdir()
    state.mkdir(mode=0o700)
    (state / "audit").symlink_to(outside)
    (outside / "admin.jsonl").write_text("")
    assert writer.append_simple(paths.admin_log(), "container.run", {"name": "x"}) is False
    with pytest.raises(LinpodxError):
        os.close(writer.open_locked(paths.admin_log()))
    assert (outside / "admin.jsonl").read_text() == ""


def test_a_log_dir_replaced_after_an_append_is_checked_again(
    state: Path, tmp_path: Path
) -> None:
    """The writer keeps the log's directory open after its checks (one lstat per later
    append): a link put in its place, another directory made there, or its mode loosened
    are each seen by the next append, as by the first."""
    from linpodx.audit import writer
    from linpodx.audit.chain import Chain

    chain = Chain(Path(paths.admin_log()))
    chain.append("a.b", {"n": 1})
    audit = state / "audit"
    outside = tmp_path / "outside"
    audit.rename(outside)
    audit.symlink_to(outside)
    with pytest.raises(LinpodxError):
        chain.append("a.b", {"n": 2})
    assert writer.append_simple(str(chain.path), "a.b", {"n": 3}) is False
    assert (outside / "admin.jsonl").read_bytes().count(b"\n") == 1
    audit.unlink()
    chain.append("a.b", {"n": 4})  # a new directory, made again: the record goes there
    assert audit.is_dir() and not audit.is_symlink()
    assert (audit / "admin.jsonl").read_bytes().count(b"\n") == 1
    audit.chmod(0o755)
    assert writer.append_simple(str(chain.path), "a.b", {"n": 5}) is True
    assert stat.S_IMODE(audit.stat().st_mode) == 0o700
    assert (audit / "admin.jsonl").read_bytes().count(b"\n") == 2


@pytest.mark.skipif(not ROOT, reason="a directory of another uid inside ours needs chown")
def test_another_users_directory_inside_the_state_dir_is_refused(
    cli: Cli, state: Path
) -> None:
    (state / "containers").mkdir(parents=True, mode=0o700)
    os.chown(state / "containers", OTHER_UID, OTHER_UID)
    with pytest.raises(LinpodxError, match="belongs to uid 1001"):
        namelock.acquire("agent-1")
    with pytest.raises(LinpodxError, match="belongs to uid 1001"):
        containers.load_spec("agent-1")
    assert _tree(state / "containers") == []


# ---- files linpodx reads its decisions from ------------------------------------------------


def _spec_dir(state: Path) -> Path:
    d = state / "containers" / "agent-1"
    d.mkdir(parents=True)
    return d


@pytest.mark.usefixtures("watchdog")
def test_a_fifo_for_a_run_spec_is_damage_not_a_hang(state: Path) -> None:
    """The probe's F6: `start NAME` hung holding the name's lock."""
    from linpodx.snapshot import lifecycle

    os.mkfifo(_spec_dir(state) / "spec.json", 0o600)
    with pytest.raises(InvalidInput, match="run spec of agent-1 is damaged"):
        containers.load_spec("agent-1")
    assert containers.state._spec_container_id("agent-1") is None
    # Not "no run spec recorded": something is there, and it is not a spec.
    with pytest.raises(InvalidInput, match="run spec of agent-1 is damaged"):
        lifecycle.check_recreatable("agent-1", "prof_x")
    with pytest.raises(InvalidInput, match="damaged"):
        lifecycle.save_spec("agent-1")


def test_a_linked_or_oversized_run_spec_is_damage(state: Path, tmp_path: Path) -> None:
    d = _spec_dir(state)
    real = tmp_path / "spec.json"
    real.write_text('{"version": 1}')
    (d / "spec.json").symlink_to(real)
    with pytest.raises(InvalidInput, match="damaged"):
        containers.load_spec("agent-1")
    (d / "spec.json").unlink()
    (d / "spec.json").write_bytes(b" " * (containers.MAX_SPEC_BYTES + 1))
    with pytest.raises(InvalidInput, match="damaged"):
        containers.load_spec("agent-1")
    (d / "spec.json").unlink()
    (d / "spec.json").mkdir()
    with pytest.raises(InvalidInput, match="damaged"):
        containers.load_spec("agent-1")


@pytest.mark.usefixtures("watchdog")
def test_a_fifo_for_an_egress_policy_does_not_hang(state: Path) -> None:
    """The probe's F6: every `sandbox apply` hung in `guard._containers_of`."""
    from linpodx.egress import guard, runner
    from linpodx.egress.state import EgressState, read_guard

    st = EgressState("agent-1")
    st.ensure()
    os.mkfifo(st.policy_file, 0o600)
    assert guard._containers_of("demo") == []
    with pytest.raises(NotRegularFile):
        runner.load_policy(st, frozenset())
    for f in (st.guard_file, st.init_pidfile):
        os.mkfifo(f, 0o600)
    assert read_guard(st) is None
    assert guard.init_pid("agent-1") is None


def test_a_state_dir_named_through_a_link_is_used_by_its_real_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check follows the link once; re-pointing the link afterwards (at a directory of
    someone else's choosing) must not move where linpodx writes in the same process."""
    from linpodx import events

    real, elsewhere = tmp_path / "real", tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    elsewhere.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(link))
    assert paths.state_dir() == real
    link.unlink()
    link.symlink_to(elsewhere)
    events.emit("x.y", n=1)
    assert (real / "events.jsonl").exists()
    assert not (elsewhere / "events.jsonl").exists()


def test_a_state_dir_under_a_directory_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can write a directory above the state dir can put another in its place. /tmp
    is fine (sticky: nobody can rename another's entry); a plain 0777 directory is not."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "st").mkdir(mode=0o700)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(open_dir / "st"))
    from linpodx.errors import LinpodxError

    with pytest.raises(LinpodxError) as ei:
        paths.state_dir()
    assert "can be changed by someone else" in ei.value.message and ei.value.exit_code == 6
    open_dir.chmod(0o1777)  # sticky, as /tmp
    assert paths.state_dir() == open_dir / "st"


def test_a_link_planted_after_the_state_dirs_link_was_re_pointed_is_still_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paths are built from the real directory the check found; once the link that named it
    points elsewhere, they must still count as inside the state dir, and be checked as such."""
    real, elsewhere, outside = tmp_path / "real", tmp_path / "elsewhere", tmp_path / "outside"
    for d in (real, elsewhere, outside):
        d.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(link))
    assert paths.state_dir() == real
    link.unlink()
    link.symlink_to(elsewhere)
    (real / "containers").symlink_to(outside)
    with pytest.raises(LinpodxError, match="symbolic link"):
        namelock.acquire("agent-1")
    assert _tree(outside) == [] and _tree(elsewhere) == []


def test_the_state_dir_is_resolved_once_per_process(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every durable append checks its directory; resolving the state dir's name each time was
    a third of an append's CPU. Once checked, its real directory is what paths are built from."""
    d = paths.ensure_dir(paths.audit_dir())
    resolved: list[str] = []
    realpath = os.path.realpath

    def counting(p: str, *a: object, **kw: bool) -> str:
        resolved.append(p)
        return realpath(p, **kw)

    monkeypatch.setattr(os.path, "realpath", counting)
    for _ in range(3):
        paths.ensure_dir_str(str(d))
        paths.check_dir_str(str(d))
    assert resolved == []


def test_a_link_re_pointed_during_the_check_never_has_its_new_target_tightened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check looks at the directory the link names, then tightens it; a link re-pointed in
    between (at a directory of someone else's choosing: as root, /etc) must not have *that*
    directory's mode changed. The race is made certain by re-pointing it on the check's stat."""
    real, elsewhere = tmp_path / "real", tmp_path / "elsewhere"
    for d in (real, elsewhere):
        d.mkdir()
        d.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(link))
    plain_stat = os.stat

    def re_pointing(p: object, *a: object, **kw: object) -> os.stat_result:
        got = plain_stat(p, *a, **kw)  # type: ignore[arg-type]
        if os.fspath(p) == str(real) and os.readlink(link) == str(real):  # type: ignore[arg-type]
            link.unlink()
            link.symlink_to(elsewhere)
        return got

    monkeypatch.setattr(os, "stat", re_pointing)
    assert paths.state_dir() == real
    monkeypatch.setattr(os, "stat", plain_stat)
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755
    assert stat.S_IMODE(real.stat().st_mode) == 0o700
