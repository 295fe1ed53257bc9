"""A bad value for any parameter of any command ends in linpodx's own words (issue 24).

The command tree is walked (`surface.walk`): every parameter that takes a value must have a
row in CASES (or be free text, FREE_TEXT), so a new option cannot arrive without one. Each row
gives the command line and bad values with the exit status the README's table names for them;
a parameter with a declared type (a number, a range, a path, an enum or `Literal`) also gets
bad values made from that type. Every one must give `error: …` + `hint: …` on stderr, nothing
on stdout, no traceback and none of pydantic's or click's words; with `--json`, one envelope
that carries the same status.
"""

from __future__ import annotations

import datetime
import enum
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import typer

from linpodx.cli import main as cli_main
from linpodx.cli import surface
from linpodx.cli.common import new_app
from linpodx.containers import runner
from linpodx.errors import EXIT_INVALID, EXIT_NOT_FOUND, EXIT_USAGE
from tests.unit.test_cli_containers import FakeEngine

# What pydantic and click say about a value, and Python's own words: never shown.
THEIR_WORDS = re.compile(
    r"Input should|Invalid value for|is not one of|Value error|Traceback|valid integer"
    r"|<class |NoneType"
)

BAD_NAME = ("bad name!", EXIT_INVALID, "invalid container name")
NO_PROFILE = ("nothere", EXIT_NOT_FOUND, "profile not found: nothere")
NO_APPROVAL = ("apr_nope", EXIT_NOT_FOUND, "approval not found")
NOT_AN_APPROVAL_ID = ("apr_nope", EXIT_USAGE, "not an approval id")  # (checked first: approve)
BAD_LABEL = ("", EXIT_INVALID, "invalid snapshot label")
MISSING_FILE = ("{tmp}/missing.yml", EXIT_NOT_FOUND, "not found")


@dataclass(frozen=True)
class Row:
    argv: str
    """The command line, words separated by spaces; `{}` is where the bad value goes."""
    values: tuple[tuple[str, int, str], ...] = ()
    """(bad value, exit status, words the `error:` line holds), besides those made from the
    parameter's declared type."""


CASES: dict[tuple[str, str], Row] = {
    ("approvals show", "approval_id"): Row("approvals show {}", (NO_APPROVAL,)),
    ("approve", "approval_id"): Row("approve --non-interactive {}", (NOT_AN_APPROVAL_ID,)),
    ("deny", "approval_id"): Row("deny --non-interactive {}", (NOT_AN_APPROVAL_ID,)),
    ("attach", "name"): Row("attach {}", (BAD_NAME,)),
    ("attach", "detach_keys"): Row(
        "attach agent-1 --detach-keys {}",
        (("bogus", EXIT_USAGE, "invalid --detach-keys"),
         ("ctrl-5", EXIT_USAGE, "invalid --detach-keys"),
         ("a,,b", EXIT_USAGE, "invalid --detach-keys")),
    ),
    ("audit seal", "session"): Row(
        "audit seal --session {}", (("sess_nope", EXIT_NOT_FOUND, "no audit log"),)
    ),
    ("audit show", "session"): Row(
        "audit show --session {}", (("sess_nope", EXIT_NOT_FOUND, "no audit log"),)
    ),
    ("audit show", "limit"): Row("audit show --limit {}"),
    ("audit verify", "session"): Row(
        "audit verify --session {}", (("sess_nope", EXIT_NOT_FOUND, "no audit log"),)
    ),
    ("audit verify", "anchor"): Row(
        "audit verify --anchor {}",
        (("bogus", EXIT_USAGE, "invalid anchor"), ("", EXIT_USAGE, "invalid anchor")),
    ),
    ("completion", "shell"): Row(
        "completion {}",
        (("tcsh", EXIT_USAGE, "no completion for shell"),
         ("", EXIT_USAGE, "no completion for shell")),
    ),
    ("events", "filter_"): Row(
        "events --no-follow --filter {}",
        (("bogus", EXIT_USAGE, "unknown event type"), ("", EXIT_USAGE, "unknown event type")),
    ),
    ("events", "since"): Row(
        "events --no-follow --since {}",
        (("bogus", EXIT_USAGE, "invalid --since"), ("-5m", EXIT_USAGE, "invalid --since"),
         ("", EXIT_USAGE, "invalid --since"),
         ("99999999999999h", EXIT_USAGE, "before the year 1")),
    ),
    ("exec", "name"): Row("exec {} -- true", (BAD_NAME,)),
    ("help", "words"): Row("help {}", (("nosuch", EXIT_USAGE, "No such command"),)),
    ("logs", "name"): Row("logs {}", (BAD_NAME,)),
    ("mcp attach", "container"): Row("mcp attach --container {} -- srv", (BAD_NAME,)),
    ("rm", "name"): Row("rm {}", (BAD_NAME, ("", EXIT_INVALID, "invalid container name"))),
    ("run", "image"): Row(
        "run -d --image {} -- true",
        (("bad image!", EXIT_INVALID, "invalid image reference"),
         ("", EXIT_INVALID, "invalid image reference")),
    ),
    ("run", "profile"): Row(
        "run -d --image img --profile {} -- true",
        (NO_PROFILE, ("../x.yml", EXIT_USAGE, "not a file")),
    ),
    ("run", "name"): Row("run -d --image img --name {} -- true", (BAD_NAME,)),
    ("run", "pull"): Row(
        "run -d --image img --pull {} -- true",
        (("bogus", EXIT_USAGE, "invalid --pull value"), ("", EXIT_USAGE, "invalid --pull value")),
    ),
    ("run", "env"): Row(
        "run -d --image img -e {} -- true",
        (("=x", EXIT_INVALID, "invalid environment variable name"),
         ("A B=1", EXIT_INVALID, "invalid environment variable name")),
    ),
    ("run", "env_file"): Row(
        "run -d --image img --env-file {} -- true",
        (("{tmp}/missing.env", EXIT_NOT_FOUND, "env file not found"),),
    ),
    ("run", "secret"): Row(
        "run -d --image img --secret {} -- true",
        (("", EXIT_INVALID, "invalid secret name"),
         ("a,bogus=1", EXIT_INVALID, "invalid --secret option")),
    ),
    ("sandbox apply", "profile"): Row("sandbox apply --profile {}", (MISSING_FILE,)),
    ("sandbox validate", "file"): Row("sandbox validate {}", (MISSING_FILE,)),
    ("sandbox rm", "name"): Row("sandbox rm {}", (NO_PROFILE,)),
    ("sandbox show", "name"): Row("sandbox show {}", (NO_PROFILE,)),
    ("sandbox show", "fmt"): Row(
        "sandbox show nothere --format {}",
        (("xml", EXIT_USAGE, "unknown --format"), ("", EXIT_USAGE, "unknown --format")),
    ),
    ("snapshot create", "name"): Row("snapshot create {} --label l1", (BAD_NAME,)),
    ("snapshot create", "label"): Row("snapshot create agent-1 --label {}", (BAD_LABEL,)),
    ("snapshot create", "consistency"): Row(
        "snapshot create agent-1 --label l1 --consistency {}",
        (("bogus", EXIT_USAGE, "unknown --consistency"),
         ("", EXIT_USAGE, "unknown --consistency")),
    ),
    ("snapshot job-status", "job_id"): Row(
        "snapshot job-status {}", (("nope", EXIT_INVALID, "invalid job id"),)
    ),
    ("snapshot list", "name"): Row("snapshot list {}", (BAD_NAME,)),
    ("snapshot recover", "name"): Row("snapshot recover {}", (BAD_NAME,)),
    ("snapshot rm", "name"): Row("snapshot rm {} --label l1", (BAD_NAME,)),
    ("snapshot rm", "label"): Row("snapshot rm agent-1 --label {}", (BAD_LABEL,)),
    ("snapshot rollback", "name"): Row("snapshot rollback {} --to l1", (BAD_NAME,)),
    ("snapshot rollback", "to"): Row("snapshot rollback agent-1 --to {}", (BAD_LABEL,)),
    ("start", "name"): Row("start {}", (BAD_NAME,)),
    ("stop", "name"): Row("stop {}", (BAD_NAME,)),
    ("stop", "time"): Row(
        "stop agent-1 --time {}",
        (("-5", EXIT_USAGE, "--time must be between 0 and 86400"),
         ("99999999999999999999", EXIT_USAGE, "--time must be between 0 and 86400")),
    ),
}

FREE_TEXT = {
    ("exec", "command"): "the container's command: any words",
    ("run", "command"): "the container's command: any words",
    ("mcp attach", "command"): "the MCP server's command line: any words",
}


def _tree() -> Any:
    return cli_main.command_tree(None)


def valued_params() -> Iterator[tuple[str, Any, Any]]:
    """(command, its click command, parameter) for every parameter that takes a value."""
    for path, cmd in surface.walk(_tree()):
        for param in cmd.params:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                continue
            yield " ".join(path[1:]), cmd, param


def _what(param: Any) -> str:
    if param.param_type_name == "argument":
        return str(param.metavar or param.name).upper()
    return "/".join(sorted(param.opts, key=len, reverse=True))


def typed_values(param: Any) -> list[tuple[str, int, str]]:
    """Bad values made from the parameter's declared type, and the words each must get."""
    kind = surface._kind(param)
    if kind is None or kind == "a path":  # a path is judged by the command (MISSING_FILE)
        return []
    range_words = surface.range_words(param)
    words = f"invalid value for {_what(param)}: expected {kind}"
    if range_words:
        words += f" {range_words}"
    values = ["", "bogus"]
    if kind in ("a whole number", "a number"):
        values += ["1.5x", "99999999999999999999999999x"]
        if kind == "a whole number":
            values.append("1.5")
        lo, hi = surface._range(param)
        values += [str(int(lo) - 1)] if lo is not None else []
        values += [str(int(hi) + 1), "9" * 40] if hi is not None else []
    return [(v, EXIT_USAGE, words) for v in values]


def _cases() -> Iterator[Any]:
    for command, cmd, param in valued_params():
        row = CASES.get((command, str(param.name)))
        if row is None:
            continue  # test_every_parameter_that_takes_a_value_has_a_row says so
        has_json = any("--json" in p.opts for p in cmd.params)
        for value, status, words in (*row.values, *typed_values(param)):
            yield pytest.param(
                row.argv, value, status, words, has_json,
                id=f"{command} {param.name}={value!r}",
            )  # fmt: skip


def test_every_parameter_that_takes_a_value_has_a_row() -> None:
    have = {(command, str(param.name)) for command, _cmd, param in valued_params()}
    missing = have - set(CASES) - set(FREE_TEXT)
    assert not missing, f"give these a row in CASES (a bad value and its exit status): {missing}"
    assert not set(CASES) - have, "rows for parameters that are gone"
    assert not set(CASES) & set(FREE_TEXT)


@pytest.fixture
def fake() -> Iterator[FakeEngine]:
    f = FakeEngine()
    f.present.add("agent-1")
    with runner.use(f):
        yield f


@pytest.mark.parametrize(("argv", "value", "status", "words", "has_json"), list(_cases()))
def test_a_bad_value_gets_our_words_and_its_status(
    argv: str, value: str, status: int, words: str, has_json: bool, cli: Any, tmp_path: Path,
    fake: FakeEngine,
) -> None:  # fmt: skip
    args = [value.replace("{tmp}", str(tmp_path)) if w == "{}" else w for w in argv.split(" ")]
    res = cli(*args)
    assert res.exit_code == status, (args, res.stderr)
    assert res.stdout == "", res.stdout
    assert res.stderr.startswith("error: ") and "\nhint: " in res.stderr, res.stderr
    assert words in res.stderr.splitlines()[0], res.stderr
    assert not THEIR_WORDS.search(res.stderr), res.stderr
    if not has_json:
        return
    end = args.index("--") if "--" in args else len(args)
    res = cli(*args[:end], "--json", *args[end:])
    assert res.exit_code == status, (args, res.stderr)
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["exit_code"] == status, doc
    assert not THEIR_WORDS.search(doc["error"]["message"]), doc
    # One name for one kind: a usage error is a UsageError whichever layer found it.
    assert (doc["error"]["type"] == "UsageError") == (status == EXIT_USAGE), doc


@pytest.mark.parametrize(
    "args",
    [["audit", "show", "--limit"], ["run", "--image"], ["snapshot", "create", "x", "--label"]],
)
def test_an_option_without_its_value_points_at_its_commands_help(
    args: list[str], cli: Any
) -> None:
    res = cli(*args)
    assert res.exit_code == EXIT_USAGE and res.stdout == ""
    command = " ".join(a for a in args[:2] if a not in ("x", "--image"))
    assert f"hint: run `linpodx {command} --help` for usage" in res.stderr, res.stderr


# Types no command declares today: a new option of one of them gets our words too.
class Colour(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


def _typed_app() -> Any:
    app = new_app("typed")

    @app.command("c")
    def c(
        colour: Annotated[Colour, typer.Option()] = Colour.RED,
        mode: Annotated[Literal["fast", "safe"], typer.Option()] = "fast",
        one: Annotated[Literal["only"] | None, typer.Option()] = None,
        ratio: Annotated[float, typer.Option(min=0.5)] = 1.0,
        when: Annotated[datetime.datetime | None, typer.Option()] = None,
        day: Annotated[datetime.date | None, typer.Option()] = None,
        ident: Annotated[uuid.UUID | None, typer.Option()] = None,
        counts: Annotated[list[int] | None, typer.Option()] = None,
    ) -> None:
        pass

    @app.command("d")
    def d() -> None:
        pass

    return surface.tidy(typer.main.get_command(app))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--colour", "green"], "invalid value for --colour: expected one of red, blue"),
        (["--mode", "slow"], "invalid value for --mode: expected one of fast, safe"),
        (["--one", "other"], "invalid value for --one: expected one of only"),
        (["--ratio", "x"], "invalid value for --ratio: expected a number at least 0.5"),
        (["--ratio", "0.1"], "invalid value for --ratio: expected a number at least 0.5"),
        (["--when", "x"], "invalid value for --when: expected a date and time like "),
        (["--day", "x"], "invalid value for --day: expected a date like 2026-11-30"),
        (["--ident", "x"], "invalid value for --ident: expected a UUID"),
        (["--counts", "x"], "invalid value for --counts: expected a whole number"),
    ],
)
def test_every_declared_type_is_worded_by_us(args: list[str], words: str) -> None:
    click = surface.click_exceptions()
    with pytest.raises(click.BadParameter) as caught:
        _typed_app().main(args=["c", *args], standalone_mode=False)
    said = surface.bad_value(caught.value)
    assert said.startswith(words), said
    assert not THEIR_WORDS.search(said), said


def test_a_callbacks_own_words_are_kept_and_theirs_are_not() -> None:
    click = surface.click_exceptions()
    param = next(p for p in _typed_app().commands["c"].params if p.name == "when")
    param.type_descriptor = None  # a type linpodx has no words for
    assert surface.bad_value(click.BadParameter("too late", param=param)) == (
        "invalid value for --when: too late"
    )
    assert surface.bad_value(click.BadParameter("Input should be a valid x", param=param)) == (
        "invalid value for --when"
    )
    assert surface.bad_value(click.BadParameter("too late")) == "invalid value: too late"


def test_choices_are_in_the_help() -> None:
    ctx = type(_typed_app()).context_class(_typed_app().commands["c"], info_name="c")
    text = ctx.get_help()
    assert "(one of red, blue)" in text and "(one of fast, safe)" in text, text
