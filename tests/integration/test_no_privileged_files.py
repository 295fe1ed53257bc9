"""Nothing a container writes through a mount gives anyone on the host more rights than it had.

Every way the agent could plant a setuid/setgid file, a device node or a file capability in a
writable mount, tried for real with `linpodx run` (the fast `--rm` path and the full path with
`exec`), then checked from the host: mode, owner, xattrs, and (as root) a host user running
the file. Root and rootless (a setuid file of the person's own uid or of a sub-uid would hand
it to anyone on the host).
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DEBIAN_IMAGE, ROOTLESS, run_linpodx

pytestmark = pytest.mark.podman

# Each line: a name, then what the agent runs (in /ws, the writable mount). `tar -xp` of an
# archive holding a setuid bash (made on the host below, `setuid.tar`).
PLANT = r"""
cd /ws
try() { n=$1; shift; if "$@" 2>/ws/$n.err; then echo "$n: done"; else echo "$n: refused"; fi; }
try chmod_4755 sh -c 'cp /bin/bash chmod_4755 && chmod 4755 chmod_4755'
try chmod_gs sh -c 'cp /bin/bash chmod_gs && chmod g+s chmod_gs'
try install_6755 install -m 6755 /bin/bash install_6755
try tar_xp tar -xpf setuid.tar
try cp_a_su cp -a /usr/bin/su cp_a_su
try mv_su sh -c 'cp -a /usr/bin/chfn /tmp/chfn && mv /tmp/chfn mv_su'
try rename_over sh -c 'cp /bin/bash .tmp && chmod 4755 .tmp; mv -f .tmp rename_over'
try python_calls python3 /ws/calls.py
"""

# The system calls themselves, each on its own file; prints `NAME: errno` or `NAME: done`.
CALLS = r"""
import ctypes, os, shutil, stat, struct
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        fn()
        print(f"{name}: done")
    except OSError as e:
        print(f"{name}: {e.errno}")
def copy(name):
    shutil.copyfile("/bin/bash", name)
    return name
attempt("os_chmod", lambda: os.chmod(copy("os_chmod"), 0o4755))
attempt("os_fchmod", lambda: os.fchmod(os.open(copy("os_fchmod"), os.O_RDONLY), 0o2755))
attempt("fchmodat", lambda: os.chmod(copy("fchmodat"), 0o6755, dir_fd=os.open(".", os.O_RDONLY)))
attempt("open_creat", lambda: os.open("open_creat", os.O_CREAT | os.O_WRONLY, 0o4755))
attempt("o_tmpfile", lambda: os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o4755))
def creat():
    if libc.creat(b"creat", 0o4755) < 0:
        raise OSError(ctypes.get_errno(), "creat")
attempt("creat", creat)
attempt("mknod_reg", lambda: os.mknod("mknod_reg", stat.S_IFREG | 0o4755))
attempt("mknod_chr", lambda: os.mknod("mknod_chr", stat.S_IFCHR | 0o666, os.makedev(1, 3)))
attempt("mknod_blk", lambda: os.mknod("mknod_blk", stat.S_IFBLK | 0o666, os.makedev(8, 0)))
# A v2 file capability (cap_setuid permitted + effective) on a file of its own.
caps = struct.pack("<IIIII", 0x02000001, 1 << 7, 0, 0, 0)
attempt("setcap", lambda: os.setxattr(copy("setcap"), "security.capability", caps))
def raw(nr, *args):
    if libc.syscall(nr, *args) < 0:
        raise OSError(ctypes.get_errno(), str(nr))
attempt("fchmodat2", lambda: raw(452, ctypes.c_int(-100), copy("fchmodat2").encode(),
                                 ctypes.c_uint(0o4755), ctypes.c_uint(0)))
# openat2(AT_FDCWD, "openat2", {O_CREAT|O_WRONLY, 04755, 0}, 24): the mode is in a struct.
how = ctypes.create_string_buffer(struct.pack("<QQQ", os.O_CREAT | os.O_WRONLY, 0o4755, 0))
attempt("openat2", lambda: raw(437, ctypes.c_int(-100), b"openat2", how, ctypes.c_size_t(24)))
params = ctypes.create_string_buffer(120)
attempt("io_uring_setup", lambda: raw(425, ctypes.c_uint(4), params))
# What an agent needs keeps working.
attempt("chmod_plain", lambda: os.chmod(copy("chmod_plain"), 0o755))
attempt("open_plain", lambda: os.close(os.open("open_plain", os.O_CREAT | os.O_WRONLY, 0o644)))
attempt("sticky_dir", lambda: (os.mkdir("sticky_dir"), os.chmod("sticky_dir", 0o1777)))
"""

EPERM, ENOSYS = "1", "38"


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    """A writable mount source that host users can reach (for running what lands in it)."""
    top = Path(tempfile.mkdtemp(prefix="lpx-priv-", dir="/tmp"))
    top.chmod(0o755)
    ws = top / "ws"
    ws.mkdir()
    ws.chmod(0o777 if ROOTLESS else 0o755)
    info = tarfile.TarInfo("tar_xp")
    data = Path("/bin/bash").read_bytes()
    info.size, info.mode, info.uid, info.gid = len(data), 0o4755, 0, 0
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(data))
    (ws / "setuid.tar").write_bytes(buf.getvalue())
    (ws / "calls.py").write_text(CALLS)
    (ws / "rename_over").write_text("a host file the agent replaces\n")
    try:
        yield ws
    finally:
        if ROOTLESS:
            subprocess.run(["podman", "unshare", "rm", "-rf", str(top)], check=False)
        shutil.rmtree(top, ignore_errors=True)


def _apply(tmp_path: Path, ws: Path, name: str) -> str:
    profile = f"priv-{name[-12:]}"
    pfile = tmp_path / "p.yaml"
    pfile.write_text(
        f"name: {profile}\nmounts:\n  - source: {ws}\n    target: /ws\n    read_only: false\n"
    )
    res = run_linpodx("sandbox", "apply", "--profile", str(pfile), "--json")
    assert res.returncode == 0, res.stderr
    return profile


def _plan_inode(profile: str) -> int:
    """The inode of the profile's run plan: the full path rewrites it (a new inode), the fast
    path only reads it (tests/integration/test_run_once.py)."""
    from linpodx import containers
    from linpodx.fastpath import plan as runplan

    return os.stat(runplan.plan_file(containers.resolve_profile(profile).profile_id)).st_ino


def _results(out: str) -> dict[str, str]:
    got = {}
    for line in out.splitlines():
        name, sep, what = line.partition(": ")
        if sep and name.replace("_", "").isalnum():
            got[name] = what
    return got


def _check_host(ws: Path) -> None:
    """No file under `ws` is setuid/setgid, a device or carries a file capability; as root, a
    host user who runs one of the planted shells stays who they are."""
    for entry in ws.iterdir():
        st = entry.lstat()
        assert not stat.S_ISCHR(st.st_mode) and not stat.S_ISBLK(st.st_mode), entry
        assert st.st_mode & 0o6000 == 0, f"{entry}: mode {stat.filemode(st.st_mode)}"
        assert st.st_uid == os.getuid(), entry
        if stat.S_ISREG(st.st_mode):
            assert "security.capability" not in os.listxattr(entry), entry
    if ROOTLESS:
        return  # no other host user to run them as
    for name in ("chmod_4755", "chmod_gs", "install_6755", "tar_xp", "cp_a_su", "rename_over",
                 "os_chmod", "os_fchmod", "fchmodat", "fchmodat2"):
        f = ws / name
        if not f.exists():
            continue
        if f.read_bytes()[:4] != b"\x7fELF":
            continue
        f.chmod(f.stat().st_mode | 0o005)  # nobody may run it (the mode a planted file had)
        res = subprocess.run(["runuser", "-u", "nobody", "--", str(f), "-p", "-c", "id -u; id -g"],
                             capture_output=True, text=True, timeout=30)
        if name in ("cp_a_su",):
            continue  # su wants a password; its mode was checked above
        assert res.returncode == 0, (name, res.stderr)
        assert "0" not in res.stdout.split(), (name, res.stdout)


def _expect_refused(got: dict[str, str]) -> None:
    for name in ("chmod_4755", "chmod_gs", "install_6755", "tar_xp"):
        assert got.get(name) == "refused", (name, got)
    # Copies of the image's setuid-root su/chfn: root's cp keeps the owner and then may not
    # set the bits; the person's cp (rootless) cannot keep root as owner, so it drops the
    # bits itself (and the host check above saw none).
    for name in ("cp_a_su", "mv_su"):
        assert got.get(name) == ("done" if ROOTLESS else "refused"), (name, got)
    # The rename goes ahead, with a file whose chmod was refused (the host check looks at it).
    assert got.get("rename_over") == "done", got
    for name in ("os_chmod", "os_fchmod", "fchmodat", "fchmodat2", "open_creat", "o_tmpfile",
                 "creat", "mknod_reg", "mknod_chr", "mknod_blk", "setcap"):
        assert got.get(name) == EPERM, (name, got)
    for name in ("openat2", "io_uring_setup"):
        assert got.get(name) == ENOSYS, (name, got)
    for name in ("chmod_plain", "open_plain", "sticky_dir"):
        assert got.get(name) == "done", (name, got)


def test_nothing_planted_through_a_mount_is_privileged_on_the_host(
    tmp_path: Path, ws: Path, unique_name: str
) -> None:
    profile = _apply(tmp_path, ws, unique_name)
    inode = _plan_inode(profile)
    res = run_linpodx("run", "--rm", "--profile", profile, "--image", DEBIAN_IMAGE,
                      "--name", unique_name, "--", "sh", "-c", PLANT, timeout=180)
    assert res.returncode == 0, res.stderr
    assert _plan_inode(profile) == inode, "the full path ran instead of the fast one"
    got = _results(res.stdout)
    _check_host(ws)
    _expect_refused(got)
    assert "Operation not permitted" in (ws / "chmod_4755.err").read_text()
    # What a normal agent does still works: plain files, `tar -x` without -p, `cp -a`.
    assert (ws / "chmod_plain").stat().st_mode & 0o777 == 0o755
    assert (ws / "sticky_dir").stat().st_mode & 0o7777 == 0o1777


def test_a_detached_container_and_exec_get_the_same_profile(
    tmp_path: Path, ws: Path, unique_name: str
) -> None:
    profile = _apply(tmp_path, ws, unique_name)
    res = run_linpodx("run", "-d", "--profile", profile, "--image", DEBIAN_IMAGE,
                      "--name", unique_name, "--", "sleep", "600")
    assert res.returncode == 0, res.stderr
    try:
        res = run_linpodx("exec", unique_name, "--", "sh", "-c", PLANT, timeout=180)
        assert res.returncode == 0, res.stderr
        _expect_refused(_results(res.stdout))
        # Still so after a stop and a start (podman keeps the profile in the container).
        assert run_linpodx("stop", unique_name).returncode == 0
        assert run_linpodx("start", unique_name).returncode == 0
        again = run_linpodx("exec", unique_name, "--", "sh", "-c",
                            "cd /ws && cp /bin/bash again && chmod u+s again")
        assert again.returncode != 0 and "Operation not permitted" in again.stderr
        ok = run_linpodx("exec", unique_name, "--", "sh", "-c",
                         "cd /ws && mkdir -p t/d && echo x > t/d/f && tar -cf t.tar t && "
                         "rm -r t && tar -xf t.tar && cp -a t t2 && cat t2/d/f")
        assert ok.returncode == 0 and ok.stdout == "x\n", ok.stderr
    finally:
        run_linpodx("rm", "--force", unique_name)
    _check_host(ws)
