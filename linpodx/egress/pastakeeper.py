"""Keeps pasta exactly as long as its container and its guard.

pasta has no exit fd (slirp4netns does) and, as packaged in Debian 12, does not quit when the
container's netns goes away. So it runs under this small keeper: it runs pasta in the
foreground as its child, writes pasta's pid, and stops pasta as soon as the guard or the
container's init process ends (a guard killed with SIGKILL included). Rootless, the CLI starts
the keeper as the plain user (pasta must run outside the user namespace the guard lives in)
and the guard adopts pasta by its pid; rootful, the guard starts it, with `--bind-netns FILE`:
the keeper then binds the container's netns onto FILE in a mount namespace of its own, for
pasta to open (see `linpodx.egress.netns._start_rootful_pasta`).

    python -m linpodx.egress.pastakeeper --guard-pid G --container-pid C --pidfile F
        [--bind-netns FILE] --max-files N --max-memory-mib M -- PASTA…
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from linpodx import proc
from linpodx.fsutil import atomic_write


def main(argv: list[str] | None = None) -> int:
    """Run pasta until the guard, the container or pasta itself ends."""
    ap = argparse.ArgumentParser(prog="linpodx-pasta-keeper")
    ap.add_argument("--guard-pid", type=int, required=True)
    ap.add_argument("--container-pid", type=int, required=True)
    ap.add_argument("--pidfile", required=True)
    ap.add_argument("--bind-netns", metavar="FILE")
    ap.add_argument("--max-files", type=int, required=True)
    ap.add_argument("--max-memory-mib", type=int, required=True)
    ap.add_argument("pasta", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = [a for a in args.pasta if a != "--"] if args.pasta[:1] == ["--"] else args.pasta
    try:
        watch = [os.pidfd_open(args.guard_pid), os.pidfd_open(args.container_pid)]
    except ProcessLookupError:
        return 1  # one of them is already gone: start nothing
    if args.bind_netns:
        from linpodx.egress.netns import bind_netns_privately

        try:
            bind_netns_privately(args.container_pid, args.bind_netns)
        except OSError as exc:
            print(f"pasta keeper: cannot bind the container's netns: {exc}", file=sys.stderr)
            return 1
    # pasta's limits from its first descriptor on (it opens pools of sockets at start, so
    # limits set afterwards would leave those above them): set on this keeper, inherited.
    import resource

    try:
        for res, value in ((resource.RLIMIT_NOFILE, args.max_files),
                           (resource.RLIMIT_AS, args.max_memory_mib << 20)):  # fmt: skip
            resource.setrlimit(res, (value, value))
    except (OSError, ValueError) as exc:
        print(f"pasta keeper: cannot set pasta's limits: {exc}", file=sys.stderr)
        return 1
    # popen: pasta is this keeper's one long-running child; it stops it itself.
    child = proc.popen(cmd, stdin=subprocess.DEVNULL)
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
