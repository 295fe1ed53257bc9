"""What the `linpodx snapshot …` commands do: create (as a job), job status, list, rm, rollback."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from linpodx import paths, proc
from linpodx.errors import EXIT_AUDIT, EngineError, InvalidInput, LinpodxError, NotFound
from linpodx.ids import new_ulid
from linpodx.snapshot import faults, freeze, jobs, manifest, ops, workspace
from linpodx.snapshot.common import (
    PROFILE_LABELS,
    audit,
    container_lock,
    emit,
    image_id,
    inspect_container,
    labels_of,
    require_managed,
)
from linpodx.snapshot.names import (
    check_container_name,
    check_label,
    container_root,
    image_ref,
    job_log,
    jobs_dir,
    snapshot_dir,
)

WAIT_POLL_SECONDS = 0.1


# ----------------------------------------------------------------------------------------------
# create


def _exists(name: str, label: str) -> bool:
    return snapshot_dir(name, label).exists() or image_id(image_ref(name, label)) is not None


def start_create(name: str, label: str, *, replace_existing: bool = False) -> jobs.Job:
    """Check, audit, record a queued job and start its detached worker; returns the job."""
    check_container_name(name)
    check_label(label)
    info = require_managed(name)
    if not replace_existing and _exists(name, label):
        raise InvalidInput(
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
                    "container_id": str(info.get("Id", "")),
                    "label": label,
                    "image": job.image,
                    "replace": replace_existing,
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
        started = _spawn(job, log_fd)
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


def _spawn(job: jobs.Job, fd: int) -> jobs.Job:
    """Start the worker with its output in `fd` (the caller closes it)."""
    try:
        # Popen here and only here (not proc.run): the worker must outlive this command. Its
        # own session keeps it out of the terminal's job control (Ctrl-C of the CLI); it
        # exits when the job is done, so nothing stays resident.
        child = subprocess.Popen(
            [sys.executable, "-m", "linpodx.snapshot.worker", job.job_id],
            stdin=subprocess.PIPE,
            stdout=fd,
            stderr=fd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        failed = replace(
            job, status=jobs.FAILED, finished=jobs.now_iso(), error=f"could not start worker: {exc}"
        )
        jobs.write(failed)
        raise LinpodxError(f"could not start the snapshot worker: {exc}") from None
    pid, start = jobs.pid_info(child.pid)
    job = replace(job, worker_pid=pid, worker_start=start)
    try:
        jobs.write(job)
    finally:
        # The go byte: from now on only the worker writes the job file. If we could not record
        # it, closing stdin without the byte makes the worker exit without doing anything.
        assert child.stdin is not None  # noqa: S101 - stdin=PIPE above
        with contextlib.suppress(BrokenPipeError):
            if job.worker_start is not None:
                child.stdin.write(b"1")
            child.stdin.close()
    _CHILDREN.append(child)
    return job


# Popen objects of workers this process started, so `--wait` (and in-process tests) reap them.
_CHILDREN: list[subprocess.Popen[bytes]] = []


def _reap() -> None:
    for child in list(_CHILDREN):
        if child.poll() is not None:
            _CHILDREN.remove(child)


def _recover(job: jobs.Job) -> jobs.Job:
    """Clean up after a worker that died: let the container go, drop temp files and the
    untagged image. Only when no other snapshot operation holds the container; once."""
    if job.recovered or job.status != jobs.FAILED or not (job.error or "").startswith(
        jobs.WORKER_DIED
    ):
        return job
    done: list[str] = []
    try:
        with container_lock(job.container, timeout=0):
            if job.step in ("commit", "archive", "thaw"):
                done += freeze.release(job.container, job.freeze, job.held)
            tmp = container_root(job.container) / f".tmp-{job.job_id}"
            if tmp.exists():
                workspace.remove_tree(tmp)
                done.append("temporary archives removed")
            if job.image_id and job.step in ("archive", "thaw"):
                # Committed but never tagged (publish had not started): nobody else has it.
                res = proc.run(["podman", "rmi", job.image_id], check=False, what="podman rmi")
                if res.returncode == 0:
                    done.append("untagged image removed")
    except LinpodxError as exc:
        # Busy (another operation runs) or podman failed: say so once; the hint says what to do.
        done.append(f"cleanup not finished: {exc.message}")
    note = f"; cleaned up: {', '.join(done)}" if done else ""
    job = replace(job, recovered=True, error=(job.error or "") + note)
    jobs.write(job)
    return job


def wait(job_id: str, timeout: float | None = None) -> jobs.Job:
    """Block until the job has finished (or its worker is found dead)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        _reap()
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
        view["archives"] = len(job.archives)
    if job.status == jobs.FAILED:
        view["error"] = job.error
        view["hint"] = job.hint
    view["worker_pid"] = job.worker_pid
    view["log"] = str(job_log(job.job_id))
    return view


def job_status(job_id: str) -> dict[str, Any]:
    """The job's current status (a dead worker is reported failed)."""
    _reap()
    return job_view(_recover(jobs.current(job_id)))


# ----------------------------------------------------------------------------------------------
# list / rm


def list_snapshots(name: str | None = None) -> list[dict[str, Any]]:
    """Snapshots with their manifest facts and whether their image still exists."""
    root = paths.snapshots_dir()
    if name is not None:
        check_container_name(name)
        dirs = [container_root(name)]
    else:
        dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) \
            if root.is_dir() else []
    out: list[dict[str, Any]] = []
    for cdir in dirs:
        if not cdir.is_dir():
            continue
        for sdir in sorted(p for p in cdir.iterdir() if p.is_dir() and not p.name.startswith(".")):
            try:
                man = manifest.read_dir(sdir)
            except LinpodxError as exc:
                out.append({"container": cdir.name, "label": sdir.name, "state": "damaged",
                            "error": exc.message})
                continue
            iid = image_id(str(man.get("image")))
            state = "ok" if iid == man["image_id"] else ("image missing" if iid is None
                                                       else "image retagged")
            out.append(
                {
                    "container": man.get("container"),
                    "label": man.get("label"),
                    "image": man.get("image"),
                    "image_id": man["image_id"],
                    "created": man.get("created"),
                    "mounts": [m.get("target") for m in man["mounts"]],
                    "state": state,
                }
            )
    return out


def remove(name: str, label: str) -> dict[str, Any]:
    """Remove a snapshot's image tag (and the image if nothing uses it) and its archives."""
    check_container_name(name)
    check_label(label)
    ref = image_ref(name, label)
    with container_lock(name):
        sdir = snapshot_dir(name, label)
        iid = image_id(ref)
        if not sdir.exists() and iid is None:
            raise NotFound(
                f"snapshot not found: {name} --label {label}",
                f"list the snapshots of {name} with `linpodx snapshot list {name}`",
            )
        audit("snapshot.rm", {"container": name, "label": label, "image": ref,
                              "image_id": iid or ""})
        image_removed = False
        if iid is not None:
            res = proc.run(["podman", "rmi", ref], check=False, what="podman rmi")
            if res.returncode == 0:
                image_removed = True
            else:
                # A container (a rolled-back one) still uses the image: drop only our name.
                proc.run(["podman", "untag", iid, ref], what="podman untag")
        workspace.remove_tree(sdir)
    emit("snapshot.rm", container=name, label=label, image=ref)
    return {
        "removed": True,
        "container": name,
        "label": label,
        "image": ref,
        "image_deleted": image_removed,
    }


# ----------------------------------------------------------------------------------------------
# rollback


def _verify_snapshot(name: str, label: str) -> dict[str, Any]:
    man = manifest.read(name, label)
    ref = str(man.get("image"))
    if ref != image_ref(name, label):
        raise LinpodxError(f"snapshot manifest names another image: {ref}")
    iid = image_id(ref)
    if iid is None:
        raise NotFound(
            f"snapshot image missing: {ref}",
            "the image was removed outside linpodx; remove the snapshot with "
            f"`linpodx snapshot rm {name} --label {label}`",
        )
    if iid != man["image_id"]:
        raise LinpodxError(
            f"snapshot image {ref} is {iid[:12]}, the snapshot recorded {man['image_id'][:12]}",
            "the tag was moved outside linpodx; nothing was changed",
        )
    sdir = snapshot_dir(name, label)
    for entry in man["mounts"]:
        f = sdir / str(entry.get("file"))
        if not f.is_file():
            raise NotFound(f"workspace archive missing: {f}", "nothing was changed")
        if workspace.sha256_file(f) != entry.get("sha256"):
            raise LinpodxError(
                f"workspace archive {f.name} of {name} --label {label} does not match its "
                "recorded sha256",
                "the archive was changed or damaged; nothing was changed",
            )
    return man


def rollback(name: str, label: str) -> dict[str, Any]:
    """Recreate container `name` from snapshot `label` and restore its workspace, safely.

    Nothing changes until every check passed (snapshot image and archive digests, container,
    mounts, spec). Then: extract archives into staging dirs → stop the container → rename it
    aside → swap the workspace dirs → create and start the new container from the snapshot
    image via the containers service → check it. A failure at any step undoes the steps before
    it (new container removed, workspace swapped back, original renamed back and started
    again if it was running) and the error says so.
    """
    check_container_name(name)
    check_label(label)
    with container_lock(name):
        man = _verify_snapshot(name, label)
        info = require_managed(name)
        if (info.get("HostConfig") or {}).get("AutoRemove"):
            raise InvalidInput(
                f"{name} was started with --rm: stopping it for the rollback would remove it",
                "roll back only containers run without --rm; nothing was changed",
            )
        current = {(m.source, m.target) for m in workspace.writable_mounts(info)}
        recorded = {(str(e["source"]), str(e["target"])) for e in man["mounts"]}
        if current != recorded:
            raise InvalidInput(
                f"the writable mounts of {name} changed since snapshot {label}",
                "roll back only to a snapshot taken with the same mounts; nothing was changed",
            )
        for entry in man["mounts"]:
            workspace.check_restorable(entry)
        orig_id = str(info["Id"])
        orig_labels = labels_of(info)
        ops.check_recreatable(name, orig_labels.get("linpodx.profile_id", ""))
        was_running = bool((info.get("State") or {}).get("Running"))
        rb_id = new_ulid()
        aside = f"{name}-rollback-{rb_id[-10:].lower()}"
        audit(
            "snapshot.rollback",
            {
                "rollback_id": rb_id,
                "container": name,
                "container_id": orig_id,
                "label": label,
                "image": man["image"],
                "image_id": man["image_id"],
            },
        )
        emit("snapshot.rollback", container=name, label=label, status="started",
             rollback_id=rb_id)
        sdir = snapshot_dir(name, label)
        restores: list[workspace.Restore] = []
        state: dict[str, Any] = {"stopped": False, "renamed": False, "created": None,
                                 "spec": ops.save_spec(name)}
        step = "extract"
        try:
            for entry in man["mounts"]:
                r = workspace.Restore(entry, rb_id)
                restores.append(r)
                r.extract(sdir / str(entry["file"]))
            # Each fault point sits AFTER its step changed something, so tests prove the undo.
            faults.fail_point(step)
            step = "stop"
            if was_running:
                ops.stop(name)
                state["stopped"] = True
            faults.fail_point(step)
            step = "rename"
            proc.run(["podman", "rename", orig_id, aside], what="podman rename")
            state["renamed"] = True
            faults.fail_point(step)
            step = "swap"
            for r in restores:
                r.swap()
            faults.fail_point(step)
            step = "create"
            state["created"] = ops.create_from(
                name, str(man["image"]), orig_labels.get("linpodx.profile_id", ""),
                start=was_running,
            )
            faults.fail_point(step)
            step = "verify"
            new_info = inspect_container(name)
            new_labels = labels_of(new_info)
            if str(new_info["Id"]) == orig_id:
                raise EngineError("the new container has the original's id")
            diff = [k for k in PROFILE_LABELS if new_labels.get(k) != orig_labels.get(k)]
            if diff:
                raise EngineError(f"the new container's labels differ: {', '.join(diff)}")
            if was_running and not (new_info.get("State") or {}).get("Running"):
                raise EngineError("the new container is not running")
            faults.fail_point(step)
        except BaseException as exc:  # Ctrl-C too: the original must come back either way
            problems = _undo(name, orig_id, aside, was_running, restores, state)
            if not isinstance(exc, (Exception, KeyboardInterrupt)):
                raise
            if isinstance(exc, KeyboardInterrupt):
                reason = "interrupted"
            elif isinstance(exc, LinpodxError):
                reason = exc.message
            else:
                reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, EngineError) and exc.stderr.strip():
                reason += f": {exc.stderr.strip().splitlines()[-1]}"
            emit("snapshot.rollback", container=name, label=label, status="failed",
                 rollback_id=rb_id, step=step, undone=not problems)
            if not problems:
                raise LinpodxError(
                    f"rollback of {name} to {label} failed at step {step}: {reason}; the "
                    "original container and workspace were put back as they were",
                    "fix the cause and roll back again",
                    exit_code=(
                        exc.exit_code if isinstance(exc, LinpodxError)
                        else 130 if isinstance(exc, KeyboardInterrupt) else 1
                    ),
                    details={"step": step, "restored": True},
                ) from None
            raise LinpodxError(
                f"rollback of {name} to {label} failed at step {step}: {reason}; undoing it "
                f"also failed: {'; '.join(problems)}",
                f"the original container may be named {aside}; moved-aside workspace copies "
                f"end in .linpodx-before-{rb_id}",
                details={"step": step, "restored": False, "problems": problems},
            ) from None
        # Committed: the old container and the moved-aside workspace copies go.
        leftovers = []
        res = proc.run(["podman", "rm", "--force", "--time", "0", orig_id], check=False,
                       what="podman rm")
        if res.returncode != 0:
            leftovers.append(f"old container {aside}")
        for r in restores:
            try:
                r.cleanup()
            except (OSError, LinpodxError):
                leftovers.append(str(r.aside))
        new_info = inspect_container(name)
    emit("snapshot.rollback", container=name, label=label, status="succeeded",
         rollback_id=rb_id)
    result: dict[str, Any] = {
        "rolled_back": True,
        "container": name,
        "label": label,
        "image": man["image"],
        "container_id": str(new_info["Id"])[:12],
        "previous_id": orig_id[:12],
        "revision": labels_of(new_info).get("linpodx.revision"),
        "restored": [str(e["target"]) for e in man["mounts"]],
    }
    if leftovers:
        result["leftovers"] = leftovers
    return result


def _undo(
    name: str,
    orig_id: str,
    aside: str,
    was_running: bool,
    restores: list[workspace.Restore],
    state: dict[str, Any],
) -> list[str]:
    """Put the original container and workspace back; returns what could not be undone."""
    problems: list[str] = []
    # A new container under NAME (whether or not create_from returned) is not the original.
    with contextlib.suppress(LinpodxError):
        info = inspect_container(name)
        if str(info["Id"]) != orig_id:
            try:
                ops.remove_new(name, str(info["Id"]))
            except LinpodxError as exc:
                problems.append(f"could not remove the new container: {exc.message}")
    try:
        ops.restore_spec(name, state["spec"])
    except OSError as exc:
        problems.append(f"could not restore the run spec: {exc}")
    problems.extend(workspace.rollback_all(restores))
    if state["renamed"]:
        res = proc.run(["podman", "rename", orig_id, name], check=False, what="podman rename")
        if res.returncode != 0:
            problems.append(f"could not rename {aside} back to {name}: {res.stderr.strip()}")
    if state["stopped"] and was_running and not problems:
        try:
            ops.start(name)
        except LinpodxError as exc:
            problems.append(f"could not start the original container again: {exc.message}")
    return problems

