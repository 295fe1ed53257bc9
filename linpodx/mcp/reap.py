"""Ending the MCP server that a session left running in its container.

`podman exec` gives linpodx no handle on the process it starts in the container. When a server
does not exit once its input closes, `mcp attach` ends its `podman exec`, and podman leaves the
process itself running. So `mcp attach` marks the server: its `podman exec` gets
`LINPODX_MCP_SESSION=<session id>` in the environment, and the server's children inherit it.
When the session is over and the server did not exit by itself, `end_left_behind` sends
SIGKILL to every process in the container's pid namespace whose environment carries the mark.

- Only processes in the container's own pid namespace are looked at. The agent may copy the
  mark anywhere inside the container, which at most gets its own processes killed, but it
  cannot put it on a process outside.
- Each process is signalled through a pidfd and read once more through that pidfd's pid, so a
  pid that was reused between the scan and the signal is never hit.
- Rootless, the scan runs under `podman unshare` (`python -m linpodx.mcp.reap`). As uid 0 of
  the rootless user namespace it may read the environment of every container process, whatever
  its uid inside, and signal it. Rootful, it runs in this process.
- The mark is what the process was started with (`/proc/PID/environ`). A hostile server can
  overwrite that memory and so escape. It then stays confined to its container, and
  `mcp attach` says that it could not end it.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

from linpodx.errors import EngineError, NotFound

ENV = "LINPODX_MCP_SESSION"
ROUNDS = 5
"""Scans at most: processes the server forks while it is being ended are found by the next."""
EXIT_WAIT = 2.0
"""Seconds to wait for the killed processes of one scan to be gone before the next."""
ENVIRON_MAX = 4 * 1024 * 1024
"""Longest environment read (Linux allows ~2 MiB of arguments and environment together)."""


def _pid_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _carries(pid: int, ns: str, mark: bytes) -> bool:
    """True if process `pid` is in pid namespace `ns` and its environment holds `mark`."""
    try:
        if _pid_ns(pid) != ns:
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read(ENVIRON_MAX)
    except OSError:  # gone, or not ours to look at
        return False
    return mark in env.split(b"\0")


def _marked(ns: str, mark: bytes) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _carries(int(entry.name), ns, mark):
            found.append(int(entry.name))
    return found


def _wait_gone(fds: list[int], timeout: float) -> None:
    """Wait until each pidfd's process has exited (at most `timeout`), then close them."""
    deadline = time.monotonic() + timeout
    pending = list(fds)
    try:
        while pending and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(pending, [], [], left)
            pending = [fd for fd in pending if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def kill_marked(init_pid: int, session_id: str) -> tuple[int, int]:
    """SIGKILL every process of `init_pid`'s pid namespace that carries the mark of
    `session_id`; (how many were killed, how many still carry it afterwards)."""
    ns = _pid_ns(init_pid)
    mark = f"{ENV}={session_id}".encode()
    killed: set[int] = set()
    for _ in range(ROUNDS):
        found = _marked(ns, mark)
        if not found:
            return len(killed), 0
        signalled: list[int] = []
        for pid in found:
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # already gone
                continue
            try:
                # The pidfd names one process for good: check that this one carries the mark
                # (the pid may have been reused since the scan), then signal it.
                if _carries(pid, ns, mark):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    killed.add(pid)
                    signalled.append(fd)
                    fd = -1
            except OSError:
                pass
            finally:
                if fd >= 0:
                    os.close(fd)
        _wait_gone(signalled, EXIT_WAIT)
    return len(killed), len(_marked(ns, mark))


def end_left_behind(container_id: str, session_id: str) -> int:
    """End what the session's server left running in the container; how many processes
    were killed. Raises EngineError if that could not be done (or not completely)."""
    from linpodx.podman import engine
    from linpodx.podman.runline import unshare_argv
    from linpodx.proc import run, which

    try:
        info = engine.inspect(container_id)
    except NotFound:
        return 0  # gone, and all its processes with it
    pid = info.get("State", {}).get("Pid", 0)
    if engine.state(info) != "running" or not isinstance(pid, int) or pid <= 0:
        return 0  # stopped: nothing of it runs
    if os.geteuid() == 0:
        try:
            killed, left = kill_marked(pid, session_id)
        except OSError as exc:
            raise EngineError(
                f"could not look for the server's processes: {exc.strerror or exc}"
            ) from None
    else:
        res = run(
            unshare_argv([sys.executable, "-m", __name__, str(pid), session_id],
                         which("podman") or "podman"),
            what="podman unshare (ending the server's processes)",
            timeout=60,
        )
        try:
            killed, left = (int(x) for x in res.stdout.split())
        except ValueError:
            raise EngineError(
                f"the process reaper printed {res.stdout.strip()[:100]!r}, not two counts"
            ) from None
    if left:
        raise EngineError(f"{left} of the server's processes could not be ended")
    return killed


def main(argv: list[str]) -> int:
    """`python -m linpodx.mcp.reap INIT_PID SESSION_ID`: prints `KILLED LEFT`."""
    try:
        init_pid, session_id = int(argv[0]), argv[1]
        killed, left = kill_marked(init_pid, session_id)
    except (IndexError, ValueError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    sys.stdout.write(f"{killed} {left}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
