"""The detached worker of one `snapshot create` job: `python -m linpodx.snapshot.worker JOB`.

The CLI starts it in its own session with stdio on the job's log file, records its pid, then
writes one byte on its stdin to let it go (EOF instead means the CLI died first: do nothing).
It runs the job to the end and exits; nothing stays resident.

Steps (each recorded in the job file before it starts): inspect → freeze → commit → archive →
thaw → publish. (`--consistency stop`: the freeze is a `linpodx stop`, the thaw a start.)
The image is committed untagged and the archives go to a temporary directory;
only `publish` makes the snapshot visible (directory rename, then the tag), so a failed or
killed job never leaves a half snapshot under the label.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from linpodx import containers
from linpodx.errors import Conflict, EngineError, InvalidInput, LinpodxError, NotFound
from linpodx.paths import ensure_dir
from linpodx.podman import engine
from linpodx.profile import HOME_DIR
from linpodx.profile.loader import size_bytes
from linpodx.profile.model import Resources
from linpodx.snapshot import (
    egresskeep,
    freeze,
    jobs,
    journal,
    lifecycle,
    manifest,
    precheck,
    runner,
    workspace,
)
from linpodx.snapshot.container import PROFILE_LABELS, Container, require_managed
from linpodx.snapshot.lock import container_lock
from linpodx.snapshot.names import container_root, snapshot_dir
from linpodx.snapshot.records import emit
from linpodx.snapshot.saga import NO_FAULTS, Faults


class _Run:
    """The job being worked on; `step()` records progress in the job file."""

    def __init__(self, job: jobs.Job, faults: Faults = NO_FAULTS):
        self.job = job
        self.faults = faults

    def update(self, **changes: Any) -> None:
        self.job = replace(self.job, **changes)
        jobs.write(self.job)

    def step(self, name: str) -> None:
        self.update(step=name)
        self.faults.at(name)


def _untagged(image: str) -> bool:
    """True if `image` exists and no name points at it (so it is nobody's but ours)."""
    return engine.image_untagged(image)


def _id_of(name: str) -> str | None:
    return engine.container_id_of(name)


def clean_after(job: jobs.Job) -> tuple[list[str], list[str]]:
    """Clean up after a job whose worker died: let the container go, drop the temporary
    archives and the committed-but-untagged image. The caller holds the container's snapshot
    lock. Returns (what was done, what could not be done); safe to run again."""
    done: list[str] = []
    problems: list[str] = []
    if job.step in ("check", "commit", "archive", "thaw"):
        try:
            now = _id_of(job.container) if job.container_id and job.freeze == freeze.PAUSE \
                else job.container_id
            if now != job.container_id:
                # Gone, or another container under the name now: not ours to unpause.
                done.append(f"{job.container} was removed or replaced, left alone")
            else:
                done += freeze.release(job.container_id or job.container, job.freeze, job.held)
        except Exception as exc:  # said, and tried again next time
            problems.append(f"could not let {job.container} go: {_say(exc)}")
    tmp = container_root(job.container) / f".tmp-{job.job_id}"
    try:
        if os.path.lexists(tmp):
            workspace.remove_tree(tmp)
            done.append("temporary archives removed")
    except Exception as exc:
        problems.append(f"could not remove {tmp}: {_say(exc)}")
    if job.image_id and job.step in ("archive", "thaw"):
        # Committed but never tagged (publish had not started): nobody else has it. An image
        # that has a name by now is someone's, and stays.
        try:
            if _untagged(job.image_id):
                res = engine.remove_image(job.image_id)
                if res.returncode == 0:
                    done.append("untagged image removed")
                else:
                    problems.append(f"could not remove image {job.image_id[:12]}: "
                                    f"{res.stderr.strip()}")
        except Exception as exc:
            problems.append(f"could not remove image {job.image_id[:12]}: {_say(exc)}")
    return done, problems


def _say(exc: BaseException) -> str:
    if isinstance(exc, EngineError) and exc.stderr.strip():
        return f"{exc.message}: {exc.stderr.strip().splitlines()[-1]}"
    if isinstance(exc, LinpodxError):
        return exc.message
    return str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"


def needs_cleanup(job: jobs.Job) -> bool:
    """A job whose worker died and whose leftovers were not cleaned yet."""
    return (not job.recovered and job.status == jobs.FAILED
            and (job.error or "").startswith(jobs.WORKER_DIED))


def cleaned(job: jobs.Job, done: list[str]) -> jobs.Job:
    """The job, marked cleaned (written), with what was done added to its error."""
    note = f"; cleaned up: {', '.join(done)}" if done else ""
    job = replace(job, recovered=True, error=(job.error or "") + note)
    jobs.write(job)
    return job


def _clean_dead_jobs(container: str, own: str) -> None:
    """Under the container's lock: clean up after other jobs of this container whose worker
    died (a paused container, SIGSTOPped processes), which a `job-status` that found the lock
    busy could not do. Before freezing: a container a dead job left paused is let go first."""
    for jid in jobs.list_jobs():
        if jid == own:
            continue
        try:
            other = jobs.current(jid)
            if other.container != container or not needs_cleanup(other):
                continue
            done, problems = clean_after(other)
            if not problems:
                cleaned(other, done)
            else:
                print(f"cleanup after {jid} not finished: {'; '.join(problems)}", flush=True)
        except (LinpodxError, OSError) as exc:
            print(f"cleanup after {jid} skipped: {_say(exc)}", flush=True)


def _publish(job: jobs.Job, tmp: Path, new_image: str) -> str | None:
    """Move the archives into place and tag the image; returns the replaced image id, if any."""
    final = snapshot_dir(job.container, job.label)
    old_image: str | None = None
    if final.exists():
        if not job.replace:
            raise Conflict(
                f"snapshot {job.container} --label {job.label} already exists",
                "pick another label or pass --replace",
            )
        with contextlib.suppress(LinpodxError):
            old_image = manifest.read_dir(final).get("image_id")
        old = final.parent / f".old-{job.job_id}"
        os.rename(final, old)
        os.rename(tmp, final)
        workspace.remove_tree(old)
    else:
        os.rename(tmp, final)
    engine.tag(new_image, job.image)
    return old_image if old_image != new_image else None


def _check(name: str, cid: str, info: Mapping[str, Any],
           mounts: list[workspace.WritableMount]) -> None:
    """Refuse, before anything is committed, a snapshot a rollback could not restore or one
    above its bound or the free disk (`precheck`); the container is held meanwhile, so what
    is checked is what would be taken."""
    trees = [(m.target, precheck.walk_mount(m.source)) for m in mounts]
    problems = [f"{target}: {p}" for target, tree in trees for p in tree.problems]
    more = sum(tree.more_problems for _target, tree in trees)
    targets = sorted({str(m.get("Destination")) for m in info.get("Mounts") or []
                      if m.get("Destination")})
    problems += precheck.check_rootfs(cid, HOME_DIR, targets)
    if problems:
        raise InvalidInput(
            f"snapshot of {name} refused before anything was committed: a rollback could not "
            "restore it: " + "; ".join(problems) + (f"; and {more} more" if more else ""),
            "remove, move or shorten what is named there (in the workspace, or in the "
            "container), then create the snapshot again",
        )
    bound_text = _snapshot_bound(Container.of(info).labels.get("linpodx.profile_id", ""))
    bound = size_bytes(bound_text)
    if bound is None:
        raise InvalidInput(f"the profile's resources.snapshot_max_size {bound_text!r} is not "
                           "a size", "apply the profile again")
    changes = engine.changes_size(cid)
    storage = engine.graph_root()
    precheck.check_size(name, changes=changes, trees=trees, bound=bound,
                        bound_text=bound_text, archive_dir=str(container_root(name)),
                        storage_dir=storage)


def _snapshot_bound(profile_id: str) -> str:
    """The `resources.snapshot_max_size` of the container's profile revision (the default
    for a revision that is gone from the store: the bound still holds)."""
    try:
        ref = containers.profile_by_id(profile_id) if profile_id else None
    except LinpodxError:
        ref = None
    return ref.profile.resources.snapshot_max_size if ref is not None \
        else Resources().snapshot_max_size


@contextlib.contextmanager
def _held(run: _Run, cid: str, info: Mapping[str, Any]) -> Iterator[str]:
    """Hold the container still as the job's `consistency` asks; yields the method used.

    `stop`: stopped the linpodx way (audited, its egress policy kept) and started again after,
    holding the name's lock so that no `linpodx start` slips in between. Otherwise frozen
    (`freeze.frozen`), by signals only if `best-effort` allows it."""
    job = run.job
    if job.consistency == freeze.STOP and Container.of(info).running:
        with lifecycle.hold_name(job.container):
            lifecycle.stop(job.container, egresskeep.current(job.container))
            run.update(freeze=freeze.STOPPED)
            try:
                yield freeze.STOPPED
            finally:
                lifecycle.start(job.container)
        return
    with freeze.frozen(
        cid, on_hold=lambda m, held: run.update(freeze=m, held=held),
        signals=job.consistency == freeze.BEST_EFFORT,
    ) as method:
        yield method


def _run_env_keys(name: str) -> tuple[str, ...]:
    """The names of the variables the run gave the container itself (`run -e`, `--env-file`;
    its run spec keeps the names only): the snapshot image keeps them without their values."""
    from linpodx.containers.runenv import valid_key

    try:
        keys = containers.load_spec(name).get("env_keys") or ()
    except NotFound:
        return ()  # not made by `linpodx run`: no run of ours gave it variables
    if not isinstance(keys, (list, tuple)) or not all(valid_key(k) for k in keys):
        raise InvalidInput(
            f"the run spec of {name} names its variables wrongly",
            f"the run spec is damaged; remove the container with `linpodx rm {name}`",
        )
    return tuple(keys)


def run_create(job_id: str, faults: Faults = NO_FAULTS) -> int:
    """Do the work of a create job; returns the process exit status. `faults` (tests only) is
    called as each step has been recorded, before it starts."""
    run = _Run(jobs.read(job_id), faults)
    run.update(status=jobs.RUNNING, started=jobs.now_iso(), step="start")
    job = run.job
    tmp = container_root(job.container) / f".tmp-{job.job_id}"
    new_image: str | None = None
    tagged = False
    try:
        with container_lock(job.container, timeout=600):
            run.step("inspect")
            # A rollback may have been killed while this job waited for the lock.
            journal.check_no_interrupted(job.container)
            _clean_dead_jobs(job.container, job.job_id)
            info = require_managed(job.container)
            found = Container.of(info)
            if job.container_id and found.id != job.container_id:
                # What was checked and audited is another container (a rollback recreated
                # it while this job waited for the lock): snapshot none rather than the wrong one.
                raise InvalidInput(
                    f"{job.container} is no longer the container this snapshot was requested "
                    f"for ({job.container_id[:12]}; now {found.id[:12]}, "
                    "recreated meanwhile, for example by a rollback)",
                    f"create the snapshot of {job.container} again if you still want it",
                )
            workspace.check_workspace(job.container, info, for_rollback=False)
            mounts = workspace.writable_mounts(info)
            labels = found.labels
            if not job.replace and snapshot_dir(job.container, job.label).exists():
                raise Conflict(
                    f"snapshot {job.container} --label {job.label} already exists",
                    "pick another label or pass --replace",
                )
            workspace.remove_tree(tmp)
            ensure_dir(tmp.parent)
            tmp.mkdir(mode=0o700)
            entries: list[dict[str, Any]] = []
            run.step("freeze")
            # By id from here on: the container checked above, never one recreated under the
            # name meanwhile (`linpodx rm` + `run` do not take the snapshot lock).
            cid = found.id
            with _held(run, cid, info) as method:
                run.update(freeze=method)
                run.step("check")
                _check(job.container, cid, info, mounts)
                run.step("commit")
                res = engine.commit(cid, blank=_run_env_keys(job.container))
                new_image = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else None
                if not new_image or not jobs.is_image_id(new_image):
                    raise EngineError("podman commit printed no image id", argv=res.argv,
                                      stderr=res.stdout)
                run.update(image_id=new_image)  # so a reader can remove it if we die
                run.step("archive")
                for i, m in enumerate(mounts):
                    entries.append(workspace.archive(m, tmp / f"mount-{i}.tar"))
                run.step("thaw")
            full_id = runner.host().image_id(new_image) or new_image
            manifest.write(
                tmp,
                {
                    "schema": manifest.SCHEMA,
                    "container": job.container,
                    "container_id": info.get("Id"),
                    "label": job.label,
                    "image": job.image,
                    "image_id": full_id,
                    "base_image": (info.get("ImageName") or info.get("Image")),
                    "created": jobs.now_iso(),
                    "job_id": job.job_id,
                    "freeze": run.job.freeze,
                    "profile_labels": {k: labels[k] for k in PROFILE_LABELS if k in labels},
                    "mounts": entries,
                },
            )
            run.step("publish")
            old_image = _publish(run.job, tmp, full_id)
            tagged = True
            if old_image:
                # The replaced image is no longer a snapshot; a container may still use it, in
                # which case podman refuses and the image stays (that is what we want).
                engine.remove_image(old_image)
        run.update(
            status=jobs.SUCCEEDED,
            finished=jobs.now_iso(),
            step="done",
            image_id=full_id,
            archives=entries,
        )
        emit("snapshot.create", job_id=job.job_id, container=job.container, label=job.label,
             status=jobs.SUCCEEDED, image=job.image)
        return 0
    except Exception as exc:  # every failure must end up in the job file
        if isinstance(exc, LinpodxError):
            msg, hint = exc.message, exc.hint
            if isinstance(exc, EngineError) and exc.stderr.strip():
                msg = f"{msg}: {exc.stderr.strip().splitlines()[-1]}"
        elif isinstance(exc, OSError):
            # The disk, not linpodx: say which file and what to do.
            where = f" ({exc.filename})" if exc.filename else ""
            msg = f"writing the snapshot failed{where}: {exc.strerror or exc}"
            hint = (
                "free disk space under the linpodx state dir, then create the snapshot again"
                if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else "check the linpodx state dir (permissions, a read-only filesystem), then "
                "create the snapshot again"
            )
        else:
            msg, hint = f"{type(exc).__name__}: {exc}", "this is a bug in linpodx"
        with contextlib.suppress(Exception):
            workspace.remove_tree(tmp)
        if new_image and not tagged:
            engine.remove_image(new_image)
        run.update(status=jobs.FAILED, finished=jobs.now_iso(), error=msg, hint=hint)
        emit("snapshot.create", job_id=job.job_id, container=job.container, label=job.label,
             status=jobs.FAILED, error=msg)
        return 1


def main(argv: list[str], faults: Faults = NO_FAULTS) -> int:
    """Entry point: wait for the CLI's go byte, then run the job."""
    if len(argv) != 1:
        sys.stderr.write("usage: python -m linpodx.snapshot.worker JOB_ID\n")
        return 2
    go = sys.stdin.buffer.read(1)
    if go != b"1":
        return 1  # the CLI died before it recorded us: leave the job alone
    try:
        return run_create(argv[0], faults)
    except LinpodxError as exc:  # a job file we cannot trust: nothing is done, said in the log
        sys.stderr.write(f"error: {exc.message}\n" + (f"hint: {exc.hint}\n" if exc.hint else ""))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
