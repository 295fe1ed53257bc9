"""`linpodx ps`'s plain forms skip typer (linpodx.cli.pscmd): the same rows and table as
typer's command, without its ~0.3 s of start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from linpodx.cli import main as cli_main
from linpodx.cli import pscmd
from linpodx.containers import runner
from tests.unit.test_cli_containers import FakeEngine


@pytest.fixture
def fake() -> Iterator[FakeEngine]:
    f = FakeEngine()
    with runner.use(f):
        yield f


@pytest.mark.parametrize(
    ("args", "parsed"),
    [
        ((), (False, False)),
        (("-a",), (True, False)),
        (("--all", "--json"), (True, True)),
        (("--json", "-a"), (True, True)),
        (("-a", "--all"), None),  # repeated: typer decides
        (("--help",), None),
        (("-h",), None),
        (("-q",), None),
        (("--format", "json"), None),
        (("x",), None),
    ],
)
def test_plain_forms(args: tuple[str, ...], parsed: tuple[bool, bool] | None) -> None:
    assert pscmd.parse(args) == parsed


@pytest.mark.parametrize(
    "args", [["ps"], ["ps", "--all"], ["ps", "--json"], ["ps", "-a", "--json"]]
)
def test_both_parsers_print_the_same(
    fake: FakeEngine, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert cli_main.main(args) == 0
    fast = capsys.readouterr()
    # typer's own command, as `linpodx ps` ran it before it had a plain form.
    tree = cli_main.command_tree("ps")
    assert tree.main(args=args, prog_name="linpodx", standalone_mode=False) == 0
    slow = capsys.readouterr()
    assert (fast.out, fast.err) == (slow.out, slow.err)
    assert "agent-1" in fast.out
    if "--json" in args:
        assert json.loads(fast.out)["command"] == "ps"


def test_plain_ps_never_imports_typer(tmp_path: Path) -> None:
    # A stand-in podman that lists no containers: this is about what linpodx imports.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman").write_text('#!/bin/sh\n[ "$1" = ps ] && echo "[]" && exit 0\nexit 1\n')
    (bindir / "podman").chmod(0o755)
    code = (
        "import sys\nfrom linpodx.cli.main import main\nrc = main(['ps', '--json'])\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'click', "
        "'pydantic')), file=sys.stderr)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.stderr.strip().splitlines()[-1] == "0 []", res.stderr
    assert json.loads(res.stdout)["result"] == {"containers": []}


def test_a_failure_is_the_one_boundarys(fake: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from linpodx.errors import EngineError

    def broken(all_states: bool) -> list[dict[str, Any]]:
        raise EngineError("podman ps failed (exit 125)", "see podman's message above")

    fake.list_managed = broken
    assert cli_main.main(["ps", "--json"]) == 5
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False
    assert err.startswith("error: podman ps failed (exit 125)\nhint: see podman's message")


def test_a_plain_ps_leaves_without_the_interpreters_teardown(
    fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The teardown of the modules `ps` loaded is ~15% of `podman ps` (bench/bench_cli.py);
    `entry` leaves by `os._exit` once the table is flushed, as after a fast run."""
    left: list[int] = []

    def leave(code: int) -> None:
        left.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(cli_main, "_nothing_left", False)
    monkeypatch.setattr(os, "_exit", leave)
    monkeypatch.setattr(sys, "argv", ["linpodx", "ps"])
    with pytest.raises(SystemExit):
        cli_main.entry()
    assert left == [0] and "agent-1" in capsys.readouterr().out
    # Through typer (`ps -q`), the interpreter ends as usual.
    monkeypatch.setattr(cli_main, "_nothing_left", False)
    monkeypatch.setattr(sys, "argv", ["linpodx", "ps", "-q"])
    with pytest.raises(SystemExit) as ended:
        cli_main.entry()
    assert left == [0] and ended.value.code == 0
