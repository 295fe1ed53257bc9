"""The calls the snapshot service makes outside itself, as one object that can be handed in:
podman's look-ups of containers and images, and the start of a create job's worker.

Every such call of `linpodx.snapshot` goes through `host()`. By default that is `REAL`, which
does each for real (podman through `linpodx.podman.engine`, the worker through
`proc.popen`); unit tests hand in a small fake with `use(fake)` instead of patching the
services' module globals one by one. podman's other snapshot verbs (commit, pause, mounts,
renames) stay where they are, in the engine.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

from linpodx import proc
from linpodx.errors import LinpodxError
from linpodx.podman import engine
from linpodx.snapshot import jobs


class Host(Protocol):
    """What the snapshot service asks of the host (`REAL` does each)."""

    def inspect_container(self, ref: str) -> dict[str, Any]:
        """`podman inspect` of one container; NotFound if it does not exist."""
        ...

    def image_id(self, ref: str) -> str | None:
        """Full id of image `ref`, None if there is no such image."""
        ...

    def start_worker(self, job: jobs.Job, fd: int, worker_argv: Sequence[str]) -> jobs.Job:
        """Start the detached worker of `job` (`worker_argv JOB`), its output in `fd`; the job
        as recorded with its worker."""
        ...


CHILDREN: list[subprocess.Popen[bytes]] = []
"""Popen objects of workers this process started, so `--wait` (and in-process tests) reap
them (`reap`)."""


class _Real:
    """The host itself."""

    def inspect_container(self, ref: str) -> dict[str, Any]:
        return engine.inspect(ref)

    def image_id(self, ref: str) -> str | None:
        return engine.image_id(ref)

    def start_worker(self, job: jobs.Job, fd: int, worker_argv: Sequence[str]) -> jobs.Job:
        """Start the worker with its output in `fd` (the caller closes it)."""
        try:
            # Not proc.run: the worker must outlive this command (stdin: the go byte, written
            # once the job is on record). It exits when the job is done, so nothing stays
            # resident.
            argv = [*worker_argv, job.job_id]
            child = proc.popen(
                argv, stdin=subprocess.PIPE, stdout=fd, stderr=fd, new_session=True
            )
        except OSError as exc:
            failed = replace(
                job, status=jobs.FAILED, finished=jobs.now_iso(),
                error=f"could not start worker: {exc}",
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
            # Without its worker on record the job must not run (nobody could tell it from a
            # dead one): no go byte, and the job says why if the disk still takes that much.
            with contextlib.suppress(Exception):
                jobs.write(replace(
                    job, status=jobs.FAILED, finished=jobs.now_iso(), worker_pid=None,
                    worker_start=None,
                    error=f"could not record the worker: {exc.strerror or exc}; nothing was "
                          "done",
                    hint="check the state dir (free space, permissions) and create the "
                         "snapshot again",
                ))
            raise LinpodxError(
                f"could not record the worker of snapshot job {job.job_id}: "
                f"{exc.strerror or exc}",
                "no snapshot was taken; check the state dir (free space, permissions) and run "
                "`linpodx snapshot create` again",
            ) from None
        finally:
            # The go byte, only once the worker is on record: from now on only the worker
            # writes the job file. Closing stdin without it makes the worker exit without doing
            # anything.
            assert child.stdin is not None  # noqa: S101 - stdin=PIPE above
            with contextlib.suppress(BrokenPipeError):
                if recorded and job.worker_start is not None:
                    child.stdin.write(b"1")
                child.stdin.close()
            if not recorded:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=10)  # it exits at once; reap it
        CHILDREN.append(child)
        return job


REAL: Host = _Real()
_current: Host = REAL


def host() -> Host:
    """The host the snapshot service calls (the real one unless `use` handed in another)."""
    return _current


@contextlib.contextmanager
def use(other: Host) -> Iterator[Host]:
    """Make the snapshot service call `other` instead of the host inside the block."""
    global _current
    before, _current = _current, other
    try:
        yield other
    finally:
        _current = before


def reap() -> None:
    """Forget the workers this process started that have ended (their exit status read)."""
    for child in list(CHILDREN):
        if child.poll() is not None:
            CHILDREN.remove(child)
