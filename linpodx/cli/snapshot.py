"""`linpodx snapshot …`: create (a detached job), job-status, list, rm, rollback, recover."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from linpodx.cli.common import JsonOpt, new_app, run_command
from linpodx.errors import LinpodxError, UsageError
from linpodx.output import note, print_kv, print_lines, safe_lines, safe_text

app = new_app("Snapshots of a container (image + writable workspace) and safe rollback.")

NameArg = Annotated[str, typer.Argument(help="Container name.", show_default=False)]


@app.command("create")
def create_cmd(
    name: NameArg,
    label: Annotated[str, typer.Option("--label", help="Snapshot label (an image tag).")],
    wait: Annotated[bool, typer.Option("--wait", help="Block until the job has finished.")] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="Overwrite an existing snapshot with this label.")
    ] = False,
    consistency: Annotated[
        str,
        typer.Option(
            "--consistency",
            metavar="MODE",
            help="How a running container is held still: `freeze` (the cgroup freezer; "
            "refused where there is none), `best-effort` (signals where there is no "
            "freezer), `stop` (stopped for the snapshot, started again after).",
        ),
    ] = "freeze",
    json_mode: JsonOpt = False,
) -> None:
    """Snapshot NAME: commit its image and archive its writable mounts (runs as a job)."""
    from linpodx.snapshot import service

    def fn() -> dict[str, Any]:
        job = service.start_create(name, label, replace_existing=replace,
                                   consistency=consistency)
        if not wait:
            return {"job_id": job.job_id, "status": job.status, "image": job.image}
        from linpodx import progress

        with progress.waiting(f"snapshot of {name} ({label}): committing its image and "
                              "archiving its workspace"):
            done = service.wait(job.job_id)
        view = service.job_view(done)
        if done.status != "succeeded":
            raise LinpodxError(
                f"snapshot job {done.job_id} failed: {done.error}",
                done.hint,
                details={"job": view},
            )
        return view

    run_command("snapshot create", json_mode, fn)


@app.command("job-status")
def job_status_cmd(
    job_id: Annotated[str, typer.Argument(help="Job id (snap-…).", show_default=False)],
    json_mode: JsonOpt = False,
) -> None:
    """Status of a snapshot job: queued, running, succeeded or failed."""
    from linpodx.snapshot import service

    def render(view: dict[str, Any]) -> None:
        print_kv({k: v for k, v in view.items() if v is not None})

    run_command("snapshot job-status", json_mode, lambda: service.job_status(job_id), render)


@app.command("list")
def list_cmd(
    name: Annotated[str | None, typer.Argument(help="Only this container's snapshots.")] = None,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Print only the labels, one per line (needs NAME)."),
    ] = False,
    json_mode: JsonOpt = False,
) -> None:
    """List snapshots (all containers, or NAME's)."""
    from linpodx.snapshot import service

    def render(result: dict[str, Any]) -> None:
        rows = result["snapshots"]
        if quiet:
            print_lines(str(r.get("label")) for r in rows)
            return
        if not rows:
            from linpodx.snapshot import manifest

            like = manifest.containers_like(name) if name else ""
            note(f"no snapshots of {safe_text(name or '')}; {like}" if like else "no snapshots")
            return
        header = ("CONTAINER", "LABEL", "CREATED", "STATE", "IMAGE")
        table = [header] + [
            (
                safe_text(str(r.get("container"))),
                safe_text(str(r.get("label"))),
                str(r.get("created") or "-"),
                str(r.get("state")),
                safe_text(str(r.get("image") or "-")),
            )
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
        for row in table:
            cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
            typer.echo("  ".join([*cells, row[-1]]))
        for r in rows:
            if r.get("error"):
                # The table says which; stderr says why and what to do.
                where = f"snapshot {r.get('container')} --label {r.get('label')}"
                note(safe_lines(f"warning: {where}: {r['error']}\nhint: {r.get('hint')}"))

    def listing() -> dict[str, Any]:
        if quiet and name is None:
            # A label names a snapshot only together with its container (`--label L NAME`).
            raise UsageError(
                "snapshot list -q needs a container NAME", "run `linpodx snapshot list NAME -q`"
            )
        return {"snapshots": service.list_snapshots(name)}

    run_command("snapshot list", json_mode, listing, render)


@app.command("rm")
def rm_cmd(
    name: NameArg,
    label: Annotated[str, typer.Option("--label", help="Snapshot label to remove.")],
    json_mode: JsonOpt = False,
) -> None:
    """Remove a snapshot: its image and its workspace archives."""
    from linpodx.snapshot import service

    run_command("snapshot rm", json_mode, lambda: service.remove(name, label))


@app.command("rollback")
def rollback_cmd(
    name: NameArg,
    to: Annotated[
        str, typer.Option("--to", metavar="LABEL", help="Label of the snapshot to go back to.")
    ],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="No warning when someone is attached to it (they are told anyway)."
        ),
    ] = False,
    json_mode: JsonOpt = False,
) -> None:
    """Recreate NAME from a snapshot and restore its writable mounts (all or nothing)."""
    from linpodx import progress
    from linpodx.snapshot import rollback

    def fn() -> dict[str, Any]:
        with progress.waiting(f"rolling {name} back to {to}"):
            return rollback.rollback(name, to, force=force)

    run_command("snapshot rollback", json_mode, fn)


@app.command("recover")
def recover_cmd(name: NameArg, json_mode: JsonOpt = False) -> None:
    """Undo a rollback of NAME that was killed part-way (or finish it, if it was committed)."""
    from linpodx.snapshot import rollback

    run_command("snapshot recover", json_mode, lambda: rollback.recover(name))
