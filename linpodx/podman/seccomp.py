"""The seccomp profile every linpodx container runs with: podman's own, minus setuid/setgid.

A rootful container's root is host root, and the owner of a file may set its mode bits even
with every capability dropped: `chmod 4755 /workspace/x` in the container leaves a setuid-root
file on the host, which any host user can run. `nosuid` on the container's mount would not help
(the host sees the file through its own mount). So the container may not *make* such a file:
this profile is podman's default (`/etc/containers/seccomp.json`, else
`/usr/share/containers/seccomp.json`, the files podman itself reads) with

- every call that takes a mode (`chmod`, `fchmod`, `fchmodat`, `fchmodat2`, `open`, `openat`,
  `creat`, `mknod`, `mknodat`) taken out of the default's unconditional allow list and allowed
  only when the mode has neither S_ISUID nor S_ISGID, refused with EPERM when it has either.
  (The names must leave the unconditional list: libseccomp lets an unconditional allow win
  over a conditional errno rule for the same call, checked with podman 4.3 and libseccomp 2.5.)
- the calls whose mode seccomp cannot see (`openat2` takes it in a struct; io_uring submits
  opens from a ring) refused with ENOSYS, so the C library falls back to the calls above, as
  on a kernel without them.

Device nodes (CAP_MKNOD) and file capabilities (CAP_SETFCAP) need capabilities that every
container lacks (`--cap-drop=all`; the loader refuses to add either back), and a chown clears
the set-id bits of the file it changes; so with this profile nothing written through a mount
gives anyone more rights than the container had. Rootless containers get it too: a setuid file
of one of the person's subordinate ids would hand those ids to anyone on the host.

The profile is written once per content (`seccomp/SHA256.json` under the state dir, the name
being the digest of its own bytes) and passed as `--security-opt=seccomp=FILE`; podman copies
it into the container's config at create, so `start` and `exec` keep it. The fast run path
(`linpodx.fastpath.plan`) builds the same bytes again and uses a plan only when that file holds
them.

Standard library's cheapest modules only (json, os): the fast run path uses this.
"""

from __future__ import annotations

import json
import os

from linpodx import paths
from linpodx.digest import sha256
from linpodx.errors import EngineError

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

SOURCES = ("/etc/containers/seccomp.json", "/usr/share/containers/seccomp.json")
"""podman's default profile, in the order podman looks for it."""
MAX_SOURCE_BYTES = 1 << 20
SETID_BITS = 0o6000
"""S_ISUID | S_ISGID"""
EPERM = 1
ENOSYS = 38
MODE_ARG = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "open": 2,
    "openat": 3,
    "creat": 1,
    "mknod": 1,
    "mknodat": 2,
}
"""Each call that sets or creates with a mode, and the index of its mode argument."""
UNINSPECTABLE = ("openat2", "io_uring_setup", "io_uring_enter", "io_uring_register")
"""Calls that could create a file with a mode seccomp cannot see: refused with ENOSYS."""
DIR_NAME = "seccomp"
MECHANISM = (
    "seccomp: chmod/fchmod/fchmodat(2)/open/openat/creat/mknod(at) with S_ISUID or S_ISGID "
    "fail with EPERM, openat2 and io_uring with ENOSYS; no capabilities (no device nodes, no "
    "file capabilities)"
)
"""What stops a container from leaving a privileged file on the host (`linpodx doctor`)."""

_HINT = (
    "linpodx builds its seccomp profile from podman's default (containers-common's "
    "seccomp.json); reinstall that package"
)


def _masked(index: int, mask: int, value: int) -> dict[str, Any]:
    return {"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}


def build(default: Mapping[str, Any]) -> dict[str, Any]:
    """podman's default profile `default` (its parsed JSON) with the rules above. Pure.

    Raises EngineError for a document that is not a seccomp profile podman would read.
    """
    rules = default.get("syscalls")
    if (
        not isinstance(default.get("defaultAction"), str)
        or type(rules) is not list
        or not all(type(r) is dict and type(r.get("names")) is list for r in rules)
    ):
        raise EngineError("podman's default seccomp profile is not in the expected form", _HINT)
    taken = set(MODE_ARG) | set(UNINSPECTABLE)
    out = []
    for rule in rules:
        names = [n for n in rule["names"] if n not in taken]
        if names:
            out.append({**rule, "names": names})
    for name, index in MODE_ARG.items():
        out.append(
            {
                "names": [name],
                "action": "SCMP_ACT_ALLOW",
                "args": [_masked(index, SETID_BITS, 0)],
                "comment": "linpodx: allowed without S_ISUID/S_ISGID",
            }
        )
        for bit in (0o4000, 0o2000):
            out.append(
                {
                    "names": [name],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": EPERM,
                    "args": [_masked(index, bit, bit)],
                    "comment": "linpodx: no setuid/setgid files",
                }
            )
    out.append(
        {
            "names": list(UNINSPECTABLE),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": ENOSYS,
            "args": [],
            "comment": "linpodx: modes not inspectable; the C library falls back",
        }
    )
    return {**default, "syscalls": out}


def render(doc: Mapping[str, Any]) -> bytes:
    """The profile's bytes (canonical, so the same input always gives the same file name)."""
    # Not sort_keys (twice as slow, on the fast run path): `build` keeps the order of its
    # input, so the same default always gives the same bytes.
    return json.dumps(doc, separators=(",", ":")).encode()


def source() -> bytes:
    """podman's default profile, from the first of `SOURCES` that exists."""
    for path in SOURCES:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SOURCE_BYTES + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise EngineError(f"cannot read {path}: {exc.strerror}", _HINT) from exc
        if len(data) > MAX_SOURCE_BYTES:
            raise EngineError(f"{path} is larger than {MAX_SOURCE_BYTES} bytes", _HINT)
        return data
    raise EngineError("podman's default seccomp profile is missing: " + ", ".join(SOURCES), _HINT)


def profile() -> tuple[str, bytes]:
    """(path under the state dir, bytes) of linpodx's profile on this host now."""
    try:
        default = json.loads(source())
    except ValueError as exc:
        raise EngineError("podman's default seccomp profile is not valid JSON", _HINT) from exc
    if type(default) is not dict:
        raise EngineError("podman's default seccomp profile is not in the expected form", _HINT)
    data = render(build(default))
    where = os.path.join(paths.state_root(), DIR_NAME, f"{sha256(data).hexdigest()}.json")
    return where, data


def _holds(path: str, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        chunks = []
        while True:
            chunk = os.read(fd, len(data) + 1)
            if not chunk:
                break
            chunks.append(chunk)
            if sum(map(len, chunks)) > len(data):
                return False
        return b"".join(chunks) == data
    finally:
        os.close(fd)


def current() -> str | None:
    """The profile's path if the file there holds exactly its bytes now, else None (the fast
    run path then leaves the run to the full path, which writes it)."""
    where, data = profile()
    return where if _holds(where, data) else None


def ensure() -> str:
    """The profile's path, written first if the file there does not hold its bytes."""
    where, data = profile()
    if not _holds(where, data):
        from linpodx.fsutil import atomic_write

        try:
            atomic_write(where, data, durable=False)
        except OSError as exc:
            raise EngineError(
                f"cannot write the seccomp profile {where}: {exc.strerror}",
                "check that the linpodx state dir is writable (`linpodx doctor`)",
            ) from exc
    return where


def flag(path: str) -> str:
    """podman's flag for the profile at `path`."""
    return f"--security-opt=seccomp={path}"
