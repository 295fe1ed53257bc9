"""Keeps rootless pasta exactly as long as its container and its guard.

pasta has no exit fd (slirp4netns does) and, as packaged in Debian 12, does not quit when the
container's netns goes away. Rootless it cannot be the guard's child either (it must run as the
plain user, outside the user namespace the guard lives in). So the CLI starts this small
keeper instead: it runs pasta in the foreground as its child, writes pasta's pid for the guard
to adopt, and stops pasta as soon as the guard or the container's init process ends.

    python -m linpodx.egress.pastakeeper --guard-pid G --container-pid C --pidfile F -- PASTA…
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
from pathlib import Path

from linpodx.fsutil import atomic_write


def main(argv: list[str] | None = None) -> int:
    """Run pasta until the guard, the container or pasta itself ends."""
    ap = argparse.ArgumentParser(prog="linpodx-pasta-keeper")
    ap.add_argument("--guard-pid", type=int, required=True)
    ap.add_argument("--container-pid", type=int, required=True)
    ap.add_argument("--pidfile", required=True)
    ap.add_argument("pasta", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = [a for a in args.pasta if a != "--"] if args.pasta[:1] == ["--"] else args.pasta
    try:
        watch = [os.pidfd_open(args.guard_pid), os.pidfd_open(args.container_pid)]
    except ProcessLookupError:
        return 1  # one of them is already gone: start nothing
    # Popen: pasta is this keeper's one long-running child; it stops it itself.
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    atomic_write(Path(args.pidfile), f"{child.pid}\n".encode())
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    child_fd = os.pidfd_open(child.pid)
    while True:
        with contextlib.suppress(InterruptedError):
            ready, _, _ = select.select([*watch, child_fd], [], [])
            if ready:
                break
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=3)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
