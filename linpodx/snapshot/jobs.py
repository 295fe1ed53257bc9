"""Snapshot job files: one JSON file per job, replaced atomically, and worker liveness.

A job moves queued → running → succeeded | failed. Only one process writes a job file at a time:
the CLI writes it (queued, then the worker's pid) before it lets the worker go, and from then on
only the worker writes it. A reader that finds a job not finished whose worker is gone (pid
missing, a zombie, or a recycled pid with another start time) reports it failed: a job is never
"running" forever.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from linpodx.canonical import CanonicalError, strict_loads
from linpodx.errors import LinpodxError, NotFound
from linpodx.fsutil import NotRegularFile, Staged, atomic_write, read_regular
from linpodx.snapshot.names import (
    check_container_name,
    check_job_id,
    check_label,
    image_ref,
    job_file,
)

QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
FINISHED = (SUCCEEDED, FAILED)
WORKER_DIED = "worker died"
# A queued job whose CLI died before it recorded the worker's pid is failed after this long.
UNSTARTED_GRACE_SECONDS = 60


@dataclass(frozen=True)
class Job:
    """What one snapshot job file holds."""

    job_id: str
    """`snap-<ULID>`."""
    kind: str
    """`create` (the only kind so far)."""
    container: str
    """Container name."""
    label: str
    """Snapshot label (image tag)."""
    image: str
    """Image reference the snapshot is tagged with."""
    status: str = QUEUED
    """queued, running, succeeded or failed."""
    replace: bool = False
    """Whether an existing snapshot with this label may be replaced."""
    created: str = ""
    """When the CLI created the job (UTC, ISO 8601)."""
    started: str | None = None
    """When the worker began."""
    finished: str | None = None
    """When the job ended (either way)."""
    step: str | None = None
    """The step the worker is on (or was on when it failed)."""
    error: str | None = None
    """Why the job failed."""
    hint: str | None = None
    """What to do about the failure."""
    worker_pid: int | None = None
    """The worker's pid."""
    worker_start: int | None = None
    """The worker's start time (field 22 of /proc/PID/stat) so a recycled pid is not mistaken."""
    image_id: str | None = None
    """Image id of the committed snapshot (when succeeded)."""
    freeze: str | None = None
    """How the container was held still: `pause` (cgroup freezer) or `sigstop`."""
    archives: list[dict[str, Any]] = field(default_factory=list)
    """Workspace archives written: target, source, file, sha256, size."""
    held: list[list[int]] = field(default_factory=list)
    """`[pid, start time]` of every process the worker SIGSTOPped (so they can be continued
    if the worker dies while holding them)."""
    recovered: bool = False
    """A dead worker's leftovers (held container, temp files, untagged image) were cleaned."""
    container_id: str | None = None
    """Id of the container `snapshot create` checked and audited; the worker snapshots that
    container or none (a rollback in between replaces the container under the name)."""
    consistency: str = "freeze"
    """What `--consistency` asked for: `freeze` (the cgroup freezer or refused), `best-effort`
    (signals where there is no freezer), `stop` (the container stopped for the snapshot)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def now_iso() -> str:
    """UTC time as `2026-11-30T04:32:19.123Z`."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_iso(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _encode(job: Job) -> bytes:
    return (json.dumps(job.to_dict(), indent=1) + "\n").encode()


def write(job: Job) -> None:
    """Replace the job file with `job` (atomic: readers see the old or the new, never half)."""
    atomic_write(job_file(job.job_id), _encode(job))


def stage(job: Job) -> Staged:
    """The job file written ahead (see `fsutil.Staged`): `commit()` puts it in place."""
    return Staged(job_file(job.job_id), _encode(job))


MAX_BYTES = 1 << 20  # a job file is a few KiB; anything this large is not ours
STEPS = ("start", "inspect", "freeze", "check", "commit", "archive", "thaw", "publish", "done")
FREEZE_METHODS = ("pause", "sigstop", "none", "stopped")  # freeze.PAUSE, SIGSTOP_METHOD, …
CONSISTENCIES = ("freeze", "best-effort", "stop")  # freeze.CONSISTENCIES
_HEX64 = re.compile(r"^[0-9a-f]{64}\Z")
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def is_image_id(value: str) -> bool:
    """A full podman image id (64 lower-case hex digits)."""
    return bool(_HEX64.match(value))


class _Bad(ValueError):
    """One field of a job file is not what linpodx writes."""


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _from_mapping(data: Mapping[str, Any], job_id: str) -> Job:
    """A Job from a job file's object, every field checked: the file is read back by
    `job-status`, which acts on what it names (unpauses, continues processes, removes files
    and images), so anything linpodx would not have written is damage, never acted on."""
    fields = Job.__dataclass_fields__
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise _Bad(f"unknown fields {', '.join(map(repr, unknown))}")
    for key in ("job_id", "kind", "container", "label", "image"):
        if key not in data:
            raise _Bad(f"{key} missing")

    def want(ok: bool, what: str) -> None:
        if not ok:
            raise _Bad(what)

    def opt_str(key: str) -> None:
        v = data.get(key)
        want(v is None or isinstance(v, str), f"{key} is not a string")

    want(data["job_id"] == job_id, "job_id is not the file's name")
    want(data["kind"] == "create", "unknown kind")
    for key in ("container", "label", "image"):
        want(isinstance(data[key], str), f"{key} is not a string")
    try:
        check_container_name(data["container"])
        check_label(data["label"])
    except LinpodxError as exc:
        raise _Bad(exc.message) from None
    want(data["image"] == image_ref(data["container"], data["label"]),
         "image is not the snapshot's own name")
    want(data.get("status", QUEUED) in (QUEUED, RUNNING, *FINISHED), "unknown status")
    want(isinstance(data.get("replace", False), bool), "replace is not true/false")
    want(isinstance(data.get("recovered", False), bool), "recovered is not true/false")
    created = data.get("created", "")
    want(isinstance(created, str) and (created == "" or bool(_ISO.match(created))),
         "created is not a time")
    for key in ("started", "finished"):
        v = data.get(key)
        want(v is None or (isinstance(v, str) and bool(_ISO.match(v))), f"{key} is not a time")
    want(data.get("step") is None or data.get("step") in STEPS, "unknown step")
    for key in ("error", "hint"):
        opt_str(key)
    for key in ("worker_pid", "worker_start"):
        v = data.get(key)
        want(v is None or (_is_int(v) and v > 0), f"{key} is not a positive integer")
    iid = data.get("image_id")
    want(iid is None or (isinstance(iid, str) and bool(_HEX64.match(iid))),
         "image_id is not an image id")
    want(data.get("freeze") is None or data.get("freeze") in FREEZE_METHODS,
         "unknown freeze method")
    arch = data.get("archives", [])
    want(isinstance(arch, list) and all(isinstance(a, dict) for a in arch),
         "archives is not a list of objects")
    held = data.get("held", [])
    want(isinstance(held, list) and all(
        isinstance(h, list) and len(h) == 2 and all(_is_int(x) and x > 0 for x in h)
        for h in held), "held is not a list of [pid, start time]")
    want(data.get("consistency", "freeze") in CONSISTENCIES, "unknown consistency")
    cid = data.get("container_id")
    want(cid is None or (isinstance(cid, str) and bool(_HEX64.match(cid))),
         "container_id is not a container id")
    return Job(**data)


def damaged(job_id: str, why: str) -> LinpodxError:
    """The error for a job file linpodx cannot trust (nothing it names is acted on)."""
    return LinpodxError(
        f"snapshot job file is damaged: {job_file(job_id).name}: {why}; nothing was done",
        "remove the job file; the snapshot itself (if any) is listed by "
        "`linpodx snapshot list`",
    )


def read(job_id: str) -> Job:
    """The job as last written (no liveness check). NotFound if there is no such job; a file
    that is not exactly what linpodx writes is damage (LinpodxError)."""
    check_job_id(job_id)
    path = job_file(job_id)
    try:
        # No links, no FIFOs: a special file in its place must not hang the command.
        raw = read_regular(path, MAX_BYTES)
    except NotRegularFile:
        raise damaged(job_id, "not a regular file") from None
    except OSError as exc:
        raise damaged(job_id, exc.strerror or str(exc)) from None
    if raw is None:
        raise NotFound(
            f"snapshot job not found: {job_id}",
            "list jobs' results with `linpodx snapshot list`; job ids are printed by "
            "`linpodx snapshot create`",
        )
    if len(raw) > MAX_BYTES:
        raise damaged(job_id, "too large")
    try:
        data = strict_loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise CanonicalError("not an object")
        return _from_mapping(data, job_id)
    except (CanonicalError, TypeError, ValueError) as exc:
        raise damaged(job_id, str(exc)) from None


def proc_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live, non-zombie process, else None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may hold spaces and parentheses: the fields after it start after the LAST ')'.
    rest = stat[stat.rfind(")") + 2 :].split()
    if len(rest) < 20:
        return None
    state = rest[0]
    if state in ("Z", "X", "x"):  # a zombie or dead task is not a worker doing work
        return None
    try:
        return int(rest[19])  # field 22 overall: fields 1-2 are pid and comm, 3 is state
    except ValueError:
        return None


def worker_alive(job: Job) -> bool:
    """True if the job's recorded worker process is still the same live process."""
    if job.worker_pid is None or job.worker_start is None:
        return False
    return proc_start_time(job.worker_pid) == job.worker_start


def current(job_id: str) -> Job:
    """The job with its true status: an unfinished job whose worker is gone is marked failed."""
    job = read(job_id)
    if job.status in FINISHED:
        return job
    if worker_alive(job):
        return job
    if job.worker_pid is None:
        try:
            age = (datetime.now(UTC) - parse_iso(job.created)).total_seconds()
        except ValueError:
            age = UNSTARTED_GRACE_SECONDS + 1
        if age <= UNSTARTED_GRACE_SECONDS:
            return job  # the CLI is between writing the job and recording its worker
        reason = "worker never started"
    else:
        reason = f"{WORKER_DIED} (pid {job.worker_pid})"
    # The worker may have finished between our read and the liveness check: read again.
    job = read(job_id)
    if job.status in FINISHED:
        return job
    failed = replace(
        job,
        status=FAILED,
        finished=now_iso(),
        error=f"{reason} during step {job.step or 'start'}; the job did not finish",
        hint=(
            f"create the snapshot again; if the container stays paused or stopped, run "
            f"`podman unpause {job.container}` or `podman kill --signal CONT {job.container}`"
        ),
    )
    write(failed)
    return failed


def list_jobs() -> list[str]:
    """Ids of all job files, oldest first (ULIDs sort by time)."""
    from linpodx.snapshot.names import JOB_RE, jobs_dir

    d = jobs_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("snap-*.json") if JOB_RE.match(p.stem))


KEEP_DAYS = 7
"""A finished job's file and worker log are removed this many days after it finished."""


def prune(keep_days: float = KEEP_DAYS) -> list[str]:
    """Remove the files and logs of jobs that finished more than `keep_days` ago; returns
    their ids. Runs at every `snapshot create`. A job still running is never removed; one whose
    worker is gone is marked failed first (`current`) and goes `keep_days` later. A file that
    cannot be read or dated is left as it is (`snapshot job-status` reports it)."""
    from linpodx.snapshot.names import job_log

    cutoff = datetime.now(UTC).timestamp() - keep_days * 86400
    gone = []
    for job_id in list_jobs():
        try:
            job = current(job_id)
            if job.status not in FINISHED or not job.finished:
                continue
            if parse_iso(job.finished).timestamp() >= cutoff:
                continue
            job_file(job_id).unlink(missing_ok=True)
            job_log(job_id).unlink(missing_ok=True)
        except (LinpodxError, OSError, ValueError):
            continue
        gone.append(job_id)
    return gone


def pid_info(pid: int) -> tuple[int, int | None]:
    """`(pid, start time)` of a process, for recording a worker."""
    return pid, proc_start_time(pid)


def is_terminal(job: Job) -> bool:
    return job.status in FINISHED


__all__ = [
    "FAILED",
    "FINISHED",
    "QUEUED",
    "RUNNING",
    "SUCCEEDED",
    "Job",
    "current",
    "is_terminal",
    "list_jobs",
    "now_iso",
    "pid_info",
    "proc_start_time",
    "prune",
    "read",
    "worker_alive",
    "write",
]
