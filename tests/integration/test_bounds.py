"""Bounds on what an agent can drive through linpodx (issue 25), on real podman: the
container's log file and `linpodx logs`' memory, snapshot size, snapshots that could never be
restored, a full state dir, and a freeze that cannot be guaranteed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from linpodx.snapshot import freeze, jobs
from linpodx.snapshot.names import snapshot_dir
from tests.conftest import BUSYBOX_IMAGE, run_linpodx
from tests.integration.test_snapshot import (  # noqa: F401 - the fixture applies here too
    HELD,
    Box,
    Cli,
    audit_types,
    cleanup,
    inspect,
    make_box,
    result,
    rootless_storage_conf,
)

pytestmark = pytest.mark.podman

MIB = 1 << 20


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}: {r.stderr.strip()}"
    return r


def run_ok(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    res = run_linpodx(*args, timeout=timeout)
    assert res.returncode == 0, f"linpodx {args}: {res.stderr}"
    return res


def apply_profile(tmp_path: Path, name: str, body: str = "") -> str:
    """Apply a profile named `name` with `body` appended (YAML) and return its name."""
    pfile = tmp_path / f"{name}.yaml"
    pfile.write_text(f"name: {name}\n{body}")
    run_ok("sandbox", "apply", "--profile", str(pfile))
    return name


def log_path(name: str) -> Path:
    return Path(podman("inspect", "--format", "{{.HostConfig.LogConfig.Path}}", name)
                .stdout.strip())


def wait_for_log(name: str, needle: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tail = podman("logs", "--tail", "2", name, check=False).stdout
        if needle in tail:
            return
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} never reached the log of {name}")


# ----------------------------------------------------------------------------------------------
# item 2: container logs


def test_log_file_is_bounded_by_the_profile(unique_name: str, tmp_path: Path) -> None:
    """40 MB on stdout (one line, then more lines) under `log_max_size: 1m`: the log file never
    holds more than 1 MiB, and the container goes on running and logging."""
    prof = apply_profile(tmp_path, f"logb-{unique_name[-6:]}", "resources:\n  log_max_size: 1m\n")
    script = ("head -c 40000000 /dev/zero | tr '\\0' x; echo; "
              "i=0; while [ $i -lt 20000 ]; do echo line-$i; i=$((i+1)); done; "
              "echo flood-done; sleep 600")
    run_ok("run", "--profile", prof, "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d",
           "--", "sh", "-c", script)
    assert podman("inspect", "--format", "{{.HostConfig.LogConfig.Type}}",
                  unique_name).stdout.strip() == "k8s-file"
    wait_for_log(unique_name, "flood-done")
    # (Rootless the file is the user namespace's: read its size there.)
    size = int(subprocess.run([*([] if os.geteuid() == 0 else ["podman", "unshare"]), "stat",
                               "-c", "%s", str(log_path(unique_name))], capture_output=True,
                              text=True, check=True, timeout=60).stdout)
    assert 0 < size <= MIB, f"log file is {size} bytes, the bound is {MIB}"
    assert podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip() == "running"


def test_logs_streams_a_huge_line_in_bounded_memory(unique_name: str, tmp_path: Path) -> None:
    """A 200 MB line (under a 1g log bound, so the file really holds it): `linpodx logs`
    passes it through without holding it whole.

    What linpodx itself holds is measured by tracemalloc (every Python allocation, peak):
    under 32 MiB, where the line held once is 190 MiB. Its peak RSS (which also counts the
    interpreter, the allocator's slack and the machine's mood: 49 MiB here, 108 MiB once in
    CI) must stay under the line's own size."""
    n = 200_000_000
    prof = apply_profile(tmp_path, f"logr-{unique_name[-6:]}", "resources:\n  log_max_size: 1g\n")
    script = f"head -c {n} /dev/zero | tr '\\0' y; echo; echo big-done"
    run_ok("run", "--profile", prof, "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d",
           "--", "sh", "-c", script)
    # Its end, not its log: conmon has written the whole log once the container has exited,
    # and a poll of `podman logs --tail` reads the whole 200 MB line back each time (on a
    # loaded machine that took more than 180 s in CI).
    waited = podman("wait", unique_name)
    assert waited.stdout.strip() == "0", waited
    # In a process of its own, which reports its own peaks (not podman's) on stderr.
    code = (
        "import resource, sys, tracemalloc\n"
        "from linpodx.cli.main import main\n"
        "tracemalloc.start()\n"
        f"rc = main(['logs', {unique_name!r}])\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write(f'TRACED_PEAK {tracemalloc.get_traced_memory()[1]}\\n')\n"
        "sys.stderr.write(f'MAXRSS_KB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
        "sys.exit(rc)\n"
    )
    out = tmp_path / "logs.out"
    with open(out, "wb") as f:
        res = subprocess.run([sys.executable, "-c", code], stdout=f, stderr=subprocess.PIPE,
                             text=False, timeout=600)
    err = res.stderr.decode()
    assert res.returncode == 0, err
    traced = int(err.rsplit("TRACED_PEAK ", 1)[1].split()[0])
    assert traced < 32 * 1024 * 1024, f"linpodx logs held {traced} bytes at its peak"
    rss_kb = int(err.rsplit("MAXRSS_KB ", 1)[1].split()[0])
    assert rss_kb * 1024 < n, f"linpodx logs peaked at {rss_kb} kB RSS"
    # The line came through whole: n characters, then the next line.
    size = out.stat().st_size
    assert size == n + 1 + len("big-done\n"), size
    with open(out, "rb") as f:
        f.seek(n - 4)
        assert f.read() == b"yyyy\nbig-done\n"
    os.unlink(out)


# ----------------------------------------------------------------------------------------------
# item 7: a freeze that cannot be guaranteed

# A workload that keeps writing to its workspace; held by signals only, it is the kind that
# gets away (a POSIX timer of its own that sends SIGCONT, a sibling that continues it).
WRITER_CMD = ("sh", "-c", "trap 'exit 0' TERM; (i=0; while :; do i=$((i+1)); "
              "echo $i > /ws/c.tmp; mv /ws/c.tmp /ws/counter; done) & while :; do sleep 1; done")


@pytest.fixture
def writer_box(cli: Cli, unique_name: str, tmp_path: Path) -> Iterator[Box]:
    try:
        yield make_box(cli, unique_name, tmp_path, command=WRITER_CMD)
    finally:
        cleanup(unique_name, tmp_path)


def test_snapshot_of_a_running_container_is_held_by_the_freezer_or_refused(
    writer_box: Box,
) -> None:
    """Where the cgroup freezer holds the container (root, or cgroup v2), it is used. Where it
    cannot (rootless on cgroup v1: signals only), `snapshot create` says so and refuses,
    before anything is recorded; `--consistency stop` stops the writer for the snapshot and
    starts the container again, and the job says so."""
    box = writer_box
    if freeze.can_freeze():
        snap = box.snapshot("fz")
        assert snap["freeze"] == freeze.PAUSE and snap["consistency"] == freeze.FREEZE
    else:
        r = box.cli("snapshot", "create", box.name, "--label", "fz", "--wait")
        assert r.exit_code != 0 and "Traceback" not in r.stderr
        assert "cannot snapshot" in r.stderr and "no cgroup freezer" in r.stderr
        assert "--consistency stop" in r.stderr and "--consistency best-effort" in r.stderr
        assert "snapshot.create" not in audit_types()
        assert not snapshot_dir(box.name, "fz").exists()
    before = audit_types()
    snap = result(box.cli("snapshot", "create", box.name, "--label", "st", "--consistency",
                          "stop", "--wait", "--json"))
    assert snap["status"] == jobs.SUCCEEDED, snap
    assert snap["freeze"] == freeze.STOPPED and snap["consistency"] == freeze.STOP
    after = audit_types()[len(before):]
    assert after[:3] == ["snapshot.create", "container.stop", "container.start"], after
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]
    # Started again: the writer writes again.
    first = box.sh("cat /ws/counter")
    time.sleep(0.5)
    assert box.sh("cat /ws/counter") != first


# ----------------------------------------------------------------------------------------------
# item 4: snapshot size


def snapshot_images(name: str) -> set[str]:
    """Ids of every image podman has (a refused snapshot must not add one)."""
    return set(podman("images", "-a", "-q", "--no-trunc").stdout.split())


def failed_job(box: Box, label: str) -> dict[str, object]:
    r = box.cli("snapshot", "create", *HELD, box.name, "--label", label, "--wait", "--json")
    assert r.exit_code != 0, r.stdout
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    job = doc["error"]["details"]["job"]
    assert job["status"] == jobs.FAILED and job["step"] == "check", job
    assert not snapshot_dir(box.name, label).exists()
    return job  # type: ignore[no-any-return]


@pytest.fixture
def small_box(cli: Cli, unique_name: str, tmp_path: Path) -> Iterator[Box]:
    try:
        yield make_box(cli, unique_name, tmp_path, resources="  snapshot_max_size: 256m\n")
    finally:
        cleanup(unique_name, tmp_path)


def test_sparse_container_file_is_counted_in_full_and_refused_before_commit(
    small_box: Box,
) -> None:
    """`truncate -s 1G` in the container's own filesystem: podman commit would write 1 GiB;
    under a 256m bound the job is refused at `check`, before anything is committed (no new
    image, the container running again). A sparse file in the workspace is archived sparse
    and fits."""
    box = small_box
    box.sh("truncate -s 1G /home/agent/big")
    images = snapshot_images(box.name)
    job = failed_job(box, "sparse")
    err = str(job["error"])
    assert "refused before anything was committed" in err and "snapshot_max_size 256m" in err
    assert "1.0 GiB" in err and "apparent size" in err
    assert snapshot_images(box.name) == images
    assert inspect(box.name)["State"]["Status"] == "running"  # type: ignore[index]
    # The same gigabyte as a hole in the workspace: tar --sparse stores only its data.
    box.sh("rm /home/agent/big; truncate -s 1G /ws/sparse; echo data >> /ws/sparse")
    snap = box.snapshot("ws-sparse")
    assert snap["status"] == jobs.SUCCEEDED
    archive = snapshot_dir(box.name, "ws-sparse") / "mount-0.tar"
    assert archive.stat().st_size < 4 * MIB, archive.stat().st_size


def test_workspace_of_many_empty_files_is_refused_over_the_bound(small_box: Box) -> None:
    """200,000 empty files cost ~300 MB of tar headers: above 256m, refused at `check` with
    the estimate and the number of entries."""
    box = small_box
    many = box.ws / "many"
    many.mkdir()
    for i in range(200_000):
        (many / f"f{i}").touch()
    job = failed_job(box, "many")
    err = str(job["error"])
    assert "snapshot_max_size 256m" in err and "200005 entries" in err, err


def test_default_bound_takes_an_npm_install_sized_workspace(
    cli: Cli, unique_name: str, tmp_path: Path
) -> None:
    """The defaults are generous: a node_modules-like workspace (20,000 files, 80 MB) and
    50 MB of container changes snapshot under the default profile bounds."""
    box = make_box(cli, unique_name, tmp_path)
    try:
        mods = box.ws / "node_modules"
        for i in range(200):
            d = mods / f"pkg{i}" / "lib"
            d.mkdir(parents=True)
            for j in range(100):
                (d / f"m{j}.js").write_bytes(b"x" * 4000)
        box.sh("head -c 50000000 /dev/urandom > /home/agent/blob")
        snap = box.snapshot("npm")
        assert snap["status"] == jobs.SUCCEEDED
    finally:
        cleanup(unique_name, tmp_path)


# ----------------------------------------------------------------------------------------------
# item 5: snapshots a rollback could not restore


def test_path_beyond_path_max_is_refused_at_creation(box5: Box) -> None:
    """70 levels of 60-character names (4,270 bytes) in the workspace: tar archives it, no
    rollback could extract it: refused at creation, naming PATH_MAX and tar's reason."""
    box = box5
    fd = os.open(box.ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(70):
            name = f"{i:02d}" + "d" * 58
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    err = str(failed_job(box, "deep")["error"])
    assert "a rollback could not restore it" in err and "PATH_MAX" in err, err
    assert "File name too long" in err


def test_socket_in_workspace_is_refused_at_creation(box5: Box) -> None:
    import socket

    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(box5.ws / "agent.sock"))
        err = str(failed_job(box5, "sock")["error"])
    finally:
        s.close()
    assert "./agent.sock is a socket" in err, err


def test_home_replaced_by_a_symlink_is_refused_at_creation(box5: Box) -> None:
    """`/home/agent` replaced by a symlink in the container's filesystem: every rollback
    would fail at create; the snapshot is refused when taken."""
    box5.sh("mv /home/agent /home/agent.old && ln -s /tmp /home/agent")
    err = str(failed_job(box5, "homelink")["error"])
    assert "/home/agent is a symlink" in err, err


@pytest.fixture
def box5(cli: Cli, unique_name: str, tmp_path: Path) -> Iterator[Box]:
    try:
        yield make_box(cli, unique_name, tmp_path)
    finally:
        cleanup(unique_name, tmp_path)


# ----------------------------------------------------------------------------------------------
# item 6: a full state dir


def fill(directory: Path) -> None:
    """Fill the filesystem of `directory` to the last byte."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (65536, 4096, 512, 64, 1):  # down to the last byte
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                continue
    finally:
        os.close(fd)
    assert os.statvfs(directory).f_bavail == 0


@pytest.fixture
def small_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 4 MiB tmpfs as the linpodx state dir (root only: mounting it needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem as the state dir needs root")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(state)],
                   check=True, timeout=30)
    monkeypatch.setenv("LINPODX_STATE_DIR", str(state))
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False, timeout=30)


def test_full_state_dir_lets_stop_and_rm_through_and_refuses_start(
    small_state: Path, unique_name: str
) -> None:
    """A state dir filled to the last byte (as a flooding session log would): `run`, `exec`
    and `start` stay refused; `stop` goes ahead, its record written in the reserve; filled
    again, `stop` and `rm -f` go ahead without a record and say so. Once space is back the
    chain verifies and holds the first stop."""
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600")
    assert (small_state / "audit" / ".reserve").stat().st_size > 0
    fill(small_state)
    other = run_linpodx("run", "--image", BUSYBOX_IMAGE, "--name", f"{unique_name}-2", "-d",
                        "--", "true")
    assert other.returncode != 0 and "No space left on device" in other.stderr, other.stderr
    assert podman("container", "exists", f"{unique_name}-2", check=False).returncode == 1
    fill(small_state)  # (the refused run put back what it had written)
    # The chain's last page may still take a few records: until it is full, exec records.
    for _ in range(40):
        ex = run_linpodx("exec", unique_name, "--", "true")
        if ex.returncode != 0:
            break
    assert ex.returncode == 6 and "No space left on device" in ex.stderr, ex.stderr

    stop = run_linpodx("stop", unique_name, "--time", "1")
    assert stop.returncode == 0, stop.stderr
    assert "is full: the container.stop record was written in the space" in stop.stderr
    assert podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip() == "exited"

    fill(small_state)  # the flood goes on and takes the reserve's space too
    for _ in range(40):
        again = run_linpodx("stop", unique_name, "--time", "1")
        assert again.returncode == 0, again.stderr
        if "could not be written" in again.stderr:
            break
    assert "the container.stop record could not be written" in again.stderr, again.stderr
    start = run_linpodx("start", unique_name)
    assert start.returncode == 6, start.stderr
    assert podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip() == "exited"
    rm = run_linpodx("rm", "-f", unique_name)
    assert rm.returncode == 0, rm.stderr
    assert "the container.rm record could not be written" in rm.stderr
    assert podman("container", "exists", unique_name, check=False).returncode == 1

    (small_state / "filler").unlink()
    verify = run_linpodx("audit", "verify")
    assert verify.returncode == 0, verify.stderr
    from linpodx.audit.chain import admin_chain, read_records

    types = [r.type for r in read_records(admin_chain().path)]
    assert "container.stop" in types and "container.rm" not in types, types
