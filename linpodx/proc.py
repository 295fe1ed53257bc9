"""The one place linpodx runs other programs.

argv lists only (never a shell string), a timeout on every call, and failures raised as
`EngineError` carrying argv, exit code and the program's own stderr.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from linpodx.errors import EngineError

DEFAULT_TIMEOUT = 120.0

# File descriptors lent to every program `run` starts while `lending` is active (see there).
_lent: tuple[int, ...] = ()


@dataclass(frozen=True)
class Result:
    """What a finished program left behind."""

    argv: tuple[str, ...]
    """The argv that ran."""
    returncode: int
    """Its exit status."""
    stdout: str
    """Everything it printed on stdout (decoded as UTF-8, invalid bytes replaced)."""
    stderr: str
    """Everything it printed on stderr."""


def which(program: str) -> str | None:
    """Full path of `program`, also looking in the sbin dirs a normal user's PATH lacks."""
    from linpodx.podman.spawn import which as find

    return find(program)


@contextlib.contextmanager
def lending(*fds: int) -> Iterator[None]:
    """Let the programs `run` starts in this block inherit `fds`.

    For a lock held with flock: the lock lives as long as any open copy of its file, so a
    program that outlives this process (killed with kill -9 while it waits) keeps the lock
    until it has finished, and the next command that takes the lock cannot act on a container
    while a stray `podman rename` or `tar` of ours is still changing it. Only for short-lived
    programs: never around a start, whose conmon would hold the lock for the container's life.
    """
    global _lent
    before = _lent
    _lent = (*before, *fds)
    try:
        yield
    finally:
        _lent = before


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = DEFAULT_TIMEOUT,
    input: str | bytes | None = None,
    env: Mapping[str, str] | None = None,
    what: str | None = None,
    hint: str | None = None,
) -> Result:
    """Run `argv` to completion and capture its output.

    With `check`, a non-zero exit raises `EngineError("<what> failed", hint)` whose stderr is the
    program's own. A missing program or a timeout always raises.
    """
    argv = tuple(argv)
    label = what or os.path.basename(argv[0])
    data = input.encode() if isinstance(input, str) else input
    try:
        cp = subprocess.run(
            argv,
            input=data,
            capture_output=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
            pass_fds=_lent,
        )
    except FileNotFoundError as exc:
        raise EngineError(
            f"{argv[0]} not found",
            hint or f"install {os.path.basename(argv[0])} (see `linpodx doctor`)",
            argv=argv,
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise EngineError(
            f"{label} did not finish within {timeout:g}s",
            hint or "check the engine with `linpodx doctor`",
            argv=argv,
            stderr=(exc.stderr or b"").decode("utf-8", "replace"),
        ) from exc
    res = Result(
        argv=argv,
        returncode=cp.returncode,
        stdout=cp.stdout.decode("utf-8", "replace"),
        stderr=cp.stderr.decode("utf-8", "replace"),
    )
    if check and cp.returncode != 0:
        raise EngineError(
            f"{label} failed (exit {cp.returncode})",
            hint,
            argv=argv,
            returncode=cp.returncode,
            stderr=res.stderr,
        )
    return res


def start_detached(argv: Sequence[str], *, output_fd: int) -> subprocess.Popen[bytes]:
    """Start `argv` to outlive this command (the only other way linpodx starts a program): in
    its own session, so the terminal's job control (a Ctrl-C of the CLI) does not reach it;
    stdin a pipe the caller writes and closes, stdout and stderr on `output_fd`, no other fd
    (nothing lent: a long-lived helper must not hold a lock). OSError if it cannot start."""
    return subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=output_fd,
        stderr=output_fd,
        start_new_session=True,
        close_fds=True,
    )
