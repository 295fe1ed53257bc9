"""The CLI's conventions (linpodx.cli.surface): `-h`, `--version`, `help`, `completion`, the man
page, help without Python types and our own words for bad values."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from linpodx import __version__
from linpodx.cli import main as cli_main
from linpodx.cli import surface

ROOT = Path(__file__).resolve().parents[2]
MAN = ROOT / "docs" / "man" / "linpodx.1"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = cli_main.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def every_command() -> list[tuple[str, ...]]:
    return [path[1:] for path, _cmd in surface.walk(cli_main.command_tree(None))]


# Python's types as typer shows them, its number ranges, and click's cut-off descriptions.
PYTHON_TYPES = re.compile(r"<(str|int|float|bool|path|list\[|int range|float range)|x<=|x>=")


@pytest.mark.parametrize("path", every_command(), ids=" ".join)
def test_help_of_every_command_has_no_python_types_and_h_is_help(
    capsys: pytest.CaptureFixture[str], path: tuple[str, ...]
) -> None:
    rc, out, err = run(capsys, *path, "--help")
    assert rc == 0 and err == ""
    assert not PYTHON_TYPES.search(out), out
    usage, _, body = out.partition("\n\n")
    assert not re.search(r"[\w,]\.\.\.$", body, re.MULTILINE), out  # no description cut off
    # A required argument reads `NAME` in the usage line, as in podman's (typer writes `{NAME}`).
    assert not re.search(r"[{}]", usage), out
    assert run(capsys, *path, "-h") == (0, out, "")
    assert run(capsys, "help", *path) == (0, out, "")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--version") == (0, f"linpodx {__version__}\n", "")
    assert run(capsys, "version") == (0, f"linpodx {__version__}\n", "")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("stop", "x", "--time", "abc"), "error: invalid value for --time/-t: expected a whole "
         "number\nhint: run `linpodx stop --help` for usage\n"),
        (("audit", "show", "--limit", "0"), "error: invalid value for --limit: expected a whole "
         "number from 1 to 1000000000\n"),
    ],
)  # fmt: skip
def test_bad_values_in_our_words(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], words: str
) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert err.startswith(words)
    assert "Input should" not in err


def test_a_group_without_a_command_shows_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "snapshot")
    assert rc == 0 and out.startswith("Usage: linpodx snapshot")


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "help", "nosuch")
    assert rc == 2 and out == ""
    assert err == "error: No such command 'nosuch'.\nhint: run `linpodx --help` for usage\n"


@pytest.mark.parametrize("shell", surface.SHELLS)
def test_completion_scripts(capsys: pytest.CaptureFixture[str], shell: str) -> None:
    rc, out, _ = run(capsys, "completion", shell)
    assert rc == 0 and surface.COMPLETE_VAR in out and "linpodx" in out
    rc, out, err = run(capsys, "completion", "tcsh")
    assert rc == 2 and "use one of bash, zsh, fish" in err


def test_completion_answers_the_shell() -> None:
    # What the bash script asks: the words so far and the cursor's word.
    env = {
        **os.environ,
        surface.COMPLETE_VAR: "complete_bash",
        "COMP_WORDS": "linpodx snaps",
        "COMP_CWORD": "1",
    }
    res = subprocess.run(
        [sys.executable, "-m", "linpodx"], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["snapshot"]
    env["COMP_WORDS"], env["COMP_CWORD"] = "linpodx run --pu", "2"
    res = subprocess.run(
        [sys.executable, "-m", "linpodx"], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.stdout.split() == ["--pull"]


def test_the_man_page_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "help", "--man")
    assert rc == 0
    assert out == MAN.read_text(), (
        "docs/man/linpodx.1 is out of date: run `linpodx help --man > docs/man/linpodx.1`"
    )
    for path in every_command():
        if path:
            assert f".SS {' '.join(path)}\n".replace("-", "\\-") in out


def test_man_with_a_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "help", "--man", "run")
    assert rc == 2 and out == ""
    assert err.startswith("error: --man prints the whole man page and takes no command (got `run`)")
    assert "`linpodx help run`" in err


def test_man_page_escapes_roff() -> None:
    assert surface._roff(".TH x\n'y -z \\ …") == "\\&.TH x \\&'y \\-z \\e \\[u2026]"


ROOT_HELP = ROOT / "linpodx" / "cli" / "roothelp.txt"


def test_the_stored_root_help_is_what_typer_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = ROOT_HELP.read_text()
    assert stored == surface.root_help_text(cli_main.command_tree(None)), (
        "linpodx/cli/roothelp.txt is out of date: run `python -m linpodx.cli.docgen`"
    )
    monkeypatch.setenv("COLUMNS", "80")
    for args in ([], ["-h"], ["--help"], ["help"]):
        assert run(capsys, *args) == (0, stored, "")
    # typer's own rendering, the stored text left aside: the same.
    monkeypatch.setattr(cli_main, "_stored_root_help", lambda: None)
    for args in ([], ["--help"]):
        assert run(capsys, *args) == (0, stored, "")


def test_a_narrow_terminal_gets_typers_own_wrapping(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and out != ROOT_HELP.read_text()
    assert max(len(line) for line in out.splitlines()) <= 60


def test_the_readme_names_the_commands_without_json_and_with_q() -> None:
    """README.md's list of the commands that have no `--json`, and of those with `-q`, is
    the command tree's."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"run's stdout is the container's\); (.*?) have no `--json`", readme)
    assert said, "README.md no longer lists the commands without --json"
    listed = set(re.findall(r"`([a-z][a-z ]*)`", said.group(1)))
    without, quiet = set(), set()
    for path, cmd in surface.walk(cli_main.command_tree(None)):
        opts = {o for p in cmd.params for o in p.opts}
        if len(path) > 1 and not getattr(cmd, "commands", None):
            if "--json" not in opts:
                without.add(" ".join(path[1:]))
            if "-q" in opts:
                quiet.add(" ".join(path[1:]))
    assert listed == without
    said_q = re.search(r"(`ps -q`.*?) print names", readme)
    assert said_q
    assert set(re.findall(r"`([a-z ]+?)(?: NAME)? -q`", said_q.group(1))) == quiet


# What a value is, as README.md and docs/ write it (`--to LABEL`, not typer's `--to TO`).
METAVARS = {
    ("snapshot", "rollback"): ("--to", "LABEL"),
    ("snapshot", "create"): ("--consistency", "MODE"),
    ("events",): ("--since", "TIME"),
    ("audit", "verify"): ("--anchor", "SEQ:HASH"),
    ("audit", "show"): ("--session", "ID"),
    ("attach",): ("--detach-keys", "KEYS"),
    ("mcp", "attach"): ("--container", "NAME"),
}


@pytest.mark.parametrize("path", list(METAVARS), ids=" ".join)
def test_an_options_value_is_named_as_the_docs_name_it(
    capsys: pytest.CaptureFixture[str], path: tuple[str, ...]
) -> None:
    option, metavar = METAVARS[path]
    _rc, out, _ = run(capsys, *path, "--help")
    assert re.search(rf"{option} {re.escape(metavar)}\s", out), out
    if path == ("events",):
        assert re.search(r"--filter TYPE\s", out), out


def test_stop_time_says_its_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    from linpodx.containers import STOP_TIME_MAX

    _rc, out, _ = run(capsys, "stop", "--help")
    assert f"(from 0 to {STOP_TIME_MAX})" in " ".join(out.split()), out
