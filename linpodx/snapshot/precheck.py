"""What `snapshot create` checks while the container is held, before it commits anything:
that the snapshot fits (the profile's `resources.snapshot_max_size` and the free disk) and
that a rollback could put it back. A snapshot that fails either is refused with the reason,
never taken and found useless at the rollback.

What a rollback needs, and so what is checked:
- every workspace path fits in PATH_MAX as tar names it (`./a/b/…`): tar creates deeper
  chains, but restoring one fails (`File name too long`, from its ACL and owner calls);
- no file that would not come back: sockets (tar skips them, with a warning only) and device
  nodes (a rollback deletes them: on the host they would be devices); FIFOs, hard links and
  names in any bytes (not UTF-8, newlines) come back and are fine (setuid/setgid bits and file
  capabilities do not, by design, but the files do);
- a readable tree (what tar cannot read, it cannot archive);
- in the container's rootfs, `$HOME` and every mount target reached through directories
  only: a rollback creates `$HOME` with `podman cp` and mounts the workspace there, and both
  fail (or land elsewhere) through a symlink the agent put in place of `/home/agent`.

Sizes: `podman commit` writes the container's changes in full (containers/storage applies a
layer by writing every byte of it, so a 1 GiB sparse file costs 1 GiB), so they count at
their apparent size (`podman inspect --size`, `SizeRw`). The workspace is archived with
`tar --sparse`, so it counts at the data its files really hold, plus tar's headers (a header
block and a pax header for every entry: 1.5 KiB, which is what 500,000 empty files cost).

Rootless, the walks run inside `podman unshare` (`python -m linpodx.snapshot.precheck …`),
where the container's sub-uid files are readable and its rootfs can be mounted.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from linpodx.errors import EngineError, InvalidInput
from linpodx.podman import engine

PATH_MAX = 4096  # Linux's, with the NUL: a name tar passes to a syscall is at most 4095 bytes
TAR_ENTRY_BYTES = 1536  # header block + pax header block + its data block (GNU tar, posix format)
BLOCK = 512
MAX_PROBLEMS = 5  # named in the refusal; the rest are counted


@dataclass(frozen=True)
class Tree:
    """What a walk of one workspace found."""

    entries: int
    data_bytes: int
    """Bytes tar --sparse stores for file contents (each file rounded up to 512)."""
    problems: tuple[str, ...]
    more_problems: int = 0
    """Problems found beyond those named."""

    @property
    def archive_bytes(self) -> int:
        """Estimated archive size."""
        return self.entries * TAR_ENTRY_BYTES + self.data_bytes + 20 * BLOCK

    def to_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "data_bytes": self.data_bytes,
                "problems": list(self.problems), "more_problems": self.more_problems}


def _round(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _shown(member: bytes, limit: int = 120) -> str:
    text = os.fsdecode(member)
    from linpodx.output import safe_text

    return safe_text(text if len(text) <= limit else text[:60] + "…" + text[-50:])


def _file_data(st: os.stat_result) -> int:
    """What tar --sparse stores for a regular file: its allocated data, at most its size (and
    a sparse map block when it has holes)."""
    allocated = st.st_blocks * 512
    if allocated >= st.st_size:
        return _round(st.st_size)
    return _round(allocated) + BLOCK


def _raise_nofile() -> None:
    """A walk holds one descriptor per level, and levels go down to PATH_MAX / 2: as many as
    the hard limit allows (a deeper tree than that is refused below anyway)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def walk(root: str) -> Tree:
    """Walk the workspace at `root` (a directory or a regular file) without recursion and
    without following links; sizes and what would make it unrestorable.

    By directory descriptors (each level opened relative to its parent): the absolute path
    of a deep entry is longer than PATH_MAX itself, which is the very thing to find."""
    problems: list[str] = []
    more = 0

    def problem(text: str) -> None:
        nonlocal more
        if len(problems) < MAX_PROBLEMS:
            problems.append(text)
        else:
            more += 1

    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        return Tree(1, _file_data(st) if stat.S_ISREG(st.st_mode) else 0, ())
    _raise_nofile()
    entries, data = 1, 0
    # (descriptor, member name of the directory, subdirectories still to enter)
    stack: list[tuple[int, bytes, list[bytes]]] = []

    def enter(fd: int, member: bytes) -> None:
        subdirs: list[bytes] = []
        nonlocal entries, data
        try:
            with os.scandir(fd) as it:
                children = list(it)
        except OSError as exc:
            os.close(fd)
            problem(f"{_shown(member)} cannot be read ({exc.strerror}); tar could not archive "
                    "it")
            return
        for entry in children:
            name = os.fsencode(entry.name)
            child = member + b"/" + name
            entries += 1
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError as exc:
                problem(f"{_shown(child)} cannot be read ({exc.strerror})")
                continue
            mode = est.st_mode
            if len(child) + (1 if stat.S_ISDIR(mode) else 0) >= PATH_MAX:
                # Nothing below it fits either: not walked further.
                problem(f"{_shown(child)} is {len(child)} bytes long, beyond PATH_MAX "
                        f"({PATH_MAX}): tar archives it but cannot restore it (File name too "
                        "long)")
                continue
            if stat.S_ISSOCK(mode):
                problem(f"{_shown(child)} is a socket: tar leaves sockets out, so it would "
                        "not come back")
            elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                problem(f"{_shown(child)} is a device node: a rollback never restores device "
                        "nodes (they would be devices on the host)")
            elif stat.S_ISREG(mode):
                data += _file_data(est)
            elif stat.S_ISDIR(mode):
                subdirs.append(name)
        stack.append((fd, member, subdirs))

    enter(os.open(root, _DIR_FLAGS), b".")
    try:
        while stack:
            fd, member, subdirs = stack[-1]
            if not subdirs:
                os.close(fd)
                stack.pop()
                continue
            name = subdirs.pop()
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                problem(f"{_shown(member + b'/' + name)} cannot be read ({exc.strerror})")
                continue
            enter(sub, member + b"/" + name)
    finally:
        for fd, _member, _subdirs in stack:
            os.close(fd)
    return Tree(entries, data, tuple(problems), more)


def rootfs_problems(root: str, home: str, targets: Sequence[str]) -> list[str]:
    """Paths a rollback goes through in the container's rootfs (mounted at `root`) that are
    not directories all the way: `home` must be one (or absent), every mount target's parents
    too (the target itself may also be a regular file, for a file mount)."""
    out: list[str] = []
    for path, leaf_may_be_file in ((home, False), *((t, True) for t in targets)):
        parts = [p for p in path.split("/") if p]
        cur = root
        for i, part in enumerate(parts):
            cur = os.path.join(cur, part)
            inside = "/" + "/".join(parts[: i + 1])
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                break  # made by the rollback's create
            except OSError as exc:
                out.append(f"{inside} cannot be checked ({exc.strerror})")
                break
            last = i == len(parts) - 1
            if stat.S_ISLNK(st.st_mode):
                out.append(f"{inside} is a symlink (to {_shown(os.fsencode(os.readlink(cur)))})"
                           f" in the container's filesystem: a rollback cannot create "
                           f"{'$HOME' if path == home else 'the mount'} at {path} through it")
                break
            if not stat.S_ISDIR(st.st_mode) and not (last and leaf_may_be_file
                                                      and stat.S_ISREG(st.st_mode)):
                out.append(f"{inside} is not a directory in the container's filesystem: a "
                           f"rollback cannot create {path} there")
                break
    return out


def fmt_bytes(n: int) -> str:
    """`1.0 GiB`, `770.0 MiB`, `512 B`."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover - the loop returns


DISK_RESERVE = 64 << 20
"""Left free beside a snapshot: the audit records, job and manifest files still to come."""


def check_size(name: str, *, changes: int, trees: Sequence[tuple[str, Tree]], bound: int,
               bound_text: str, archive_dir: str, storage_dir: str) -> None:
    """Refuse a snapshot above its bound or the free disk (InvalidInput, every figure in
    the message): `changes` bytes go to podman's storage at `storage_dir`, the archives to
    `archive_dir`."""
    ws = sum(t.archive_bytes for _target, t in trees)
    parts = [f"the container's changes {fmt_bytes(changes)} (apparent size: podman commit "
             "writes sparse files in full)"]
    parts += [f"the workspace {target} about {fmt_bytes(t.archive_bytes)} ({t.entries} "
              "entries)" for target, t in trees]
    said = "; ".join(parts)
    if changes + ws > bound:
        raise InvalidInput(
            f"snapshot of {name} refused before anything was committed: it would take about "
            f"{fmt_bytes(changes + ws)}, above the profile's resources.snapshot_max_size "
            f"{bound_text}: {said}",
            "remove large (or sparse) files the agent made (`podman diff NAME` lists the "
            "container's changes), or raise resources.snapshot_max_size in the profile and "
            "apply it again",
        )
    need: dict[int, list[int]] = {}
    free: dict[int, tuple[int, str]] = {}
    for path, n in ((storage_dir, changes), (archive_dir, ws)):
        st = os.statvfs(path)
        dev = os.stat(path).st_dev
        need.setdefault(dev, []).append(n)
        free[dev] = (st.f_bavail * st.f_frsize, path)
    for dev, ns in need.items():
        avail, path = free[dev]
        if sum(ns) + DISK_RESERVE > avail:
            raise InvalidInput(
                f"snapshot of {name} refused before anything was committed: it would take "
                f"about {fmt_bytes(sum(ns))} on the filesystem of {path}, which has "
                f"{fmt_bytes(avail)} free (and linpodx keeps {fmt_bytes(DISK_RESERVE)}): "
                f"{said}",
                "free disk space there (`podman system df`, old snapshots: `linpodx snapshot "
                "list`), then create the snapshot again",
            )


# ----------------------------------------------------------------------------------------------
# running the walks (inside `podman unshare` when rootless)


def _unshared(args: Sequence[str], what: str) -> Any:
    res = engine.unshare([sys.executable, "-m", "linpodx.snapshot.precheck", *args], what=what,
                         timeout=3600)
    try:
        return json.loads(res.stdout)
    except ValueError:
        raise EngineError(f"{what} printed something that is not JSON", argv=res.argv,
                          stderr=res.stdout[-2000:]) from None


def walk_mount(source: str) -> Tree:
    """`walk` of one writable mount's source, as the user who can read all of it."""
    rootless = os.geteuid() != 0
    if not rootless:
        return walk(source)
    d = _unshared(["walk", source], f"checking the workspace {source}")
    return Tree(int(d["entries"]), int(d["data_bytes"]), tuple(map(str, d["problems"])),
                int(d["more_problems"]))


def check_rootfs(container_id: str, home: str, targets: Sequence[str]) -> list[str]:
    """`rootfs_problems` of the container's own filesystem (`podman mount`, as the user who
    may mount it)."""
    if os.geteuid() != 0:
        return [str(p) for p in _unshared(["rootfs", container_id, home, *targets],
                                          "checking the container's filesystem")]
    return _rootfs_here(container_id, home, targets)


def _rootfs_here(container_id: str, home: str, targets: Sequence[str]) -> list[str]:
    root = engine.mount_rootfs(container_id)
    try:
        if not root or not os.path.isdir(root):
            raise EngineError(f"podman mount gave no directory for {container_id[:12]}")
        return rootfs_problems(root, home, targets)
    finally:
        engine.umount_rootfs(container_id)


def main(argv: list[str]) -> int:
    """`python -m linpodx.snapshot.precheck walk PATH | rootfs CID HOME TARGET…` (run by
    linpodx inside `podman unshare`); prints JSON."""
    if len(argv) == 2 and argv[0] == "walk":
        out: Any = walk(argv[1]).to_dict()
    elif len(argv) >= 3 and argv[0] == "rootfs":
        out = _rootfs_here(argv[1], argv[2], argv[3:])
    else:
        sys.stderr.write("usage: python -m linpodx.snapshot.precheck walk PATH | rootfs CID "
                         "HOME TARGET...\n")
        return 2
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
