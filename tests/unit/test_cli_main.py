"""The CLI's last resort (`linpodx.cli.main`): failures no command turned into an error of its
own still end as `error:` + `hint:` (never "internal error" for what the machine caused), and
`--json` still gets its one document."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from linpodx.approvals import store
from linpodx.cli.main import main
from linpodx.errors import EXIT_AUDIT, EXIT_BUG, EXIT_INVALID, EXIT_NOT_FOUND, EXIT_USAGE


def test_a_state_dir_that_is_a_file_is_an_error_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_dir = tmp_path / "state"
    not_a_dir.write_text("")
    monkeypatch.setenv("LINPODX_STATE_DIR", str(not_a_dir))
    approve = ["approve", "--non-interactive", "apr_01M8PJZZ95HSXB42BQH7SC4ZVM"]
    for argv in (["events", "--no-follow"], approve):
        assert main(argv) == EXIT_AUDIT, argv
        err = capsys.readouterr().err
        assert err.startswith("error: cannot use linpodx's state dir: Not a directory: "), err
        assert f"hint: the state dir {not_a_dir} must be a directory you can write" in err
        assert "internal error" not in err


def test_a_full_state_dir_is_an_error_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    from linpodx.cli import approvals as cli_approvals
    from linpodx.paths import events_file

    def full(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(events_file()))

    monkeypatch.setattr(cli_approvals, "events_cmd", full)
    assert main(["events", "--no-follow", "--json"]) == EXIT_AUDIT
    out, err = capsys.readouterr()
    assert "error: cannot use linpodx's state dir: No space left on device" in err
    doc = json.loads(out)  # one line: `events --json` prints one object per line
    assert out.count("\n") == 1
    assert doc["ok"] is False and doc["command"] == "events"
    assert doc["error"]["exit_code"] == EXIT_AUDIT


def test_an_unexpected_error_is_still_one_json_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from linpodx.cli import approvals as cli_approvals

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli_approvals, "approve_or_deny", broken, raising=False)
    monkeypatch.setattr(cli_approvals, "events_cmd", broken)
    assert main(["events", "--no-follow", "--json"]) == EXIT_BUG
    out, err = capsys.readouterr()
    assert "error: internal error: RuntimeError: boom" in err
    assert json.loads(out)["error"]["exit_code"] == EXIT_BUG


def test_usage_errors_with_json_print_one_envelope(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sandbox", "show", "--json"]) == EXIT_USAGE  # the name is missing
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["command"] == "sandbox show" and doc["ok"] is False
    assert doc["error"]["exit_code"] == EXIT_USAGE
    assert "error: " in err and "hint: run `linpodx sandbox show --help`" in err


def test_a_command_that_printed_its_envelope_gets_no_second_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sandbox", "show", "nosuch", "--json"]) != 0
    out = capsys.readouterr().out
    assert json.loads(out)["ok"] is False  # exactly one document: json.loads takes no more


def test_mcp_attach_never_prints_an_envelope_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp", "attach", "--json", "--container", "x", "--", "srv"]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert "error: " in err


@pytest.mark.parametrize("since", ["1000000d", "99999999h", "999999999999s", "100000000000d"])
def test_since_too_far_back_is_a_usage_error(
    since: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", "--no-follow", "--since", since]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: --since {since} reaches back before the year 1" in err
    assert "hint: " in err


def test_relative_state_dir_is_refused_and_empty_means_unset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LINPODX_STATE_DIR", "rel/state")
    assert main(["events", "--no-follow"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "error: LINPODX_STATE_DIR must be an absolute path, not 'rel/state'" in err
    assert "hint: use LINPODX_STATE_DIR=$PWD/rel/state" in err
    assert not (tmp_path / "rel").exists()
    monkeypatch.setenv("LINPODX_STATE_DIR", "")
    assert main(["events", "--no-follow"]) == 0
    assert "error" not in capsys.readouterr().err


def test_a_damaged_approval_neither_stops_the_listener_nor_crashes_approve(
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = store.create("sess_x", "tools/call", "write_file", {"id": 1}, {"name": "w"}, 30)
    bad = store.create("sess_x", "tools/call", "write_file", {"id": 2}, {"name": "w"}, 30)
    req = store.approvals_dir() / bad.approval_id / "request.json"
    req.unlink()
    req.mkdir()  # a directory where the request belongs
    assert [p.approval_id for p in store.pending_requests()] == [good.approval_id]
    assert main(["events", "--no-follow", "--filter", "approval"]) == 0
    capsys.readouterr()
    assert main(["approve", "--non-interactive", bad.approval_id]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"error: approval request is unreadable: {bad.approval_id} (not a regular file)" in err
    assert "hint: its files under the state dir's approvals/ are damaged" in err
    # An answer that is not a file reads as a deny, never as an approval.
    ans = store.approvals_dir() / good.approval_id / "answer.json"
    ans.mkdir()
    read = store.read_answer(good.approval_id)
    assert read is not None and read.decision == store.DENY
    assert store.status(good.approval_id) == "denied"


def test_error_messages_never_carry_terminal_control(capsys: pytest.CaptureFixture[str]) -> None:
    """A file name (or podman's words, a container's name) quoted in an error is shown with its
    control characters escaped; the newlines between lines and tabs stay."""
    assert main(["sandbox", "validate", "y/\x1b[31mred\x9b.yml"]) != 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x9b" not in err
    assert "y/\\x1b[31mred\\x9b.yml" in err

    from linpodx.errors import LinpodxError
    from linpodx.output import print_error

    print_error(LinpodxError("podman failed\n  Error:\tboom\x07", "try\x1b]0;x\x07 again"))
    assert capsys.readouterr().err == (
        "error: podman failed\n  Error:\tboom\\x07\nhint: try\\x1b]0;x\\x07 again\n"
    )


def test_a_state_dir_path_that_is_not_a_directory_is_never_chmodded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`LINPODX_STATE_DIR=/dev/null`, run as root, once left /dev/null mode 0700 for the whole
    machine: the "tighten an existing state dir" step chmodded whatever the path named."""
    import stat

    from linpodx import paths

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o666)
    os.chmod(fifo, 0o666)  # noqa: S103 - world-writable like /dev/null, in tmp_path
    plain = tmp_path / "plain"
    plain.write_text("")
    plain.chmod(0o644)
    for path, mode in ((fifo, 0o666), (plain, 0o644)):
        with pytest.raises(NotADirectoryError):
            paths.ensure_dir(path)
        assert stat.S_IMODE(path.stat().st_mode) == mode
        monkeypatch.setenv("LINPODX_STATE_DIR", str(path))
        assert main(["sandbox", "rm", "nosuch"]) == EXIT_AUDIT
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "hint: " in err
        assert stat.S_IMODE(path.stat().st_mode) == mode


@pytest.mark.parametrize("json_mode", [False, True])
def test_ctrl_c_inside_a_command_says_interrupted(
    cli: Any, monkeypatch: pytest.MonkeyPatch, json_mode: bool
) -> None:
    """typer turns a KeyboardInterrupt into a bare exit 130; a command cut short must say so
    like any other failure (and with --json, in its envelope)."""
    from linpodx import containers

    def interrupted(*_args: Any, **_kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(containers, "stop", interrupted)
    res = cli("stop", "agent-1", *(["--json"] if json_mode else []))
    assert res.exit_code == 130
    assert res.stderr == "error: interrupted\n"
    if json_mode:
        doc = json.loads(res.stdout)
        assert doc["ok"] is False and doc["error"]["exit_code"] == 130
    else:
        assert res.stdout == ""


def test_unencodable_characters_are_escaped_the_way_json_escapes_them() -> None:
    import io

    from linpodx.output import UNENCODABLE

    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii", errors=UNENCODABLE)
    doc = {"a": "… → ≥ é \U0001f600"}
    stream.write(json.dumps(doc, ensure_ascii=False))
    stream.flush()
    assert json.loads(raw.getvalue().decode("ascii")) == doc


@pytest.mark.parametrize(
    "env",
    [
        {"PYTHONIOENCODING": "ascii"},
        {"PYTHONIOENCODING": "latin-1"},
        {"LC_ALL": "C", "PYTHONUTF8": "0"},
    ],
)
def test_a_terminal_that_is_not_utf8_still_gets_the_output(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`…`, `→`, `≥` used to end a command with UnicodeEncodeError (exit 70) after part of its
    output; they are written escaped instead, and `--json` stays JSON."""
    import subprocess
    import sys

    from linpodx import events

    state = tmp_path / "state"
    monkeypatch.setenv("LINPODX_STATE_DIR", str(state))
    events.emit(
        "mcp.decision", session="s\U0001f600", method="tools/call", tool="…", decision="allow"
    )
    base = {k: v for k, v in os.environ.items() if k not in ("LC_ALL", "LANG", "PYTHONUTF8")}
    for argv, is_json in (
        (["events", "--no-follow", "--since", "1d"], False),
        (["events", "--no-follow", "--since", "1d", "--json"], True),
        (["sandbox", "validate", str(tmp_path / "\u2192.yml"), "--json"], True),
        (["sandbox", "validate", str(tmp_path / "\u2192.yml")], False),
    ):
        res = subprocess.run(
            [sys.executable, "-m", "linpodx", *argv],
            capture_output=True,
            env={**base, **env},
            timeout=60,
        )
        assert b"internal error" not in res.stderr, (argv, res.stderr)
        assert res.returncode in (0, EXIT_NOT_FOUND), (argv, res.returncode, res.stderr)
        if is_json:
            json.loads(res.stdout.decode("ascii"))
        else:
            # `…` (the tool) or `→`; under LC_ALL=C argv's `→` arrives as three undecodable
            # bytes, which are escaped the same way.
            assert b"\\u" in res.stdout + res.stderr, (argv, res.stdout, res.stderr)


HUGE = "99999999999999999999999"


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "show", "--limit", HUGE],
        ["audit", "show", "--limit", "0"],
        ["audit", "show", "--limit", "-1"],
        ["stop", "c", "--time", HUGE],
        ["stop", "c", "--time", "-1"],
        ["_egress-guard", "--container", "c", "--control-fd", HUGE],
        ["_egress-guard", "--container", "c", "--control-fd", "-3"],
        ["_egress-guard", "--container", "c", "--control-fd", "999999"],
        ["_egress-guard", "--container", "c", "--control-fd", "0", "--wait", "nan"],
        ["_egress-guard", "--container", "c", "--control-fd", "0", "--wait", "inf"],
        ["_egress-guard", "--container", "c", "--control-fd", "0", "--wait", "-1"],
    ],
)
def test_integer_options_out_of_range_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A number too large for a machine integer (or negative where that means nothing) is a
    usage error with a hint, not an internal error (OverflowError, ValueError)."""
    assert main(argv) == EXIT_USAGE, argv
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "\nhint: " in err and "internal error" not in err, err
    assert main([*argv, "--json"] if argv[0] != "_egress-guard" else argv) == EXIT_USAGE
    out = capsys.readouterr().out
    if argv[0] != "_egress-guard":
        doc = json.loads(out)
        assert doc["error"]["exit_code"] == EXIT_USAGE and doc["error"]["hint"]


def test_a_full_disk_without_a_file_name_points_at_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write() that fails with ENOSPC names no file; the hint said "check that path", which
    named none. It names the state dir (and podman's storage) instead."""
    import errno

    from linpodx.cli.main import environment_error

    monkeypatch.setenv("LINPODX_STATE_DIR", str(tmp_path / "st"))
    err = environment_error(OSError(errno.ENOSPC, "No space left on device"))
    assert err is not None and err.message == "No space left on device"
    assert err.hint is not None and str(tmp_path / "st") in err.hint
    assert "that path" not in err.hint


class _ReaderGone:
    """stdout whose reader went away (`linpodx … --json | head -c1`): every write fails."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")  # as a StringIO says it

    def isatty(self) -> bool:
        return False


@pytest.mark.parametrize(
    "argv",
    [["sandbox", "validate", "missing.yaml", "--json"], ["events", "--no-follow", "--json",
                                                          "--since", "bogus"],
     ["completion", "--json"], ["sandbox", "nosuch", "--json"]],
    ids=["envelope", "events-line", "usage-envelope", "usage-envelope-group"],
)
def test_a_failure_whose_reader_went_away_is_still_said_and_keeps_its_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    """A failed command's `--json` envelope meets a closed pipe: the envelope is lost, the
    failure is not (it was exit 1 and nothing said), and never a traceback."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdout", _ReaderGone())
    code = main(argv)
    err = capsys.readouterr().err
    assert code == (4 if argv[:2] == ["sandbox", "validate"] else 2), err  # not found, usage
    assert err.startswith("error: ") and "hint: " in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []], ids=["version", "help", "bare"])
def test_the_root_fast_paths_whose_reader_went_away_end_quietly_with_status_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """`linpodx --help | head -1`: printed before the error boundary, these ended in a
    traceback when the reader had gone."""
    monkeypatch.setenv("COLUMNS", "100")  # the stored root help, not typer's
    monkeypatch.setattr("sys.stdout", _ReaderGone())
    assert main(argv) == 1
    assert capsys.readouterr().err == ""
