"""`linpodx run` without typer: the command's body, and a parser for its common forms.

Why a second parser: typer (≥0.29) builds pydantic adapters for every parameter, which costs
about 0.2 s before a command runs. `linpodx run` is the one command whose start-up time people
feel (CI steps, scripts that start many short containers), so `parse` recognises the plain forms
of its arguments and `main` runs them directly. Anything else (`--help`, `--json`, unknown or
repeated options, arguments before `--`, missing `--image`) returns None and goes through typer,
which stays the one place for help texts and usage errors. tests/unit/test_cli_fastrun.py checks
that both parsers build the same request for every form this one accepts.

The typer command in `linpodx.cli.containers` calls `execute` too, so there is one body.
A `--rm` run without a terminal under a named profile first tries `linpodx.fastrun`, so this
module imports only what that needs until it knows the full path must run.
"""

from __future__ import annotations

from linpodx.errors import LinpodxError, UsageError
from linpodx.output import envelope, note, print_error, print_json, print_kv

TYPE_CHECKING = False  # not typing's: see linpodx/fastrun.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from linpodx.containers import ContainerInfo, RunRequest
    from linpodx.podman.argv import CreateSpec

_VALUE_OPTIONS = {"--image": "image", "--profile": "profile", "--name": "name"}
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


def parse(args: Sequence[str]) -> RunRequest | None:
    """The request for `run ARGS…` (ARGS after the word `run`), or None to let typer parse it."""
    from linpodx.containers import RunRequest

    fields = parse_fields(args)
    return None if fields is None else RunRequest(**fields)


def parse_fields(args: Sequence[str]) -> dict[str, Any] | None:
    """`parse`, as the fields of the RunRequest."""
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
    return {
        "image": values["image"],
        "name": values.get("name"),
        "profile": values.get("profile"),
        "command": command,
        "interactive": "interactive" in flags,
        "tty": "tty" in flags,
        "detach": "detach" in flags,
        "rm": "rm" in flags,
    }


def run_fields(fields: dict[str, Any]) -> int:
    """Run a request parsed by `parse_fields`: the fast path if it takes it, else `execute`."""
    from linpodx import fastrun

    try:
        rc = fastrun.run(fields, lambda info, spec: _announce(info, spec, False))
    except LinpodxError as err:
        return _fail(False, err)
    if rc is not None:
        return rc
    from linpodx.containers import RunRequest

    return execute(RunRequest(**fields))


def _fail(json_mode: bool, err: LinpodxError) -> int:
    if json_mode:
        print_json(envelope("run", error=err))
    print_error(err)
    return err.exit_code


def execute(req: RunRequest, json_mode: bool = False) -> int:
    """Run the request: print `container_id:`/`name:`/`state:`, hand the terminal over (unless
    detached) and return the exit status (the container's, or linpodx's on failure)."""
    from linpodx import containers

    try:
        if json_mode and not req.detach:
            raise UsageError(
                "--json needs --detach", "the container's own output would follow on stdout"
            )
        if req.detach:
            info, spec = containers.run(req)
            _announce(info, spec, json_mode)
            return 0
        return containers.run_foreground(req, lambda info, spec: _announce(info, spec, False))
    except LinpodxError as err:
        return _fail(json_mode, err)


def _announce(info: ContainerInfo, spec: CreateSpec, json_mode: bool) -> None:
    """Notes about clamped limits on stderr, then the container's id, name and state."""
    from linpodx.podman.argv import limit_notes

    for line in limit_notes(spec):
        note(f"note: {line}")
    result = {"container_id": info.container_id, "name": info.name, "state": info.state}
    if json_mode:
        print_json(envelope("run", {**result, **info.to_dict()}))
    else:
        print_kv(result)  # flushed before the container's output or terminal follows
