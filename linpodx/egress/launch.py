"""Where one container's egress files live, and starting its guard and its one-call hook.

`linpodx.egress.guard` is the API the container lifecycle calls; these are the parts of it that
a guarded `linpodx run --rm` needs before podman starts, which `linpodx.fastpath.run` does
before it imports anything heavy (in `linpodx.fastpath.KERNEL`; see there).
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys

from linpodx import paths, proc
from linpodx.fsutil import atomic_write
from linpodx.podman.runline import unshare_argv

# Files under containers/NAME/egress/ (`linpodx.egress.state.EgressState` names them too).
EGRESS_DIR = "egress"
RESOLV_CONF_FILE = "resolv.conf"
POLICY_FILE = "policy.json"
HOOKS_DIR = "hooks"
HOOK_FIFO = "hook.state"
"""FIFO through which the one-call hook hands the OCI state (with the container's pid) over."""
HOOK_ANSWER_FIFO = "hook.answer"
"""FIFO on which `linpodx run` tells the hook `ready` (or why not)."""
GUARD_FILE = "guard.json"
GUARD_LOG = "guard.log"
HELPER_LOG = "helper.log"
PASTA_PIDFILE = "pasta.pid"
PASTA_NETNS = "pasta.netns"

RESOLVER_ADDR = "127.0.0.1"
"""Where the policy resolver listens inside the container's network namespace."""
READY_TIMEOUT = 30.0
WAIT_TIMEOUT = 300.0
"""How long a launched guard waits for its container's pid before it ends by itself."""
CONTROL_FD = 3
GUARD_MODULE = "linpodx.egress.guardproc"
GUARD_COMMAND = "_egress-guard"
"""The hidden CLI command that runs a guard (`linpodx.cli.egress`)."""
HOOK_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook.sh")
HOOK_SHELL = "/bin/sh"
HOOK_FILE = "linpodx-egress.json"

RESOLV_CONF = (
    "# written by linpodx: the policy resolver is this container's only DNS server\n"
    f"nameserver {RESOLVER_ADDR}\n"
    "options timeout:2 attempts:2\n"
)

_launched: dict[str, socket.socket] = {}
"""Control sockets of the guards this process launched and has not attached yet, by name."""


def egress_dir(name: str) -> str:
    """containers/NAME/egress under the state dir."""
    return os.path.join(paths.containers_root(), name, EGRESS_DIR)


def ensure_egress_dir(name: str) -> str:
    """`egress_dir(name)`, created 0700 (with the container's dir) if missing."""
    where = egress_dir(name)
    paths.ensure_dir_str(os.path.dirname(where))
    return paths.ensure_dir_str(where)


def policy_bytes(doc: dict[str, object]) -> bytes:
    """The policy file's content for a policy document (`guard._policy_doc`)."""
    return json.dumps(doc, sort_keys=True).encode()


def write_new_run_files(name: str, policy: dict[str, object]) -> str:
    """For a container that has no egress files yet: its policy file (durable: a re-apply's
    revision in it must survive a crash) and its resolv.conf (0644, so any user in the
    container can read it; not fsynced: constant, rewritten at every start). Returns the
    resolv.conf's path."""
    where = ensure_egress_dir(name)
    atomic_write(os.path.join(where, POLICY_FILE), policy_bytes(policy))
    resolv = os.path.join(where, RESOLV_CONF_FILE)
    atomic_write(resolv, RESOLV_CONF.encode(), mode=0o644, durable=False)
    return resolv


def guard_argv(name: str) -> list[str]:
    """How the guard is started. Rootless it runs under `podman unshare`, i.e. as uid 0 of
    the rootless user namespace, so it may join the container's netns and run nft there
    (`podman unshare` passes the control socket through like any inherited fd)."""
    argv = [
        sys.executable,
        "-m",
        GUARD_MODULE,
        "--container",
        name,
        "--control-fd",
        str(CONTROL_FD),
        "--wait",
        f"{WAIT_TIMEOUT:g}",
    ]
    return unshare_argv(argv, proc.which("podman") or "podman")


def launch(name: str) -> None:
    """Start `name`'s guard now; it waits (at most WAIT_TIMEOUT) for `attach` to send the pid.

    The guard ends by itself when the control socket closes (this process ended or `detach`
    ran) before a pid came, so a launch that is never attached leaves nothing behind.
    """
    old = _launched.get(name)
    if old is not None and not hung_up(old):
        return
    forget_launch(name)
    where = ensure_egress_dir(name)
    ours, theirs = socket.socketpair()
    try:
        spawn_detached(
            guard_argv(name), os.path.join(where, GUARD_LOG), control=theirs.fileno()
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    _launched[name] = ours


def take_launched(name: str) -> socket.socket:
    """The control socket of the guard `launch` started for `name` (KeyError if none)."""
    return _launched.pop(name)


def hung_up(sock: socket.socket) -> bool:
    """A waiting guard never writes before it has a pid: readable means it is gone."""
    r, _, _ = select.select([sock], [], [], 0)
    return bool(r)


def forget_launch(name: str) -> None:
    sock = _launched.pop(name, None)
    if sock is not None:
        sock.close()


def spawn_detached(argv: list[str], log: str, control: int | None = None) -> None:
    """Start the guard or a helper, detached (see `proc.spawn_detached`); `control` becomes its
    fd CONTROL_FD. This module owns the guard's lifetime, hence no parent waits for it."""
    proc.spawn_detached(argv, log, None if control is None else (control, CONTROL_FD))


def hook_setup(name: str) -> str:
    """Make `name`'s OCI hooks dir (for `podman --hooks-dir=DIR run`) and the two FIFOs of its
    `createRuntime` hook (hook.sh): one hands the OCI state over, the other takes the answer.
    Returns the dir.

    For one-call runs: the hook holds the container's command back until the guard is ready,
    so create, init, attach and start need no separate podman calls.
    """
    where = ensure_egress_dir(name)
    hooks = paths.ensure_dir_str(os.path.join(where, HOOKS_DIR))
    fifos = [os.path.join(where, HOOK_FIFO), os.path.join(where, HOOK_ANSWER_FIFO)]
    for fifo in fifos:
        try:
            os.unlink(fifo)
        except FileNotFoundError:
            pass
        os.mkfifo(fifo, 0o600)
    hook = {
        "version": "1.0.0",
        "hook": {
            "path": HOOK_SHELL,
            "args": [HOOK_SHELL, HOOK_SCRIPT, *fifos],
            # runc ends a hook that outlives this, and the container does not start.
            "timeout": int(READY_TIMEOUT) + 10,
        },
        "when": {"always": True},
        "stages": ["createRuntime"],
    }  # fmt: skip
    atomic_write(os.path.join(hooks, HOOK_FILE), json.dumps(hook).encode(), durable=False)
    return hooks
