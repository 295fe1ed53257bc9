"""Top-level container commands: run, ps, start, stop, rm, logs, exec, doctor.

The service (`linpodx.containers`) and podman modules are imported inside each command so that
`linpodx --help` and the other command groups do not pay for them.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from linpodx.cli.common import JsonOpt, QuietOpt, run_command
from linpodx.errors import CommandFailed, LinpodxError
from linpodx.output import envelope, print_json

NameArg = Annotated[str, typer.Argument(help="Container name.", show_default=False)]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the top-level app."""

    @app.command("run")
    def run_cmd(
        image: Annotated[
            str, typer.Option("--image", help="Image to run (pulled if missing: see --pull).")
        ],
        command: Annotated[
            list[str] | None,
            typer.Argument(help="Command and arguments, after `--`.", show_default=False),
        ] = None,
        profile: Annotated[
            str | None,
            typer.Option("--profile", help="Applied profile (default: the built-in one)."),
        ] = None,
        name: Annotated[str | None, typer.Option("--name", help="Container name.")] = None,
        interactive: Annotated[
            bool, typer.Option("--interactive", "-i", help="Keep stdin open.")
        ] = False,
        tty: Annotated[bool, typer.Option("--tty", "-t", help="Allocate a terminal.")] = False,
        detach: Annotated[
            bool, typer.Option("--detach", "-d", help="Start in the background.")
        ] = False,
        rm: Annotated[bool, typer.Option("--rm", help="Remove it when its command exits.")] = False,
        pull: Annotated[
            str | None,
            typer.Option(
                "--pull",
                metavar="POLICY",
                help="Pull the image: missing (default; LINPODX_PULL changes it), never, "
                "always or newer.",
                show_default=False,
            ),
        ] = None,
        env: Annotated[
            list[str] | None,
            typer.Option(
                "--env",
                "-e",
                metavar="KEY[=VALUE]",
                help="Set a variable in the container (KEY alone: this environment's value). "
                "Values are never stored, audited or put on podman's command line.",
                show_default=False,
            ),
        ] = None,
        env_file: Annotated[
            list[str] | None,
            typer.Option(
                "--env-file",
                metavar="FILE",
                help="Read variables from FILE (KEY=VALUE lines, as podman's --env-file).",
                show_default=False,
            ),
        ] = None,
        secret: Annotated[
            list[str] | None,
            typer.Option(
                "--secret",
                metavar="NAME[,type=env][,target=T]",
                help="Give the container a podman secret (`podman secret create`): a file in "
                "/run/secrets, or with type=env a variable.",
                show_default=False,
            ),
        ] = None,
        json_mode: JsonOpt = False,
    ) -> None:
        """Run IMAGE in a hardened container under a profile: `linpodx run --image I -- CMD…`."""
        from linpodx.cli import runcmd
        from linpodx.containers import RunRequest

        req = RunRequest(
            image=image,
            name=name,
            profile=profile,
            command=tuple(command or ()),
            interactive=interactive,
            tty=tty,
            detach=detach,
            rm=rm,
            pull=pull,
            env=tuple(env or ()),
            env_files=tuple(env_file or ()),
            secrets=tuple(secret or ()),
        )
        raise typer.Exit(runcmd.execute(req, json_mode))

    @app.command("ps")
    def ps_cmd(
        all_states: Annotated[
            bool, typer.Option("--all", "-a", help="Also stopped containers.")
        ] = False,
        quiet: QuietOpt = False,
        json_mode: JsonOpt = False,
    ) -> None:
        """List linpodx containers: name, profile, revision, state, egress."""
        from linpodx.cli import pscmd

        raise typer.Exit(pscmd.execute(all_states, json_mode, quiet))

    @app.command("start")
    def start_cmd(name: NameArg, json_mode: JsonOpt = False) -> None:
        """Start a stopped linpodx container (egress guard re-attached first)."""
        from linpodx import containers

        def go() -> dict[str, Any]:
            info = containers.start(name)
            return {"container_id": info.container_id, "name": info.name, "state": info.state}

        run_command("start", json_mode, go)

    @app.command("stop")
    def stop_cmd(
        name: NameArg,
        time: Annotated[
            int,
            # (the bounds are `containers.STOP_TIME_MAX`'s, checked there: not imported here)
            typer.Option("--time", "-t", help="Seconds before SIGKILL (from 0 to 86400)."),
        ] = 10,
        json_mode: JsonOpt = False,
    ) -> None:
        """Stop a linpodx container."""
        from linpodx import containers

        run_command("stop", json_mode, lambda: containers.stop(name, time))

    @app.command("rm")
    def rm_cmd(
        name: NameArg,
        force: Annotated[bool, typer.Option("--force", "-f", help="Stop it first.")] = False,
        json_mode: JsonOpt = False,
    ) -> None:
        """Remove a linpodx container, its egress guard and its run spec."""
        from linpodx import containers

        run_command("rm", json_mode, lambda: containers.remove(name, force))

    @app.command("logs")
    def logs_cmd(
        name: NameArg,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
    ) -> None:
        """Print a linpodx container's output (control characters escaped)."""
        from linpodx import containers

        try:
            rc = containers.logs(name, follow)
        except LinpodxError as err:
            raise CommandFailed("logs", False, err) from None
        raise typer.Exit(rc)

    @app.command("exec")
    def exec_cmd(
        name: NameArg,
        command: Annotated[
            list[str] | None, typer.Argument(help="Command after `--`.", show_default=False)
        ] = None,
        interactive: Annotated[
            bool, typer.Option("--interactive", "-i", help="Keep stdin open.")
        ] = False,
        tty: Annotated[bool, typer.Option("--tty", "-t", help="Allocate a terminal.")] = False,
    ) -> None:
        """Run a command in a running linpodx container (audited with its argv)."""
        from linpodx import containers

        try:
            rc = containers.exec_in(name, tuple(command or ()), interactive, tty)
        except LinpodxError as err:
            raise CommandFailed("exec", False, err) from None
        raise typer.Exit(rc)

    @app.command("doctor")
    def doctor_cmd(json_mode: JsonOpt = False) -> None:
        """Check this machine: podman, runtime, limits, rootless setup, network helpers."""
        from linpodx import doctor

        report = doctor.run_checks()
        if json_mode:
            print_json(envelope("doctor", report.to_dict()))
        else:
            for line in report.lines():
                typer.echo(line)
        raise typer.Exit(report.exit_code())
