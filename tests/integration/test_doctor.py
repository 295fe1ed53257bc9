"""`linpodx doctor` on the real host: every check reports, failures say how to fix them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOTLESS, run_linpodx

pytestmark = pytest.mark.podman


def checks(doc: dict[str, object]) -> dict[str, dict[str, str]]:
    result = doc["result"]
    assert isinstance(result, dict)
    return {c["name"]: c for c in result["checks"]}


def test_doctor_on_the_test_host() -> None:
    res = run_linpodx("doctor", "--json", timeout=300)
    doc = json.loads(res.stdout)
    by = checks(doc)
    bad = {n: c for n, c in by.items() if c["status"] == "fail"}
    assert res.returncode == 0, bad
    assert by["podman"]["status"] == "ok"
    assert re.match(r"\d+\.\d+\.\d+ at /", by["podman"]["detail"]), by["podman"]
    assert by["container"]["status"] == "ok", by["container"]
    assert by["runtime"]["status"] == "ok" and "runc" in by["runtime"]["detail"]
    assert by["mode"]["detail"].startswith("rootless" if ROOTLESS else "root")
    # scripts/setup-host.sh installs iptables: rootful podman's default network works here.
    assert by["network"]["status"] == "ok", by["network"]
    if ROOTLESS:
        assert by["subuid"]["status"] == "ok" and by["subgid"]["status"] == "ok"
        # cgroup v1 rootless: limits cannot apply, and doctor says so.
        cg = by["cgroups"]
        if "v1" in cg["detail"]:
            assert cg["status"] == "warn" and "RLIMIT_NPROC" in cg["detail"]
    # What stops privileged files, tried with a real container.
    priv = by["privileged files"]
    assert priv["status"] == "ok", priv
    assert priv["detail"].startswith("seccomp: ") and "chmod 4755 was refused" in priv["detail"]
    if ROOTLESS and "v1" in by["cgroups"]["detail"]:
        assert "resources.enforcement: best_effort" in by["cgroups"]["detail"]
    for name in ("ulimits", "tun", "nft", "slirp4netns", "pasta", "state dir"):
        assert by[name]["status"] in ("ok", "warn"), by[name]
    # The human form has one line per check and a summary.
    text = run_linpodx("doctor", timeout=300).stdout.splitlines()
    assert text[-1].startswith("summary: ")
    assert any(line.startswith("[ok]   podman: ") for line in text)


def test_doctor_without_podman_fails_with_a_fix(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    res = subprocess.run(
        [sys.executable, "-m", "linpodx", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": str(empty)},
    )
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    i = lines.index("[fail] podman: not found")
    assert lines[i + 1].strip().startswith("fix: install podman")


def test_doctor_reports_unwritable_state_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env = {**os.environ, "LINPODX_STATE_DIR": str(blocker / "state")}
    res = subprocess.run(
        [sys.executable, "-m", "linpodx", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 1
    by = checks(json.loads(res.stdout))
    assert by["state dir"]["status"] == "fail"
    assert by["state dir"]["fix"]


def test_doctor_lists_the_bounds_in_force() -> None:
    """The bounds an agent meets on this host, with their defaults, and whether a running
    container's snapshot can be frozen here (rootless on cgroup v1: no)."""
    from linpodx.snapshot.freeze import can_freeze

    by = checks(json.loads(run_linpodx("doctor", "--json", timeout=300).stdout))
    assert "64m per container by default (resources.log_max_size" in \
        by["bound: container log"]["detail"]
    size = by["bound: snapshot size"]["detail"]
    assert size.startswith("16g by default (resources.snapshot_max_size") and " free in the " \
        "state dir" in size and "free in the podman storage" in size
    fz = by["bound: snapshot freeze"]
    assert fz["status"] == ("ok" if can_freeze() else "warn"), fz
    if not can_freeze():
        assert "--consistency stop" in fz["detail"]
    assert "kept for the records of stop and rm" in by["bound: full state dir"]["detail"]
    helper = by["bound: network helper"]
    assert helper["status"] == "ok", helper  # applied to a child here, as to the helper
    assert helper["detail"].startswith("4096 file descriptors and 1024 MiB of address space")
    assert "512 open and 100 new per second" in by["bound: egress connections"]["detail"]
