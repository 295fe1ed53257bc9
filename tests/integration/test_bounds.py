"""Bounds on what an agent can drive through linpodx (issue 25), on real podman: the
container's log file and `linpodx logs`' memory, snapshot size, snapshots that could never be
restored, a full state dir, and a freeze that cannot be guaranteed."""

from __future__ import annotations

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
    size = log_path(unique_name).stat().st_size
    assert 0 < size <= MIB, f"log file is {size} bytes, the bound is {MIB}"
    assert podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip() == "running"


def test_logs_streams_a_huge_line_in_bounded_memory(unique_name: str, tmp_path: Path) -> None:
    """A 200 MB line (under a 1g log bound, so the file really holds it): `linpodx logs`
    passes it through without holding it whole; its own peak RSS stays under 100 MiB."""
    n = 200_000_000
    prof = apply_profile(tmp_path, f"logr-{unique_name[-6:]}", "resources:\n  log_max_size: 1g\n")
    script = f"head -c {n} /dev/zero | tr '\\0' y; echo; echo big-done; sleep 600"
    run_ok("run", "--profile", prof, "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d",
           "--", "sh", "-c", script)
    wait_for_log(unique_name, "big-done")
    # In a process of its own, which reports its own peak RSS (not podman's) on stderr.
    code = (
        "import resource, sys\n"
        "from linpodx.cli.main import main\n"
        f"rc = main(['logs', {unique_name!r}])\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write(f'MAXRSS_KB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n')\n"
        "sys.exit(rc)\n"
    )
    out = tmp_path / "logs.out"
    with open(out, "wb") as f:
        res = subprocess.run([sys.executable, "-c", code], stdout=f, stderr=subprocess.PIPE,
                             text=False, timeout=600)
    err = res.stderr.decode()
    assert res.returncode == 0, err
    rss_kb = int(err.rsplit("MAXRSS_KB ", 1)[1].split()[0])
    assert rss_kb < 100 * 1024, f"linpodx logs peaked at {rss_kb} kB RSS"
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
