"""What the `linpodx snapshot …` commands do: create (as a job), job status, list, rm, rollback,
recover."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from linpodx import fsutil, paths, proc
from linpodx.errors import EXIT_AUDIT, EngineError, InvalidInput, LinpodxError, NotFound
from linpodx.ids import new_ulid
from linpodx.snapshot import (
    egresskeep,
    faults,
    freeze,
    jobs,
    journal,
    manifest,
    ops,
    worker,
    workspace,
)
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


def start_create(
    name: str, label: str, *, replace_existing: bool = False, consistency: str = freeze.FREEZE
) -> jobs.Job:
    """Check, audit, record a queued job and start its detached worker; returns the job."""
    check_container_name(name)
    check_label(label)
    if consistency not in freeze.CONSISTENCIES:
        raise InvalidInput(f"unknown --consistency {consistency!r}",
                           f"use one of {', '.join(freeze.CONSISTENCIES)}")
    journal.check_no_interrupted(name)
    info = require_managed(name)
    running = bool((info.get("State") or {}).get("Running"))
    if running and consistency == freeze.FREEZE and not freeze.can_freeze():
        # Said before anything is recorded or started (the worker checks again: the container
        # may be started while the job waits).
        raise InvalidInput(
            f"cannot snapshot {name} consistently while it runs: {freeze.CANNOT_FREEZE}",
            freeze.CANNOT_FREEZE_HINT + "; nothing was done",
        )
    workspace.check_workspace(name, info, for_rollback=False)
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
        container_id=str(info.get("Id", "")) or None,
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
    recorded = False
    try:
        jobs.write(job)
        recorded = True
    except OSError as exc:
        # Without its worker on record the job must not run (nobody could tell it from a dead
        # one): no go byte, and the job says why if the disk still takes that much.
        with contextlib.suppress(Exception):
            jobs.write(replace(
                job, status=jobs.FAILED, finished=jobs.now_iso(), worker_pid=None,
                worker_start=None,
                error=f"could not record the worker: {exc.strerror or exc}; nothing was done",
                hint="check the state dir (free space, permissions) and create the snapshot "
                     "again",
            ))
        raise LinpodxError(
            f"could not record the worker of snapshot job {job.job_id}: {exc.strerror or exc}",
            "no snapshot was taken; check the state dir (free space, permissions) and run "
            "`linpodx snapshot create` again",
        ) from None
    finally:
        # The go byte, only once the worker is on record: from now on only the worker writes
        # the job file. Closing stdin without it makes the worker exit without doing anything.
        assert child.stdin is not None  # noqa: S101 - stdin=PIPE above
        with contextlib.suppress(BrokenPipeError):
            if recorded and job.worker_start is not None:
                child.stdin.write(b"1")
            child.stdin.close()
        if not recorded:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)  # it exits at once; reap it
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
    _reap()
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
    iid = image_id(ref)
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
    if not sdir.exists() and image_id(ref) is None:
        # Before the lock too: a name that never had a snapshot leaves no lock file behind.
        raise manifest.not_found(name, label)
    with container_lock(name):
        iid = image_id(ref)
        if not sdir.exists() and iid is None:
            raise manifest.not_found(name, label)
        audit("snapshot.rm", {"container": name, "label": label, "image": ref,
                              "image_id": iid or ""})
        image_removed = False
        if iid is not None:
            res = proc.run(["podman", "rmi", ref], check=False, what="podman rmi")
            if res.returncode == 0 or image_id(iid) is None:
                # (podman 4.3 can delete the image and still fail, on a parent image that a
                # rolled-back container uses: then it is gone all the same.)
                image_removed = True
            elif image_id(ref) is not None:
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
        raise LinpodxError(
            f"snapshot manifest names another image: {ref[:200]}",
            f"the manifest is damaged; remove the snapshot with "
            f"`linpodx snapshot rm {name} --label {label}` and create it again",
        )
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

    A rollback of `name` that was interrupted before (its journal is left) is recovered first.
    Nothing changes until every check passed (snapshot image and archive digests, container,
    mounts, spec). Then: extract archives into staging dirs → stop the container → rename it
    aside → swap the workspace dirs → create and start the new container from the snapshot
    image via the containers service → check it → record the commit → remove the original
    and the moved-aside copies. A failure at any step undoes the steps before it (new
    container removed, workspace swapped back, original renamed back and started again if it
    was running) and the error says so. The journal (`linpodx.snapshot.journal`) names the
    step about to be taken, so a rollback killed outright is undone (or, once committed,
    finished) by the next `snapshot rollback` or `snapshot recover` of `name`.
    """
    check_container_name(name)
    check_label(label)
    with container_lock(name) as lock_fd, ops.hold_name(name):
        recovered = _recover_locked(name, lock_fd)
        man = _verify_snapshot(name, label)
        info = require_managed(name)
        if (info.get("HostConfig") or {}).get("AutoRemove"):
            raise InvalidInput(
                f"{name} was started with --rm: stopping it for the rollback would remove it",
                "roll back only containers run without --rm; nothing was changed",
            )
        state = info.get("State") or {}
        if state.get("Paused") or state.get("Status") == "paused":
            # Neither running nor stopped: which one the rolled-back container should be is the
            # person's call, not ours (a snapshot worker that died may also have left it so).
            raise InvalidInput(
                f"{name} is paused",
                # (podman 4.3 refuses to stop a paused container: unpause comes first either way.)
                f"run `podman unpause {name}` (and then `linpodx stop {name}` to roll it back "
                "stopped), then roll back again; nothing was changed",
            )
        current = {(m.source, m.target) for m in workspace.writable_mounts(info)}
        recorded = {(str(e["source"]), str(e["target"])) for e in man["mounts"]}
        if current != recorded:
            raise InvalidInput(
                f"the writable mounts of {name} changed since snapshot {label}",
                "roll back only to a snapshot taken with the same mounts; nothing was changed",
            )
        workspace.check_workspace(name, info, for_rollback=True)
        for entry in man["mounts"]:
            workspace.check_restorable(entry)
        orig_id = str(info["Id"])
        orig_labels = labels_of(info)
        ops.check_recreatable(name, orig_labels.get("linpodx.profile_id", ""))
        was_running = bool((info.get("State") or {}).get("Running"))
        # Before anything changes: the newest allowlist the container had been given (a
        # re-apply's, not only its creation revision's), which the new container must keep.
        kept = egresskeep.current(name)
        rb_id = new_ulid()
        aside = journal.aside_name(name, rb_id)
        spec = ops.save_spec(name)
        jour = journal.new(
            rollback_id=rb_id, container=name, label=label, image=str(man["image"]),
            orig_id=orig_id, aside=aside, was_running=was_running, spec=spec,
            mounts=list(man["mounts"]), egress_policy=kept,
        )
        # The journal needs disk space, the record comes first: stage it, record, rename it in.
        staged = journal.stage(jour)
        try:
            audit(
                "snapshot.rollback",
                {
                    "rollback_id": rb_id,
                    "container": name,
                    "container_id": orig_id,
                    "label": label,
                    "image": man["image"],
                    "image_id": man["image_id"],
                    "egress_policy": egresskeep.summary(kept),
                },
            )
        except BaseException:
            staged.discard()
            raise
        try:
            staged.commit()
        except OSError as exc:
            _audit_quietly("snapshot.rollback.undo", {"rollback_id": rb_id, "container": name,
                                                      "step": "journal", "reason": str(exc)})
            raise LinpodxError(
                f"the rollback of {name} was recorded but its journal could not be written "
                f"({exc.strerror or exc}); nothing was changed",
                "check the state dir (free space, permissions) and roll back again",
                exit_code=EXIT_AUDIT,
            ) from None
        emit("snapshot.rollback", container=name, label=label, status="started",
             rollback_id=rb_id)
        sdir = snapshot_dir(name, label)
        restores: list[workspace.Restore] = []

        def holding() -> contextlib.AbstractContextManager[None]:
            # The short-lived programs of the steps below hold the container's lock with us:
            # one still running after a kill -9 keeps the next command's recovery waiting
            # until it is done, instead of racing it (`proc.lending`). Not the create step:
            # its conmon lives as long as the new container.
            return proc.lending(lock_fd)

        step = "extract"

        def at(next_step: str) -> str:
            # Write-ahead: the journal names the step before it changes anything.
            nonlocal jour
            jour = replace(jour, step=next_step)
            journal.write(jour)
            return next_step

        try:
            for entry in man["mounts"]:
                r = workspace.Restore(entry, rb_id)
                restores.append(r)
                with holding():
                    r.extract(sdir / str(entry["file"]))
            # Each fault point sits AFTER its step changed something, so tests prove the undo.
            faults.fail_point(step)
            step = at("stop")
            if was_running:
                with holding():
                    ops.stop(name, kept)
            faults.fail_point(step)
            step = at("rename")
            with holding():
                proc.run(["podman", "rename", orig_id, aside], what="podman rename")
            faults.fail_point(step)
            step = at("swap")
            for r in restores:
                r.swap()
            faults.fail_point(step)
            step = at("create")
            ops.create_from(
                name, str(man["image"]), orig_labels.get("linpodx.profile_id", ""),
                start=was_running, egress_policy=kept,
            )
            faults.fail_point(step)
            step = at("verify")
            new_info = inspect_container(name)
            new_labels = labels_of(new_info)
            if str(new_info["Id"]) == orig_id:
                raise EngineError("the new container has the original's id")
            diff = [k for k in PROFILE_LABELS if new_labels.get(k) != orig_labels.get(k)]
            if diff:
                raise EngineError(f"the new container's labels differ: {', '.join(diff)}")
            if was_running and not (new_info.get("State") or {}).get("Running"):
                raise EngineError("the new container is not running")
            enforced = _check_egress(name, kept, running=was_running)
            faults.fail_point(step)
            # Removing the original cannot be undone: recorded first (a failed record undoes).
            # Write-ahead as for every step: the journal says `commit` before the record does,
            # so a record in the chain always means that recovery finishes, never undoes.
            step = at("commit")
            audit("snapshot.rollback.commit", {"rollback_id": rb_id, "container": name,
                                               "container_id": str(new_info["Id"]),
                                               "previous_id": orig_id,
                                               "egress_policy": enforced})
        except BaseException as exc:  # Ctrl-C too: the original must come back either way
            if jour.step == "commit":
                # Not recorded: undone after all, so first the journal must say so (recovery
                # would otherwise finish what is being undone).
                with contextlib.suppress(OSError):
                    at("verify")
            _audit_quietly("snapshot.rollback.undo", {"rollback_id": rb_id, "container": name,
                                                      "step": step, "reason": _reason(exc)})
            notes: list[str] = []
            problems = _undo_journal(jour, notes, lock_fd)
            if not isinstance(exc, (Exception, KeyboardInterrupt)):
                raise
            reason = _reason(exc)
            emit("snapshot.rollback", container=name, label=label, status="failed",
                 rollback_id=rb_id, step=step, undone=not problems)
            if not problems:
                raise LinpodxError(
                    f"rollback of {name} to {label} failed at step {step}: {reason}; the "
                    "original container and workspace were put back as they were"
                    + "".join(f"; {n}" for n in notes),
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
                f"fix what is named there and run `linpodx snapshot recover {name}`, which "
                f"tries the undo again (the original container may be named {aside}; "
                f"moved-aside workspace copies end in .linpodx-before-{rb_id})",
                details={"step": step, "restored": False, "problems": problems},
            ) from None
        faults.fail_point("commit")
        # Committed: the old container and the moved-aside workspace copies go.
        leftovers = []
        with holding():
            res = proc.run(["podman", "rm", "--force", "--time", "0", orig_id], check=False,
                           what="podman rm")
        if res.returncode != 0:
            leftovers.append(f"old container {aside}")
        for r in restores:
            with holding():
                leftovers += r.cleanup()
        # What is left is garbage, not a half-done rollback: the journal goes either way.
        journal.clear(name)
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
    if recovered is not None:
        result["recovered_first"] = recovered
    if leftovers:
        result["leftovers"] = leftovers
    return result


def _check_egress(
    name: str, kept: dict[str, Any] | None, *, running: bool
) -> dict[str, Any] | None:
    """The new container's egress policy (profile, id, revision, for the commit record), checked
    to be no older than the one the original had been given, `kept`; and, if it runs, the one
    its guard reports it enforces. EngineError otherwise (the rollback is then undone)."""
    now = egresskeep.current(name)
    if kept is not None and (now is None or egresskeep.newer(kept, now)):
        got = "none" if now is None else f"revision {now['revision']}"
        raise EngineError(
            f"the new container's egress policy is {got}, the original had been given "
            f"revision {kept['revision']}"
        )
    if now is not None and running and egresskeep.enforced_revision(name) != now["revision"]:
        raise EngineError(
            f"the new container's egress guard does not report revision {now['revision']}"
        )
    return egresskeep.summary(now)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, LinpodxError):
        reason = exc.message
        if isinstance(exc, EngineError) and exc.stderr.strip():
            reason += f": {exc.stderr.strip().splitlines()[-1]}"
        return reason
    return f"{type(exc).__name__}: {exc}"


def _audit_quietly(event_type: str, data: dict[str, Any]) -> bool:
    """Record an undo. It puts things back as they were, so it goes ahead even when the record
    cannot be written (refusing would leave the half-done state in place); False then."""
    try:
        audit(event_type, data)
    except LinpodxError:
        return False
    return True


# ----------------------------------------------------------------------------------------------
# recovery of a rollback that was killed part-way


def recover(name: str) -> dict[str, Any]:
    """`linpodx snapshot recover NAME`: undo (or, once committed, finish) a rollback of NAME
    that was interrupted, from its journal. Nothing to do is not an error."""
    check_container_name(name)
    with container_lock(name) as lock_fd, ops.hold_name(name):
        done = _recover_locked(name, lock_fd)
    if done is None:
        return {"recovered": False, "container": name}
    return {"recovered": True, "container": name, **done}


def _recover_locked(name: str, lock_fd: int) -> dict[str, Any] | None:
    """Recover NAME's interrupted rollback, if its journal says there is one (the caller holds
    the container's snapshot lock, so its owner cannot still be at work on it)."""
    journal.sweep_temps(name)
    jour = journal.read(name)
    if jour is None:
        return None
    if jour.owned_here() or jour.owner_alive():
        raise LinpodxError(
            f"a rollback of {name} (to {jour.label}) is in progress (pid {jour.pid})",
            "wait for it to finish, then retry",
        )
    finishing = jour.step == "commit"
    action = "finish" if finishing else "restart" if jour.step == "undone" else "undo"
    audit(
        "snapshot.rollback.recover",
        {"rollback_id": jour.rollback_id, "container": name, "label": jour.label,
         "step": jour.step, "action": action},
    )
    # Taken over: the containers service now lets this process act on the container.
    jour = journal.owned(jour)
    journal.write(jour)
    notes: list[str] = []
    if finishing:
        with proc.lending(lock_fd):  # as in `rollback`: a kill here leaves no podman racing
            problems = _finish_journal(jour)
    elif action == "restart":
        problems = []
        _restart(jour, notes)
    else:
        problems = _undo_journal(jour, notes, lock_fd)
    emit("snapshot.rollback", container=name, label=jour.label, rollback_id=jour.rollback_id,
         status="recovered" if not problems else "recovery failed", action=action)
    if problems:
        raise LinpodxError(
            f"recovering the interrupted rollback of {name} to {jour.label} ({action}) did "
            f"not finish: {'; '.join(problems)}",
            f"fix what is named there and run `linpodx snapshot recover {name}` again",
            details={"problems": problems},
        )
    out: dict[str, Any] = {
        "rollback_id": jour.rollback_id,
        "label": jour.label,
        "interrupted_at": jour.step,
        "action": {"finish": "finished", "restart": "restarted"}.get(action, "undone"),
    }
    if notes:
        out["notes"] = notes
    return out


def _finish_journal(jour: journal.Journal) -> list[str]:
    """The rollback was committed (the new container checked): remove the original and the
    moved-aside copies, as the rollback would have."""
    problems: list[str] = []
    res = proc.run(["podman", "rm", "--force", "--time", "0", jour.orig_id], check=False,
                   what="podman rm")
    if res.returncode != 0 and "no such container" not in res.stderr.lower():
        problems.append(f"could not remove the original container {jour.aside}: "
                        f"{res.stderr.strip()}")
    for m in jour.mounts:
        problems += workspace.finish_interrupted(Path(m["source"]), jour.rollback_id)
    if not problems:
        journal.clear(jour.container)
    return problems


def _inspect_or_none(ref: str) -> dict[str, Any] | None:
    try:
        return inspect_container(ref)
    except NotFound:
        return None


def _remove_if_made_by(jour: journal.Journal) -> list[str]:
    """Remove the container under NAME if the rollback made it: a linpodx container from the
    snapshot's image that is not the original. Anything else under NAME is left alone."""
    name = jour.container
    new = _inspect_or_none(name)
    if new is None or str(new["Id"]) == jour.orig_id:
        return []
    if not (labels_of(new).get("linpodx.managed") == "1"
            and str(new.get("ImageName", "")) == jour.image):
        return [f"a container named {name} that the rollback did not create is in the way"]
    try:
        ops.remove_new(name, str(new["Id"]))
    except LinpodxError as exc:
        return [f"could not remove the new container: {exc.message}"]
    return []


def _said(exc: BaseException) -> str:
    return exc.message if isinstance(exc, LinpodxError) else str(exc)


def _undo_journal(jour: journal.Journal, notes: list[str], lock_fd: int) -> list[str]:
    """Put the original container and workspace back from what is really there (the journal's
    step says how far the rollback may have got, not how far it did); clear the journal once
    nothing is half done. For a failed rollback (in-process) and a killed one (recovery) alike.
    Returns the problems that stop it; `notes` gets what is worth saying but is not one."""
    name = jour.container
    reached = journal.STEPS.index(jour.step)
    problems: list[str] = []
    # The egress policy the original gets back: the one it had been given (journal), or a
    # newer one a re-apply pushed to the name after a kill let the name's lock go.
    keep = egresskeep.newest(jour.egress_policy, egresskeep.current_or_none(name))
    with proc.lending(lock_fd):  # short-lived programs only, as in `rollback`
        if reached >= journal.STEPS.index("create"):
            problems += _remove_if_made_by(jour)
            ops.detach_guard(name)  # a guard made ready for the new container, if any
        # (LinpodxError too: the state dir's checks raise it. Every step below must still run:
        # the workspaces and the original come back whatever one of them says.)
        try:
            ops.restore_spec(name, jour.spec_bytes())
        except (OSError, LinpodxError) as exc:
            problems.append(f"could not restore the run spec: {_said(exc)}")
        try:
            # Removing the new container (or detaching its guard) took the name's policy file
            # away; a start of the original without it would enforce its creation revision.
            egresskeep.put_back(name, keep)
        except (OSError, LinpodxError) as exc:
            problems.append(f"could not restore the egress policy: {_said(exc)}")
        swap_started = reached >= journal.STEPS.index("swap")
        for m in reversed(jour.mounts):
            problems += workspace.undo_interrupted(
                Path(m["source"]), jour.rollback_id, existed=bool(m["existed"]),
                swap_started=swap_started,
            )
        orig = _inspect_or_none(jour.orig_id)
        if orig is None:
            # Removed outside linpodx meanwhile: with its workspace back, nothing is half done.
            notes.append(f"the original container ({jour.orig_id[:12]}) was removed outside "
                         f"linpodx, so there is no {name} any more")
        elif str(orig.get("Name", "")).lstrip("/") != name:
            if _inspect_or_none(name) is not None:
                problems.append(f"cannot rename {jour.aside} back: a container named {name} "
                                "exists")
            else:
                res = proc.run(["podman", "rename", jour.orig_id, name], check=False,
                               what="podman rename")
                if res.returncode != 0:
                    problems.append(f"could not rename {jour.aside} back to {name}: "
                                    f"{res.stderr.strip()}")
    if problems:
        return problems
    # The original is back in place. If it ran, starting it again is all that is left, and the
    # journal says so first (a kill during the start is recovered by starting it).
    if jour.was_running and orig is not None:
        with contextlib.suppress(OSError):
            journal.write(replace(jour, step="undone"))
        _restart(jour, notes)
    else:
        journal.clear(name)
    return problems


def _restart(jour: journal.Journal, notes: list[str]) -> None:
    """The last of an undo: start the original again if it is not running (it ran before the
    rollback), then drop the journal. A start that fails is said, not a reason to keep the
    container blocked: it is whole, only stopped."""
    name = jour.container
    faults.fail_point("restart")
    with contextlib.suppress(OSError):  # the undo put it back already; this is for a kill
        egresskeep.put_back(name, jour.egress_policy)
    now = _inspect_or_none(name)
    if now is not None and not (now.get("State") or {}).get("Running"):
        try:
            ops.start(name)  # not lending: its conmon lives as long as the container
        except LinpodxError as exc:
            notes.append(f"{name} is back but could not be started again: {exc.message}; "
                         f"start it with `linpodx start {name}`")
    journal.clear(name)
