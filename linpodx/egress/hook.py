"""OCI `createRuntime` hook of a guarded one-call run (`podman --hooks-dir=… run`).

The OCI runtime runs this after it has made the container's namespaces and before the
container's command starts; its exit status decides whether the command ever starts. It hands
the container's init pid (from the OCI state on stdin) to `linpodx run` through a FIFO, then
waits until the egress guard reports `ready` for exactly that pid in its state file. Anything
else (the guard failed or stopped, no answer within the timeout, bad input) exits non-zero, so
runc refuses to start the container: the filter is in place before the agent's first packet,
or the agent never runs.

Run as a script with `python -I -S` (standard library only, no site-packages): it is on the
critical path of every filtered run, and needs nothing of linpodx.

    hook.py PID_FIFO GUARD_FILE TIMEOUT_SECONDS   (OCI state JSON on stdin)

Only `podman run` passes the hooks dir: a plain `podman start` of the container later runs no
hook and no guard, and the container keeps `--network=none`.
"""

from __future__ import annotations

import json
import os
import sys
import time

POLL_SECONDS = 0.002


def _guard_state(path: str) -> dict[str, object]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write("linpodx egress hook: usage: hook.py PID_FIFO GUARD_FILE TIMEOUT\n")
        return 2
    fifo, guard_file, timeout = argv[1], argv[2], float(argv[3])
    try:
        state = json.load(sys.stdin)
        pid = int(state["pid"])
    except (ValueError, KeyError, TypeError) as exc:
        sys.stderr.write(f"linpodx egress hook: no container pid in the OCI state: {exc}\n")
        return 1
    if pid <= 0:
        sys.stderr.write("linpodx egress hook: no container pid in the OCI state\n")
        return 1
    deadline = time.monotonic() + timeout
    # Blocks until `linpodx run` opens the FIFO; the runtime's hook timeout ends a wait for a
    # linpodx that is gone, and then the container does not start.
    fd = os.open(fifo, os.O_WRONLY)
    try:
        os.write(fd, f"{pid}\n".encode())
    finally:
        os.close(fd)
    while time.monotonic() < deadline:
        if not os.path.isdir(os.path.dirname(guard_file)):
            sys.stderr.write("linpodx egress hook: the egress guard was removed\n")
            return 1
        info = _guard_state(guard_file)
        if info.get("state") == "ready" and info.get("container_pid") == pid:
            return 0
        if info.get("state") in ("failed", "stopped") and info.get("container_pid") == pid:
            sys.stderr.write(f"linpodx egress hook: guard {info.get('state')}: "
                             f"{info.get('error', '')}\n")  # fmt: skip
            return 1
        time.sleep(POLL_SECONDS)
    sys.stderr.write("linpodx egress hook: the egress guard did not become ready in time\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
