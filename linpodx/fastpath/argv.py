"""`linpodx run`'s plain forms, parsed without typer.

typer (≥0.29) builds pydantic adapters for every parameter, which costs about 0.2 s before a
command runs. `linpodx run` is the one command whose start-up time people feel (CI steps,
scripts that start many short containers), so `parse_fields` recognises the plain forms of its
arguments and `linpodx.cli.main` runs them directly. Anything else (`--help`, `--json`, unknown
or repeated options, arguments before `--`, missing `--image`) returns None and goes through
typer, which stays the one place for help texts and usage errors. tests/unit/test_cli_fastrun.py
checks that both parsers build the same request for every form this one accepts.
"""

from __future__ import annotations

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Sequence

_VALUE_OPTIONS = {"--image": "image", "--profile": "profile", "--name": "name", "--pull": "pull"}
_FLAGS = {
    "--interactive": "interactive",
    "-i": "interactive",
    "--tty": "tty",
    "-t": "tty",
    "--detach": "detach",
    "-d": "detach",
    "--rm": "rm",
}
_SHORT = {"i": "interactive", "t": "tty", "d": "detach"}


def _flag_names(arg: str) -> list[str] | None:
    """Field names a flag arg sets (`-it` sets two), or None if it is not a plain flag."""
    if arg in _FLAGS:
        return [_FLAGS[arg]]
    letters = arg[1:]
    if arg.startswith("-") and not arg.startswith("--") and letters:
        if all(c in _SHORT for c in letters) and len(set(letters)) == len(letters):
            return [_SHORT[c] for c in letters]
    return None


class PlainRun:
    """A plain `run`'s arguments, as `parse_fields` read them: the fields of the
    `containers.RunRequest` it stands for (`linpodx.cli.runcmd.request` makes it), typed, and
    not changed once made. A slotted class, not a dataclass: importing dataclasses would cost
    the fast path its budget (linpodx/fastpath/__init__.py)."""

    __slots__ = (
        "command", "detach", "image", "interactive", "name", "profile", "pull", "rm", "tty",
    )  # fmt: skip

    image: str
    name: str | None
    profile: str | None
    pull: str | None
    command: tuple[str, ...]
    interactive: bool
    tty: bool
    detach: bool
    rm: bool

    def __init__(
        self,
        *,
        image: str,
        name: str | None,
        profile: str | None,
        pull: str | None,
        command: tuple[str, ...],
        interactive: bool,
        tty: bool,
        detach: bool,
        rm: bool,
    ) -> None:
        for field, value in (
            ("image", image), ("name", name), ("profile", profile), ("pull", pull),
            ("command", command),
            ("interactive", interactive), ("tty", tty), ("detach", detach), ("rm", rm),
        ):  # fmt: skip
            object.__setattr__(self, field, value)

    def __setattr__(self, field: str, value: object) -> None:
        raise AttributeError(f"PlainRun is frozen: {field} cannot be set")

    def replace(self, *, pull: str | None) -> PlainRun:
        """This run with its `--pull` policy settled (the fast path normalises it)."""
        kept = {f: getattr(self, f) for f in self.__slots__ if f != "pull"}
        return PlainRun(pull=pull, **kept)

    def __repr__(self) -> str:
        return "PlainRun(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__) + ")"


def parse_fields(args: Sequence[str]) -> PlainRun | None:
    """The arguments of `run ARGS…` (ARGS after the word `run`), or None to let typer parse
    it."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    command: tuple[str, ...] = ()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            command = tuple(args[i + 1 :])
            break
        key, eq, inline = arg.partition("=")
        if key in _VALUE_OPTIONS:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                return None
            field = _VALUE_OPTIONS[key]
            if field in values or not value or value.startswith("-"):
                return None
            values[field] = value
        else:
            names = _flag_names(arg)
            if names is None or flags.intersection(names):
                return None
            flags.update(names)
        i += 1
    if "image" not in values:
        return None
    return PlainRun(
        image=values["image"],
        name=values.get("name"),
        profile=values.get("profile"),
        pull=values.get("pull"),
        command=command,
        interactive="interactive" in flags,
        tty="tty" in flags,
        detach="detach" in flags,
        rm="rm" in flags,
    )
