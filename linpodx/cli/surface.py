"""The CLI's conventions on top of typer: help without Python types, whole descriptions, our own
words for bad values, `help`, `--version`, `completion` and the man page built from the same
help text.

typer (≥0.29) shows a parameter's Python type in help (`<list[str]>`, `<int range>
[1<=x<=1000000000]`), cuts a command's description in the command list at 45 characters, and
reports a bad value in pydantic's words (`Input should be a valid integer…`). `tidy` walks the
command tree once it is built and gives every parameter a metavar (`--time N`, `NAME`), its
range in words, and every command its whole first paragraph as its short help; `bad_value`
words a bad value from the parameter's declared type. tests/unit/test_cli_surface.py holds the
help of every command to this.

typer ≥0.29 vendors its own copy of click (`typer._click`), older releases use click itself:
`click_exceptions` is the one place that knows which.
"""

from __future__ import annotations

import datetime
import enum
import re
import uuid
from pathlib import Path
from types import ModuleType, UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import typer

from linpodx.cli.common import JsonOpt

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

PROG = "linpodx"
HELP = "Run an AI agent's CLI inside a rootless Podman sandbox. No daemon."
"""What linpodx is, in one line: the root's help and the man page's NAME."""
COMPLETE_VAR = "_LINPODX_COMPLETE"
"""The variable the completion scripts set when they ask linpodx for completions."""
SHELLS = ("bash", "zsh", "fish")
HELP_OPTIONS = ["-h", "--help"]


def click_exceptions() -> ModuleType:
    """The module of the click exception classes the running typer raises."""
    try:
        from typer._click import exceptions
    except ImportError:  # typer < 0.29 uses click itself
        from click import exceptions  # type: ignore[no-redef]
    return exceptions


def _annotation(param: Any) -> Any:
    desc = getattr(param, "type_descriptor", None)
    return getattr(desc, "annotation", None)


def _element(annotation: Any) -> Any:
    """`int` for `list[int]`, `int | None` → `int`: what one value of the parameter is."""
    origin = get_origin(annotation)
    if origin is list:
        return _element(get_args(annotation)[0])
    args = [a for a in get_args(annotation) if a is not type(None)]
    # Only a union is unwrapped: `Literal["a"]` has one argument too, and is the type itself.
    if origin in (Union, UnionType) and len(args) == 1:
        return _element(args[0])
    return annotation


def choices(param: Any) -> list[str] | None:
    """The values an enum or `Literal` parameter takes, in declared order (None: not one)."""
    element = _element(_annotation(param))
    if isinstance(element, type) and issubclass(element, enum.Enum):
        return [str(member.value) for member in element]
    if get_origin(element) is Literal:
        return [str(arg) for arg in get_args(element)]
    return None


def _range(param: Any) -> tuple[Any, Any]:
    info = getattr(getattr(param, "type_descriptor", None), "parameter_info", None)
    lo, hi = getattr(info, "min", None), getattr(info, "max", None)
    if lo is None and hi is None:
        lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    return lo, hi


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def range_words(param: Any) -> str | None:
    """`from 1 to 1000000000`, `at least 0`, … for a number parameter with bounds."""
    lo, hi = _range(param)
    if lo is not None and hi is not None:
        return f"from {_num(lo)} to {_num(hi)}"
    if lo is not None:
        return f"at least {_num(lo)}"
    if hi is not None:
        return f"at most {_num(hi)}"
    return None


# What one value of a type must be, in words (`_kind`); a subclass reads as its base.
_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "true or false"),
    (int, "a whole number"),
    (float, "a number"),
    (Path, "a path"),
    (datetime.datetime, "a date and time like 2026-11-30T04:00:00"),
    (datetime.date, "a date like 2026-11-30"),
    (uuid.UUID, "a UUID"),
)


def _kind(param: Any) -> str | None:
    """What one value must be, in words (None for free text, or a type without words here)."""
    values = choices(param)
    if values is not None:
        return "one of " + ", ".join(values)
    element = _element(_annotation(param))
    for cls, words in _KINDS:
        if isinstance(element, type) and issubclass(element, cls):
            return words
    return None


def _metavar(param: Any) -> str:
    from pathlib import Path

    element = _element(_annotation(param))
    if element in (int, float):
        return "N"
    if isinstance(element, type) and issubclass(element, Path):
        return "FILE"
    longs = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    base = longs[0][2:] if longs else str(param.name)
    return base.replace("-", "_").upper()


def _no_type(*_args: Any, **_kw: Any) -> None:
    return None


def _bare_usage_name(param: Any) -> Callable[[], str]:
    """An argument in the usage line as podman and man pages write it: `NAME` when required
    (typer ≥0.29 writes `{NAME}`), `[NAME]` when not, `...` after one that repeats."""

    def name() -> str:
        shown = str(param.metavar or param.name).upper()
        shown = shown if param.required else f"[{shown}]"
        return shown + ("..." if param.nargs != 1 else "")

    return name


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n", 1)[0].split())


def walk(command: Any, path: tuple[str, ...] = (PROG,)) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the tree with its path (`("linpodx", "audit", "show")`), groups first,
    hidden ones left out."""
    yield path, command
    for name in sorted(getattr(command, "commands", {}) or {}):
        sub = command.commands[name]
        if not getattr(sub, "hidden", False):
            yield from walk(sub, (*path, name))


def tidy(command: Any) -> Any:
    """Give the command tree linpodx's help conventions (see the module's docstring)."""
    for _path, cmd in walk(command):
        if cmd.help and not cmd.short_help:
            cmd.short_help = _first_paragraph(cmd.help)
        for param in cmd.params:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                continue
            if param.param_type_name == "argument":
                if param.metavar is None:
                    param.metavar = str(param.name).upper()
                # An argument's help shows its type beside even a metavar: not ours.
                param.display_type_rich = _no_type
                if hasattr(param, "_usage_display_name"):
                    param._usage_display_name = _bare_usage_name(param)
                continue
            if param.metavar is None:
                param.metavar = _metavar(param)
            values = choices(param)
            if values is not None and "one of" not in (param.help or ""):
                # typer's metavar would be the Python name; the values are what one types.
                text = (param.help or "").rstrip().rstrip(".")
                param.help = f"{text} (one of {', '.join(values)}).".lstrip()
            words = range_words(param)
            if words is not None:
                # typer's `[1<=x<=…]`: in words instead (the bounds still apply: typer checks
                # them from the declaration, not from these attributes).
                param.min = param.max = None
                text = (param.help or "").rstrip().rstrip(".")
                param.help = f"{text} ({words}).".lstrip()
    return command


# What typer (pydantic) and click say about a value, which is never shown as it is.
_THEIR_WORDS = re.compile(r"Input should|Value error|is not one of|Invalid value", re.IGNORECASE)


def bad_value(exc: Any) -> str:
    """Our words for any BadParameter: what the value must be, from the parameter's declared
    type (a number, a path, one of an enum's or `Literal`'s values, …); for a type without
    words here, or a callback's own BadParameter, its message unless it is pydantic's or
    click's."""
    param = getattr(exc, "param", None)
    said = str(getattr(exc, "message", "") or "").strip()
    own = "" if not said or _THEIR_WORDS.search(said) else f": {said}"
    if param is None:
        return f"invalid value{own}"
    if param.param_type_name == "argument":
        what = str(param.metavar or param.name).upper()
    else:
        what = "/".join(sorted(param.opts, key=len, reverse=True))
    kind = _kind(param)
    if kind is None:
        return f"invalid value for {what}{own}"
    words = range_words(param)
    return f"invalid value for {what}: expected {kind}{' ' + words if words else ''}"


# A man page (roff, man(7)) from the same help text.
_ROFF_START = re.compile(r"^([.'])", re.MULTILINE)


def _roff(text: str) -> str:
    """Plain text as roff: backslashes and leading dots/quotes escaped, blank lines as `.PP`."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = _ROFF_START.sub(r"\\&\1", text)
    # Non-ASCII (…, —) as groff's named Unicode escapes: any troff reads the page.
    text = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)
    return "\n.PP\n".join(" ".join(p.split()) for p in text.strip().split("\n\n") if p.strip())


def man_page(root: Any, version: str) -> str:
    """linpodx(1): every command's usage, description and options, from the help text."""
    ctx_class = type(root).context_class
    out = [
        '.\\" Generated by `linpodx help --man` from the CLI\'s own help; do not edit.',
        f'.TH LINPODX 1 "" "linpodx {version}" "User Commands"',
        ".SH NAME",
        f"linpodx \\- {_roff(HELP)}",
        ".SH SYNOPSIS",
        ".B linpodx",
        "[\\fB\\-h\\fR] [\\fB\\-\\-version\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        _roff(root.help or HELP),
        ".PP",
        "\\fB\\-h\\fR and \\fB\\-\\-help\\fR show the help of any command; "
        "\\fBlinpodx help\\fR \\fICOMMAND\\fR does the same.",
        ".SH COMMANDS",
    ]
    parent = ctx_class(root, info_name=PROG)
    for path, cmd in walk(root):
        if len(path) == 1:
            continue
        ctx = ctx_class(cmd, info_name=path[-1], parent=parent)
        usage = " ".join(cmd.collect_usage_pieces(ctx))
        out.append(".SS " + _roff(" ".join(path[1:])))
        out.append(f".B {_roff(' '.join(path))}")
        out.append(_roff(usage))
        out.append(".PP")
        out.append(_roff(cmd.help or cmd.short_help or ""))
        for param in cmd.params:
            record = param.get_help_record(ctx)
            if record is None:
                continue
            out.append(".TP")
            out.append(f"\\fB{_roff(record[0])}\\fR")
            out.append(_roff(record[1]) or "\\&")
    out += [
        ".SH ENVIRONMENT",
        ".TP",
        "\\fBLINPODX_STATE_DIR\\fR",
        "linpodx's state dir (profiles, audit chains, run specs); default "
        "\\fI$XDG_STATE_HOME/linpodx\\fR.",
        ".TP",
        "\\fBLINPODX_PULL\\fR",
        "the default of \\fBrun \\-\\-pull\\fR (\\fBmissing\\fR unless set; \\fBnever\\fR for "
        "air\\-gapped hosts).",
        ".TP",
        "\\fBNO_COLOR\\fR",
        "no colour in what linpodx prints.",
        ".SH SEE ALSO",
        "\\fBpodman\\fR(1), \\fBpodman\\-run\\fR(1), \\fBpodman\\-secret\\fR(1)",
        "",
    ]
    return "\n".join(out)


ROOT_HELP_WIDTH = 80
"""The terminal width `roothelp.txt` is rendered for (click's widest: it wraps at 78)."""


def root_help_text(root: Any) -> str:
    """`linpodx --help` as click prints it on a terminal at least ROOT_HELP_WIDTH wide (or
    into a pipe)."""
    # click formats at min(columns, 80) - 2 (its HelpFormatter), but a terminal_width given in
    # the context is used as it is: give it what click would compute.
    settings = {**(root.context_settings or {}), "terminal_width": ROOT_HELP_WIDTH - 2}
    ctx = type(root).context_class(root, info_name=PROG, **settings)
    return str(root.get_help(ctx)) + "\n"


def refresh(root: Any, repo: Path | None = None) -> list[Path]:
    """Write the generated files from the help text of the command tree `root`:
    linpodx/cli/roothelp.txt and docs/man/linpodx.1 (in a source checkout).
    `python -m linpodx.cli.docgen` runs it."""
    from linpodx import __version__

    here = Path(__file__).resolve().parent
    repo = repo or here.parents[1]
    done = []
    for path, text in (
        (here / "roothelp.txt", root_help_text(root)),
        (repo / "docs" / "man" / "linpodx.1", man_page(root, __version__)),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        done.append(path)
    return done


def completion_script(shell: str) -> str:
    """The script that makes `shell` complete linpodx's commands and options."""
    from typer._completion_shared import get_completion_script

    return str(get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell))


def init_completion() -> None:
    """Register typer's completion classes (typer does it itself only with its own
    `--install-completion` options, which linpodx leaves out in favour of `completion SHELL`)."""
    from typer._completion_classes import completion_init

    completion_init()


def register(
    app: typer.Typer,
    version_cmd: Callable[[bool], None],
    help_cmd: Callable[[list[str] | None, bool], int],
    completion_cmd: Callable[[str], None],
) -> None:
    """`--version` on the root, and the `version`, `help` and `completion` commands, whose
    bodies `linpodx.cli.main` passes in (this module sits below it: imports run one way)."""

    def show_version(value: bool) -> None:
        if value:
            version_cmd(False)
            raise typer.Exit(0)

    # The option as a default, not in `Annotated`: annotations are strings read in this
    # module's globals, where `show_version` is not.
    def root(
        version: bool = typer.Option(
            False,
            "--version",
            is_eager=True,
            callback=show_version,
            help="Print the linpodx version and exit.",
        ),
    ) -> None:
        pass

    # A callback keeps typer in group mode even when only one command is registered (otherwise
    # `linpodx version` would be parsed as `version` being an argument of the sole command).
    app.callback()(root)

    @app.command("version")
    def version_command(json_mode: JsonOpt = False) -> None:
        """Print the linpodx version (also `linpodx --version`)."""
        version_cmd(json_mode)

    @app.command("help")
    def help_command(
        words: Annotated[
            list[str] | None,
            typer.Argument(
                metavar="COMMAND", help="The command (e.g. `sandbox apply`).", show_default=False
            ),
        ] = None,
        man: Annotated[
            bool, typer.Option("--man", help="Print the man page linpodx(1) (roff).")
        ] = False,
    ) -> None:
        """Show the help of COMMAND (as `linpodx COMMAND --help`), or of linpodx itself."""
        raise typer.Exit(help_cmd(words, man))

    @app.command("completion")
    def completion_command(
        shell: Annotated[
            str, typer.Argument(metavar="SHELL", help="bash, zsh or fish.", show_default=False)
        ],
    ) -> None:
        """Print the shell completion script for bash, zsh or fish (`source <(linpodx
        completion bash)`, or save it where the shell loads completions from)."""
        completion_cmd(shell)

