"""`linpodx run`'s body, for typer's command and for the plain forms `linpodx.cli.main` parses
itself (`linpodx.fastpath.argv`) when the fast path (`linpodx.fastpath.run`) does not take them.
One body, so both parsers run a request the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from linpodx.errors import LinpodxError, UsageError
from linpodx.fastpath import argv
from linpodx.fastpath.run import announce, fail

if TYPE_CHECKING:
    from linpodx.containers import RunRequest
    from linpodx.fastpath.argv import PlainRun


def parse(args: Sequence[str]) -> RunRequest | None:
    """The request for `run ARGS…` (ARGS after the word `run`), or None to let typer parse it."""
    fields = argv.parse_fields(args)
    return None if fields is None else request(fields)


def request(fields: PlainRun) -> RunRequest:
    """The request of what `linpodx.fastpath.argv.parse_fields` read."""
    from linpodx.containers import RunRequest

    return RunRequest(
        image=fields.image,
        name=fields.name,
        profile=fields.profile,
        pull=fields.pull,
        command=fields.command,
        interactive=fields.interactive,
        tty=fields.tty,
        detach=fields.detach,
        rm=fields.rm,
    )


def execute(req: RunRequest, json_mode: bool = False) -> int:
    """Run the request: announce it (`linpodx.fastpath.run.announce`: the bare id on stdout when
    detached, status lines on stderr otherwise), hand the terminal over (unless detached) and
    return the exit status (the container's, or linpodx's on failure)."""
    from linpodx import containers

    try:
        if json_mode and not req.detach:
            # A foreground run's stdout is the container's own output: a JSON document before
            # or after it would make neither readable.
            raise UsageError(
                "--json needs --detach (-d): a foreground run's stdout is the container's own "
                "output",
                "use `linpodx run -d --json …` for the container's JSON record, or drop --json",
            )
        if req.detach:
            info, spec = containers.run(req)
            announce(info, spec, json_mode, detached=True)
            return 0
        return containers.run_foreground(req, announce)
    except LinpodxError as err:
        return fail(json_mode, err)
