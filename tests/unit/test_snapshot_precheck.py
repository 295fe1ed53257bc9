"""`snapshot.precheck` (what `snapshot create` checks before committing) and tar's reason in
workspace errors, on real files and real GNU tar (no podman)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from linpodx.errors import EngineError, InvalidInput
from linpodx.snapshot import precheck, workspace


def deep_chain(root: Path, levels: int = 70, width: int = 60) -> None:
    """`levels` directories of `width`-character names under `root` (deeper than PATH_MAX
    from `root`), by descriptors, and a file at the bottom."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(levels):
            name = f"{i:02d}" + "d" * (width - 2)
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def test_walk_finds_a_path_beyond_path_max_and_stops_there(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    deep_chain(root)
    tree = precheck.walk(str(root))
    assert len(tree.problems) == 1 and "4149 bytes long, beyond PATH_MAX" in tree.problems[0]
    assert "File name too long" in tree.problems[0]
    # `.` and 67 levels fit (1 + 67 * 61 = 4088 bytes); the 68th is named, not entered.
    assert tree.entries == 1 + 68


def test_walk_accepts_any_bytes_in_names_fifos_and_hard_links(tmp_path: Path) -> None:
    """GNU tar round-trips these (checked on this host); they are no reason to refuse."""
    (tmp_path / os.fsdecode(b"bad\xff\xfe\nname")).write_text("x")
    os.mkfifo(tmp_path / "fifo")
    os.link(tmp_path / os.fsdecode(b"bad\xff\xfe\nname"), tmp_path / "hard")
    assert precheck.walk(str(tmp_path)).problems == ()


def test_walk_refuses_sockets(tmp_path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(tmp_path / "a.sock"))
        tree = precheck.walk(str(tmp_path))
    finally:
        s.close()
    assert tree.problems == ("./a.sock is a socket: tar leaves sockets out, so it would not "
                             "come back",)


def test_walk_counts_sparse_files_by_their_data_and_headers_per_entry(tmp_path: Path) -> None:
    tmp_path = tmp_path / "ws"
    tmp_path.mkdir()
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)
        f.write(b"data")
    for i in range(1000):
        (tmp_path / f"e{i}").touch()
    tree = precheck.walk(str(tmp_path))
    assert tree.entries == 1002
    assert tree.data_bytes < 1 << 20  # the hole is not counted
    assert tree.archive_bytes >= 1002 * precheck.TAR_ENTRY_BYTES
    # The estimate is an upper bound of what tar --sparse really writes, and not far off.
    out = tmp_path.parent / "real.tar"
    subprocess.run(["tar", "--create", "--file", str(out), "--numeric-owner", "--acls",
                    "--xattrs", "--xattrs-include=*", "--sparse", "--directory",
                    str(tmp_path), "--", "."], check=True)
    real = out.stat().st_size
    assert real <= tree.archive_bytes <= 2 * real + (64 << 10), (real, tree.archive_bytes)


def test_size_over_the_bound_is_refused_with_the_figures(tmp_path: Path) -> None:
    tree = precheck.Tree(entries=10, data_bytes=0, problems=())
    with pytest.raises(InvalidInput) as err:
        precheck.check_size("agent-1", changes=1 << 30, trees=[("/ws", tree)], bound=512 << 20,
                            bound_text="512m", archive_dir=str(tmp_path),
                            storage_dir=str(tmp_path))
    assert "above the profile's resources.snapshot_max_size 512m" in err.value.message
    assert "1.0 GiB (apparent size" in err.value.message
    with pytest.raises(InvalidInput) as err:
        free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
        precheck.check_size("agent-1", changes=free, trees=[("/ws", tree)], bound=1 << 60,
                            bound_text="1048576g", archive_dir=str(tmp_path),
                            storage_dir=str(tmp_path))
    assert "free" in err.value.message and "free disk space" in (err.value.hint or "")


def test_rootfs_with_home_replaced_by_a_symlink(tmp_path: Path) -> None:
    tmp_path = tmp_path / "rootfs"
    tmp_path.mkdir()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "agent").symlink_to("/tmp")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "resolv.conf").write_text("")
    (tmp_path / "ws").write_text("")  # a directory mount's target that is a file is fine...
    got = precheck.rootfs_problems(str(tmp_path), "/home/agent",
                                   ["/etc/resolv.conf", "/home/agent/work", "/etc/resolv.conf/x"])
    assert got[0].startswith("/home/agent is a symlink (to /tmp)")
    assert got[1].startswith("/home/agent is a symlink")
    assert got[2].startswith("/etc/resolv.conf is not a directory")
    assert len(got) == 3
    assert precheck.rootfs_problems(str(tmp_path), "/root", ["/new/dir"]) == []


def test_extract_failure_names_tars_reason_not_its_last_line(tmp_path: Path) -> None:
    """What the rollback said was `tar: Exiting with failure status due to previous errors`."""
    src = tmp_path / "src"
    src.mkdir()
    deep_chain(src)
    arch = tmp_path / "a.tar"
    subprocess.run(["tar", "--create", "--file", str(arch), "--acls", "--xattrs",
                    "--xattrs-include=*", "--directory", str(src), "--", "."], check=True)
    live = tmp_path / "live"
    live.mkdir()
    r = workspace.Restore({"source": str(live), "target": "/ws", "kind": "dir"}, "RB1")
    with pytest.raises(EngineError) as err:
        r.extract(arch)
    assert err.value.message == "restoring /ws failed: File name too long"
    assert "Exiting with failure status" not in err.value.stderr
    assert err.value.stderr.startswith("tar: ")
    workspace.remove_tree(r.staging)
