"""Workspace archives: the content of a container's writable bind mounts.

`podman commit` keeps the container's own filesystem but not what is bind-mounted into it, so
a snapshot also archives each writable bind mount with GNU tar (numeric owners, modes, times,
POSIX ACLs and every extended attribute, file capabilities included; a restore brings back
no setuid/setgid bit, device node or file capability: `Restore.extract`). Rootless, tar runs
under `podman unshare` so files owned by the container's sub-uids keep their owners both ways.

Restoring never writes into the live directory: the archive is extracted into a staging
directory next to the mount source, and `swap` renames the live directory aside and the staging
one into place (two renames in the same directory). `undo_interrupted` puts the original back,
from whatever state on disk a failure or a kill left.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from linpodx import paths, proc
from linpodx.errors import EngineError, InvalidInput, LinpodxError
from linpodx.podman import engine
from linpodx.podman.runline import unshare_argv

DIR = "dir"
FILE = "file"


@dataclass(frozen=True)
class WritableMount:
    """A writable bind mount of the container."""

    source: str
    """Host path."""
    target: str
    """Path inside the container."""


# GNU tar keeps only user.* xattrs unless told otherwise, and POSIX ACLs only with --acls: both
# sides name every namespace, so ACLs (system.posix_acl_*) and file capabilities
# (security.capability) come back exactly (a dropped ACL mask can widen group access).
_XATTR_ARGS = ("--acls", "--xattrs", "--xattrs-include=*")
# ... except file capabilities, which a restore leaves out (`Restore.extract`).
_FILE_CAPS = "security.capability"
_TREE = "tree"
"""A directory mount's extracted content, inside the (private) staging directory."""


def _unshare_prefix() -> list[str]:
    # Rootless: inside the user namespace host-uid files are root's and sub-uid files keep
    # their own owners, so tar can read everything and restore owners exactly.
    return unshare_argv([])

def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def writable_mounts(inspect: Mapping[str, Any]) -> list[WritableMount]:
    """The writable bind mounts of a container (from `podman inspect`), sorted by target.

    Bind mounts of linpodx's own files (a resolv.conf the egress guard writes, …) are not
    workspace and are left out.
    """
    own = (paths.state_dir(), paths.runtime_dir(), paths.config_dir())
    out = []
    for m in inspect.get("Mounts") or []:
        if m.get("Type") != "bind" or not m.get("RW"):
            continue
        src = Path(str(m.get("Source", "")))
        if any(_inside(src, r) for r in own):
            continue
        out.append(WritableMount(source=str(src), target=str(m.get("Destination", ""))))
    return sorted(out, key=lambda w: w.target)


def _related(a: Path, b: Path) -> bool:
    """The same path, or one inside the other."""
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def _real(path: str) -> Path:
    return Path(os.path.realpath(path))


def shared_with(
    mounts: Sequence[WritableMount], own_id: str, others: Iterable[Mapping[str, Any]],
    *, writers_only: bool = False,
) -> list[str]:
    """Which other containers (their `podman inspect`) mount one of `mounts`' sources, or a
    path inside or containing one; one description each. Pure, for the checks below.

    `writers_only`: only running containers that can write there count."""
    found = []
    for info in others:
        if str(info.get("Id", "")) == own_id:
            continue
        if writers_only and not (info.get("State") or {}).get("Running"):
            continue
        other = str(info.get("Name", "")).lstrip("/") or str(info.get("Id", ""))[:12]
        for m in info.get("Mounts") or []:
            src = str(m.get("Source") or "")
            if not src.startswith("/") or (writers_only and not m.get("RW")):
                continue
            for ours in mounts:
                if _related(_real(src), _real(ours.source)):
                    found.append(f"container {other} mounts {src} at "
                                 f"{m.get('Destination', '?')} (ours: {ours.source} at "
                                 f"{ours.target})")
                    break
    return found


def other_containers(own_id: str) -> list[dict[str, Any]]:
    """`podman inspect` of every other container podman knows (running or not, linpodx's or
    not). One that goes away while we look is left out."""
    return engine.other_containers_info(own_id)


def check_distinct(name: str, mounts: Sequence[WritableMount], *, for_rollback: bool) -> None:
    """Refuse writable mounts whose sources overlap (the same source at two targets, or one
    inside another): each is archived and swapped on its own, so the outer one's archive holds
    the inner one's content too, and a rollback stages and renames inside a directory it is
    renaming as well (it failed every time and left a staging copy in the live workspace)."""
    for i, a in enumerate(mounts):
        for b in mounts[i + 1:]:
            if _related(_real(a.source), _real(b.source)):
                same = _real(a.source) == _real(b.source)
                raise InvalidInput(
                    f"cannot {'roll back' if for_rollback else 'snapshot'} {name}: its "
                    f"writable mounts {a.target} ({a.source}) and {b.target} ({b.source}) "
                    + ("have the same source" if same else "overlap (one source is inside "
                       "the other)"),
                    "give each writable mount its own directory, none inside another (a "
                    "writable directory already brings its subdirectories); nothing was "
                    "changed",
                )


def check_workspace(name: str, info: Mapping[str, Any], *, for_rollback: bool) -> None:
    """The checks of a container's writable mounts before a snapshot or a rollback:
    `check_distinct`, then `check_not_shared`."""
    check_distinct(name, writable_mounts(info), for_rollback=for_rollback)
    check_not_shared(name, info, for_rollback=for_rollback)


def check_not_shared(name: str, info: Mapping[str, Any], *, for_rollback: bool) -> None:
    """Refuse when another container uses this container's writable mounts.

    Rollback: any other container (running or not, linpodx's or not) that mounts a source, or a
    path inside or containing it, would be left on the renamed-aside copy, which is then
    deleted. Create: another running container that can write there makes the archive
    inconsistent (only this container is held still; tar fails on a file changed while read).
    """
    mounts = writable_mounts(info)
    if not mounts:
        return
    own_id = str(info.get("Id", ""))
    shared = shared_with(mounts, own_id, other_containers(own_id), writers_only=not for_rollback)
    if not shared:
        return
    if for_rollback:
        raise InvalidInput(
            f"cannot roll back {name}: its workspace is also mounted elsewhere: "
            + "; ".join(shared),
            "a rollback swaps the workspace directory by rename, which would leave the other "
            "container on a deleted copy; remove that container (or give it another "
            "directory), then roll back again; nothing was changed",
        )
    raise InvalidInput(
        f"cannot snapshot {name}: another running container can write to its workspace: "
        + "; ".join(shared),
        "only the snapshotted container is held still, so the archive would not be "
        "consistent; stop the other container (or mount the directory read-only there), "
        "then create the snapshot again",
    )


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def archive(mount: WritableMount, out: Path) -> dict[str, Any]:
    """Archive one mount's content into `out`; returns its manifest entry."""
    src = Path(mount.source)
    if src.is_dir() and not src.is_symlink():
        kind, cwd, member = DIR, src, "."
    elif src.is_file() and not src.is_symlink():
        kind, cwd, member = FILE, src.parent, src.name
    else:
        raise EngineError(
            f"cannot archive writable mount {mount.target}: {mount.source} is not a directory "
            "or regular file",
            "check the profile's mounts",
        )
    tar = proc.which("tar") or "tar"
    _tar([*_unshare_prefix(), tar, "--create", "--file", str(out), "--numeric-owner",
          *_XATTR_ARGS, "--sparse", "--directory", str(cwd), "--", member],
         f"archiving {mount.target}", "check free disk space under the linpodx state dir")
    out.chmod(paths.FILE_MODE)
    return {
        "source": mount.source,
        "target": mount.target,
        "kind": kind,
        "file": out.name,
        "sha256": sha256_file(out),
        "size": out.stat().st_size,
    }


def tar_reason(stderr: str) -> tuple[str, str]:
    """(reason, line) of tar's first complaint: `File name too long` and the line it ended,
    not tar's closing `Exiting with failure status due to previous errors`. ("", "") if tar
    said nothing of its own."""
    for line in stderr.splitlines():
        # (tar names itself as it was called: `/usr/bin/tar: …`.)
        prog, sep, text = line.strip().partition(": ")
        if not sep or os.path.basename(prog) != "tar":
            continue
        if "Exiting with failure status" in text or text.startswith("Removing leading"):
            continue
        text = "tar: " + text
        reason = text.rsplit(": ", 1)[-1]
        return reason, (text if len(text) <= 300 else text[:150] + "…" + text[-140:])
    return "", ""


def _tar(argv: list[str], what: str, hint: str) -> None:
    """Run tar; on failure, an EngineError that names tar's reason (its first complaint)."""
    res = proc.run(argv, check=False, what=what, timeout=3600)
    if res.returncode == 0:
        return
    reason, line = tar_reason(res.stderr)
    raise EngineError(
        f"{what} failed: {reason}" if reason else f"{what} failed (tar exit {res.returncode})",
        hint, argv=res.argv, returncode=res.returncode, stderr=line or res.stderr,
    )


def _names(source: Path, rb_id: str) -> tuple[Path, Path]:
    """(staging dir, aside path) for a restore of `source` in the same parent directory."""
    parent, base = source.parent, source.name
    return (parent / f".{base}.linpodx-restore-{rb_id}", parent / f".{base}.linpodx-before-{rb_id}")


def check_restorable(entry: Mapping[str, Any]) -> None:
    """Refuse (before anything changes) a restore that could not be swapped into place."""
    source = Path(str(entry["source"]))
    parent = source.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(
            f"cannot restore {entry['target']}: {parent} is not a writable directory",
            "the workspace is restored next to the mount source and swapped in by rename",
        )
    if source.exists() and os.path.ismount(source):
        raise InvalidInput(
            f"cannot restore {entry['target']}: {source} is a mount point",
            "mount sources that are mount points cannot be swapped by rename",
        )
    if source.exists():
        want_dir = entry["kind"] == DIR
        if source.is_symlink() or source.is_dir() != want_dir:
            raise InvalidInput(
                f"cannot restore {entry['target']}: {source} is no longer a "
                f"{'directory' if want_dir else 'regular file'}",
                "put the mount source back as it was, then roll back again",
            )


@dataclass
class Restore:
    """One mount's restore in progress: staging extracted, maybe swapped. Undoing it is
    `undo_interrupted`'s job, which goes by what is on disk, not by what this object saw (an
    interrupt can land between the two renames of `swap`)."""

    entry: Mapping[str, Any]
    rb_id: str

    @property
    def source(self) -> Path:
        return Path(str(self.entry["source"]))

    @property
    def staging(self) -> Path:
        return _names(self.source, self.rb_id)[0]

    @property
    def aside(self) -> Path:
        return _names(self.source, self.rb_id)[1]

    @property
    def restored(self) -> Path:
        """What `swap` puts in the source's place: the extracted directory or file, inside the
        staging directory."""
        return self.staging / (_TREE if self.entry["kind"] == DIR else self.source.name)

    def extract(self, archive_path: Path) -> None:
        """Extract the archive into the staging directory (the live source is untouched)."""
        # The staging dir stays 0700 until the swap, and tar extracts below it: tar gives the
        # directory it extracts into the archive's mode for `.` (0755, say) as it finishes,
        # and until the clean-up below has run, any host user who could reach a setuid-root
        # member could run it.
        self.staging.mkdir(mode=0o700)
        if self.entry["kind"] == DIR:
            self.restored.mkdir(mode=0o700)
        tar = proc.which("tar") or "tar"
        _tar([*_unshare_prefix(), tar, "--extract", "--file", str(archive_path),
              "--numeric-owner", "--same-permissions", "--same-owner", *_XATTR_ARGS,
              f"--xattrs-exclude={_FILE_CAPS}", "--directory",
              str(self.restored if self.entry["kind"] == DIR else self.staging)],
             f"restoring {self.entry['target']}", "check free disk space next to the mount "
             "source")
        # The content comes back, never privilege (docs/containers.md): a setuid or setgid
        # bit, a device node or a file capability in the archive (a host user's own, or an
        # archive edited in the state dir) would be one on the host, for any host user.
        find = proc.which("find") or "find"
        proc.run(
            [*_unshare_prefix(), find, str(self.staging), "(", "-type", "b", "-o", "-type",
             "c", ")", "-delete", "-o", "!", "-type", "l", "-perm", "/6000", "-exec", "chmod",
             "u-s,g-s", "--", "{}", "+"],
            what=f"restoring {self.entry['target']} (clearing setuid/setgid bits)",
            timeout=3600,
            hint="check the restored files next to the mount source",
        )

    def swap(self) -> None:
        """Move the live source aside and the restored content into its place."""
        had_original = os.path.lexists(self.source)
        if had_original:
            os.rename(self.source, self.aside)
        try:
            os.rename(self.restored, self.source)
        except OSError:
            if had_original:
                os.rename(self.aside, self.source)
            raise

    def cleanup(self) -> list[str]:
        """Remove the staging dir and the moved-aside original (after success); returns what
        could not be removed (each with the reason), never raises for it."""
        left = []
        for p in (self.staging, self.aside):
            try:
                remove_tree(p)
            except Exception as exc:  # committed: a leftover, not a crash
                left.append(f"{p} ({_say(exc)})")
        return left


def undo_interrupted(source: Path, rb_id: str, *, existed: bool, swap_started: bool) -> list[str]:
    """Put one mount source back as it was before a rollback that was killed part-way, from
    what is on disk: wherever the swap got to, the original ends at `source` and the restored
    and staging copies go. Safe to run again after it was itself interrupted; returns problems.

    `existed`: whether the source existed when the rollback began (from its journal);
    `swap_started`: whether the rollback may have reached its swap step.
    """
    staging, aside = _names(source, rb_id)
    # Where the restored copy goes on its way out (one rename, so the original never has to
    # wait for a tree removal to get its place back).
    undone = source.parent / f".{source.name}.linpodx-undone-{rb_id}"
    try:
        if os.path.lexists(aside):
            # The original was moved aside: whatever is at `source` now is the restored copy.
            if os.path.lexists(source):
                remove_tree(undone)
                os.rename(source, undone)
            os.rename(aside, source)
        elif swap_started and not existed and os.path.lexists(source):
            remove_tree(undone)
            os.rename(source, undone)  # there was nothing here: the restored copy goes
    except Exception as exc:  # any failure is a problem to name, not a crash
        return [f"could not move {aside} back to {source}: {_say(exc)}"]
    problems = []
    for p in (staging, undone):
        try:
            remove_tree(p)
        except Exception as exc:  # any failure is a problem to name, not a crash
            problems.append(f"could not remove {p}: {_say(exc)}")
    return problems


def _say(exc: BaseException) -> str:
    """A failure in a few words, for a list of problems."""
    if isinstance(exc, EngineError) and exc.stderr.strip():
        return f"{exc.message}: {exc.stderr.strip().splitlines()[-1]}"
    if isinstance(exc, LinpodxError):
        return exc.message
    if isinstance(exc, OSError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def finish_interrupted(source: Path, rb_id: str) -> list[str]:
    """Remove what a committed rollback that was killed before its clean-up left beside one
    mount source (the moved-aside original and the staging dir); returns problems."""
    problems = []
    for p in _names(source, rb_id):
        try:
            remove_tree(p)
        except Exception as exc:  # any failure is a problem to name, not a crash
            problems.append(f"could not remove {p}: {_say(exc)}")
    return problems


def remove_tree(path: Path) -> None:
    """Remove a file or tree we created (or an agent filled); rootless trees may hold sub-uid
    files.

    GNU `rm` walks the tree without recursion (fts), so a tree thousands of levels deep that an
    agent wrote into its workspace is removed like any other (Python's `shutil.rmtree`
    recurses and raises RecursionError there). `--one-file-system`: never into a mount point
    someone made inside it. A link is removed, never followed.
    """
    if not (path.exists() or path.is_symlink()):
        return
    argv = ["rm", "-rf", "--one-file-system", "--", str(path)]
    res = proc.run(argv, check=False, timeout=3600, what="removing " + str(path))
    if res.returncode == 0 and not os.path.lexists(path):
        return
    if os.geteuid() == 0:
        raise EngineError(
            f"removing {path} failed (exit {res.returncode})",
            argv=res.argv, returncode=res.returncode, stderr=res.stderr,
        )
    # Rootless: files owned by the container's sub-uids are removable only inside the user
    # namespace, where they keep their owners.
    engine.unshare(argv, timeout=3600, what="removing " + str(path))
