"""What the `linpodx snapshot …` commands do: create (as a job), job status, list, rm.

Rollback and recover are `linpodx.snapshot.rollback`."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from linpodx import fsutil, paths
from linpodx.errors import (
    EXIT_AUDIT,
    Conflict,
    EngineError,
    InvalidInput,
    LinpodxError,
    UsageError,
)
from linpodx.ids import new_ulid
from linpodx.podman import engine
from linpodx.snapshot import (
    freeze,
    jobs,
    journal,
    manifest,
    runner,
    worker,
    workspace,
)
from linpodx.snapshot.container import Container, require_managed
from linpodx.snapshot.lock import container_lock
from linpodx.snapshot.names import (
    check_container_name,
    check_label,
    container_root,
    image_ref,
    job_log,
    jobs_dir,
    snapshot_dir,
)
from linpodx.snapshot.records import audit, emit

WAIT_POLL_SECONDS = 0.1
# How a create job's worker is started (tests start theirs through a test-only entry point).
WORKER_ARGV = (sys.executable, "-m", "linpodx.snapshot.worker")


# ----------------------------------------------------------------------------------------------
# create


def _exists(name: str, label: str) -> bool:
    return (
        snapshot_dir(name, label).exists()
        or runner.host().image_id(image_ref(name, label)) is not None
    )


def start_create(
    name: str, label: str, *, replace_existing: bool = False, consistency: str = freeze.FREEZE,
    worker_argv: Sequence[str] = WORKER_ARGV,
) -> jobs.Job:
    """Check, audit, record a queued job and start its detached worker (`worker_argv JOB`);
    returns the job."""
    check_container_name(name)
    check_label(label)
    if consistency not in freeze.CONSISTENCIES:
        raise UsageError(f"unknown --consistency {consistency!r}",
                           f"use one of {', '.join(freeze.CONSISTENCIES)}")
    journal.check_no_interrupted(name)
    info = require_managed(name)
    running = Container.of(info).running
    if running and consistency == freeze.FREEZE and not freeze.can_freeze():
        # Said before anything is recorded or started (the worker checks again: the container
        # may be started while the job waits).
        raise InvalidInput(
            f"cannot snapshot {name} consistently while it runs: {freeze.CANNOT_FREEZE}",
            freeze.CANNOT_FREEZE_HINT + "; nothing was done",
        )
    workspace.check_workspace(name, info, for_rollback=False)
    if not replace_existing and _exists(name, label):
        raise Conflict(
            f"snapshot {name} --label {label} already exists",
            "pick another label, or pass --replace to overwrite it",
        )
    job = jobs.Job(
        job_id=f"snap-{new_ulid()}",
        kind="create",
        container=name,
        label=label,
        image=image_ref(name, label),
        replace=replace_existing,
        created=jobs.now_iso(),
        container_id=Container.of(info).id or None,
        consistency=consistency,
    )
    # Audited before anything happens: if this cannot be recorded, nothing is started. The job
    # file and the worker's log are written first, though, so that a full or read-only disk
    # stops the command before the record: after it, only a rename is left to do (a record of
    # a job that was then never written would name a job nobody can find).
    staged = jobs.stage(job)
    try:
        log_fd = _open_log(job)
    except BaseException:
        staged.discard()
        raise
    try:
        try:
            audit(
                "snapshot.create",
                {
                    "job_id": job.job_id,
                    "container": name,
                    "container_id": job.container_id or "",
                    "label": label,
                    "image": job.image,
                    "replace": replace_existing,
                    "consistency": consistency,
                },
            )
        except BaseException:
            staged.discard()
            with contextlib.suppress(OSError):
                os.unlink(job_log(job.job_id))
            raise
        try:
            staged.commit()
        except OSError as exc:
            raise LinpodxError(
                f"snapshot.create of job {job.job_id} was recorded, but its job file could not "
                f"be put in place: {exc.strerror or exc}",
                "no snapshot was taken; check the state dir (free space, permissions) and run "
                "`linpodx snapshot create` again",
                exit_code=EXIT_AUDIT,
            ) from None
        emit("snapshot.create", job_id=job.job_id, container=name, label=label, status=jobs.QUEUED)
        started = runner.host().start_worker(job, log_fd, worker_argv)
    finally:
        os.close(log_fd)
    # Housekeeping, never a reason to fail: jobs that finished long ago (jobs.KEEP_DAYS).
    with contextlib.suppress(Exception):
        jobs.prune()
    return started


def _open_log(job: jobs.Job) -> int:
    """The worker's log file (its stdout and stderr), created empty."""
    paths.ensure_dir(jobs_dir())
    return os.open(
        job_log(job.job_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, paths.FILE_MODE
    )


def _recover(job: jobs.Job) -> jobs.Job:
    """Clean up after a worker that died: let the container go, drop temp files and the
    untagged image. Only when no other snapshot operation holds the container (if one does,
    the next look, or the next job's worker, does it); marked done only once it ran."""
    if not worker.needs_cleanup(job):
        return job
    try:
        with container_lock(job.container, timeout=0):
            fresh = jobs.read(job.job_id)  # another reader may have cleaned it meanwhile
            if not worker.needs_cleanup(fresh):
                return fresh
            done, problems = worker.clean_after(fresh)
            if not problems:
                return worker.cleaned(fresh, done)
    except LinpodxError as exc:
        # Busy: another operation runs; said now, tried again at the next look.
        problems = [exc.message]
    # Not recorded: the job stays to be cleaned; what stopped it is said this time.
    return replace(job, error=(job.error or "") + f"; cleanup not finished: {'; '.join(problems)}")


def wait(job_id: str, timeout: float | None = None) -> jobs.Job:
    """Block until the job has finished (or its worker is found dead)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        runner.reap()
        job = _recover(jobs.current(job_id))
        if jobs.is_terminal(job):
            return job
        if deadline is not None and time.monotonic() > deadline:
            return job
        time.sleep(WAIT_POLL_SECONDS)


def _seconds(a: str | None, b: str | None) -> str | None:
    if not a or not b:
        return None
    try:
        return f"{(jobs.parse_iso(b) - jobs.parse_iso(a)).total_seconds():.2f}s"
    except ValueError:
        return None


def job_view(job: jobs.Job) -> dict[str, Any]:
    """What `job-status` shows."""
    view: dict[str, Any] = {
        "job_id": job.job_id,
        "status": job.status,
        "image": job.image,
        "container": job.container,
        "label": job.label,
        "step": job.step,
        "created": job.created,
        "started": job.started,
        "finished": job.finished,
        "duration": _seconds(job.started, job.finished),
    }
    if job.status == jobs.SUCCEEDED:
        view["image_id"] = job.image_id
        view["freeze"] = job.freeze
        view["consistency"] = job.consistency
        view["archives"] = len(job.archives)
    if job.status == jobs.FAILED:
        view["error"] = job.error
        view["hint"] = job.hint
    view["worker_pid"] = job.worker_pid
    view["log"] = str(job_log(job.job_id))
    return view


def job_status(job_id: str) -> dict[str, Any]:
    """The job's current status (a dead worker is reported failed)."""
    runner.reap()
    return job_view(_recover(jobs.current(job_id)))


# ----------------------------------------------------------------------------------------------
# list / rm


def list_snapshots(name: str | None = None) -> list[dict[str, Any]]:
    """Snapshots with their manifest facts and whether their image still exists.

    One snapshot that cannot be read (a damaged manifest, podman failing on its image) is
    listed with its state (`damaged`, `unknown`), `error` and `hint`; it never hides the
    others."""
    root = paths.snapshots_dir()
    if name is not None:
        check_container_name(name)
        dirs = [container_root(name)]
    else:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if fsutil.is_dir(root) else []
    out: list[dict[str, Any]] = []
    for cdir in dirs:
        if not cdir.is_dir():
            continue
        for sdir in sorted(p for p in cdir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                out.append(_snapshot_row(cdir.name, sdir))
            except LinpodxError as exc:
                if isinstance(exc, EngineError):  # podman failed, not the snapshot
                    state, hint = "unknown", exc.hint or "check that podman works: `podman info`"
                else:
                    state, hint = "damaged", _remove_hint(cdir.name, sdir)
                out.append({"container": cdir.name, "label": sdir.name, "state": state,
                            "error": exc.message, "hint": hint})
    return out


def _remove_hint(container: str, sdir: Path) -> str:
    """What to do about a snapshot that cannot be used: `snapshot rm` if it can name it."""
    try:
        check_container_name(container)
        check_label(sdir.name)
    except InvalidInput:
        return f"linpodx did not make this directory; move it aside: {sdir}"
    return (f"remove the snapshot with `linpodx snapshot rm {container} --label {sdir.name}` "
            "and create it again")


def _snapshot_row(container: str, sdir: Path) -> dict[str, Any]:
    """One `snapshot list` row; LinpodxError if the snapshot cannot be read."""
    man = manifest.read_dir(sdir)
    ref = man.get("image")
    if ref != image_ref(container, sdir.name):
        raise LinpodxError(
            f"snapshot manifest is damaged: it names another image: {str(ref)[:200]}",
            _remove_hint(container, sdir),
        )
    if not all(isinstance(m, dict) for m in man["mounts"]):
        raise LinpodxError(
            "snapshot manifest is damaged: a mount is not an object", _remove_hint(container, sdir)
        )
    iid = runner.host().image_id(ref)
    state = "ok" if iid == man["image_id"] else ("image missing" if iid is None
                                               else "image retagged")
    return {
        "container": container,
        "label": sdir.name,
        "image": ref,
        "image_id": man["image_id"],
        "created": man.get("created"),
        "mounts": [m.get("target") for m in man["mounts"]],
        "state": state,
    }


def remove(name: str, label: str) -> dict[str, Any]:
    """Remove a snapshot's image tag (and the image if nothing uses it) and its archives."""
    check_container_name(name)
    check_label(label)
    ref = image_ref(name, label)
    sdir = snapshot_dir(name, label)
    if not sdir.exists() and runner.host().image_id(ref) is None:
        # Before the lock too: a name that never had a snapshot leaves no lock file behind.
        raise manifest.not_found(name, label)
    with container_lock(name):
        iid = runner.host().image_id(ref)
        if not sdir.exists() and iid is None:
            raise manifest.not_found(name, label)
        audit("snapshot.rm", {"container": name, "label": label, "image": ref,
                              "image_id": iid or ""})
        image_removed = False
        if iid is not None:
            res = engine.remove_image(ref)
            if res.returncode == 0 or runner.host().image_id(iid) is None:
                # (podman 4.3 can delete the image and still fail, on a parent image that a
                # rolled-back container uses: then it is gone all the same.)
                image_removed = True
            elif runner.host().image_id(ref) is not None:
                # A container (a rolled-back one) still uses the image: drop only our name.
                engine.untag(iid, ref)
        workspace.remove_tree(sdir)
    emit("snapshot.rm", container=name, label=label, image=ref)
    return {
        "removed": True,
        "container": name,
        "label": label,
        "image": ref,
        "image_deleted": image_removed,
    }
