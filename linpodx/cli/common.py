"""What every command shares: the `--json` option, the run-and-render wrapper, and the failure
every command hands to the one error boundary (`linpodx.cli.main`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any

import typer

from linpodx.errors import (
    EXIT_INTERRUPTED,
    CommandFailed,
    LinpodxError,
    Terminated,
    terminated_error,
)
from linpodx.output import envelope, print_json, print_kv

JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print exactly one JSON document on stdout (errors too); `--format json` is the same.",
    ),
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Print only the names, one per line (as podman's -q).")
]


def new_app(help_text: str) -> typer.Typer:
    """A typer app with our conventions: no pretty tracebacks (they print locals), no markup."""
    return typer.Typer(
        help=help_text,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        add_completion=False,
        # `-h` as well as `--help`, on every command (click passes it down to subcommands).
        context_settings={"help_option_names": ["-h", "--help"]},
    )


def run_command(
    name: str,
    json_mode: bool,
    fn: Callable[[], Any],
    render: Callable[[Any], None] | None = None,
) -> Any:
    """Call `fn`, then render its result (key/value lines, a custom renderer, or JSON).

    A `LinpodxError` leaves as `CommandFailed` (see there), with the error's exit code. So does
    Ctrl-C (`error: interrupted`, 130): typer would otherwise turn it into an abort.
    """
    try:
        try:
            result = fn()
        except KeyboardInterrupt:
            raise LinpodxError("interrupted", exit_code=EXIT_INTERRUPTED) from None
        except Terminated as exc:
            raise terminated_error(exc) from None
    except LinpodxError as err:
        raise CommandFailed(name, json_mode, err) from None
    if json_mode:
        print_json(envelope(name, result))
    elif render is not None:
        render(result)
    elif isinstance(result, Mapping):
        print_kv(result)
    return result
