"""`linpodx run --profile NAME` with a YAML profile applied through the real CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import BUSYBOX_IMAGE, run_linpodx

pytestmark = pytest.mark.podman


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, f"podman {args}: {res.stderr}"
    return res


def apply(tmp_path: Path, text: str) -> dict[str, object]:
    f = tmp_path / "profile.yml"
    f.write_text(text)
    res = run_linpodx("sandbox", "apply", "--profile", str(f), "--json")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)["result"]
    assert isinstance(result, dict)
    return result


def test_run_under_an_applied_profile(tmp_path: Path, unique_name: str) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    (src / "README").write_text("project\n")
    applied = apply(
        tmp_path,
        f"""version: 1
name: agent-test
mounts:
  - source: {src}
    target: /workspace
  - source: {out}
    target: /out
    read_only: false
resources:
  memory: 256m
  cpus: 1
  pids_limit: 128
  nofile: 512
  nproc: 256
  # Not a test of cgroup limits (tests/integration/test_limits.py is): rootless on cgroup v1
  # they cannot apply, and a required limit would refuse the run.
  enforcement: best_effort
env:
  LANG: C.UTF-8
workdir: /workspace
""",
    )
    res = run_linpodx(
        "run", "--profile", "agent-test", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d",
        "--", "sleep", "600",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert re.search(r"^state: +running$", res.stderr, re.M)
    labels = json.loads(podman("inspect", "-f", "{{json .Config.Labels}}", unique_name).stdout)
    assert labels["linpodx.profile"] == "agent-test"
    assert labels["linpodx.profile_id"] == applied["profile_id"]
    assert labels["linpodx.revision"] == str(applied["revision"])
    assert labels["linpodx.audit_hash"] == applied["audit_hash"]

    def sh(script: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", unique_name, "sh", "-c", script, check=False)

    assert sh("pwd; cat README").stdout == "/workspace\nproject\n"
    assert sh("echo x > /workspace/new").returncode != 0
    assert sh("echo agent > /out/file").returncode == 0
    assert (out / "file").stat().st_uid == os.getuid()
    assert sh("echo $LANG").stdout == "C.UTF-8\n"
    limits = sh("cat /proc/self/limits").stdout
    assert re.search(r"^Max open files\s+512\s+512", limits, re.M)
    assert re.search(r"^Max processes\s+256\s+256", limits, re.M)
    # The run spec records the exact revision, so start/rollback use it.
    res = run_linpodx("ps", "--json")
    rows = json.loads(res.stdout)["result"]["containers"]
    row = next(r for r in rows if r["name"] == unique_name)
    assert (row["profile"], row["revision"]) == ("agent-test", applied["revision"])


def test_unknown_profile_is_not_found(unique_name: str) -> None:
    res = run_linpodx(
        "run", "--profile", "nothere", "--image", BUSYBOX_IMAGE, "--name", unique_name
    )
    assert res.returncode == 4
    assert res.stderr.startswith("error: profile not found: nothere")
    assert "linpodx sandbox apply" in res.stderr
    assert podman("container", "exists", unique_name, check=False).returncode == 1
