"""Limits a profile sets hold, or the run is refused (real podman, root and rootless).

Rootless podman on cgroup v1 (this kind of host) applies no cgroup limit at all: a profile that
sets memory, cpus or pids_limit is refused there unless it says `enforcement: best_effort`, and
then the run goes ahead with what does apply (RLIMITs) and its audit record names the rest.
As root the same limits are applied by the cgroups.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from linpodx.podman import probe
from tests.conftest import BUSYBOX_IMAGE, run_linpodx

pytestmark = pytest.mark.podman

CAN_APPLY = probe.host_facts()[3]


def _profile(tmp_path: Path, name: str, enforcement: str | None) -> Path:
    extra = f"  enforcement: {enforcement}\n" if enforcement else ""
    f = tmp_path / f"{name}.yml"
    f.write_text(
        f"name: {name}\nresources:\n  memory: 64m\n  pids_limit: 64\n  nproc: 100\n{extra}"
    )
    return f


def _admin_types() -> list[tuple[str, dict[str, object]]]:
    from linpodx.audit.chain import admin_chain, read_records

    return [(r.type, r.data) for r in read_records(admin_chain().path)]


def test_limits_the_host_cannot_apply_refuse_the_run(tmp_path: Path, unique_name: str) -> None:
    prof = _profile(tmp_path, "lim-req", None)
    validated = run_linpodx("sandbox", "validate", str(prof))
    assert validated.returncode == 0, validated.stderr
    assert run_linpodx("sandbox", "apply", "--profile", str(prof)).returncode == 0
    for argv in (["--rm"], ["-d"]):  # the fast path and the full path
        res = run_linpodx("run", *argv, "--profile", "lim-req", "--image", BUSYBOX_IMAGE,
                          "--name", unique_name, "--", "sh", "-c", "cat /proc/self/cgroup")
        if CAN_APPLY:
            assert res.returncode == 0, res.stderr
            if argv == ["-d"]:
                run_linpodx("rm", "--force", unique_name)
            continue
        assert res.returncode != 0, res.stdout
        lines = res.stderr.splitlines()
        assert lines[0].startswith("error: profile lim-req sets resources.memory, "
                                   "resources.pids_limit, which this host cannot enforce"), lines
        assert lines[1].startswith("hint: ") and "enforcement: best_effort" in lines[1]
        assert "Traceback" not in res.stderr and res.stdout == ""
        exists = subprocess.run(["podman", "container", "exists", unique_name], timeout=60)
        assert exists.returncode == 1
    if not CAN_APPLY:
        assert "required: memory, pids_limit cannot be enforced" in validated.stdout
        assert "container.run" not in [t for t, _ in _admin_types()]
    else:
        assert "limits:" not in validated.stdout


def test_best_effort_applies_what_it_can_and_records_the_rest(
    tmp_path: Path, unique_name: str
) -> None:
    prof = _profile(tmp_path, "lim-be", "best_effort")
    validated = run_linpodx("sandbox", "validate", str(prof), "--json")
    assert validated.returncode == 0, validated.stderr
    limits = json.loads(validated.stdout)["result"]["limits"]
    missing = [] if CAN_APPLY else ["memory", "pids_limit"]
    assert limits == {"enforcement": "best_effort", "not_enforceable_here": missing}
    if not CAN_APPLY:
        plain = run_linpodx("sandbox", "validate", str(prof)).stdout
        assert "best effort: memory, pids_limit cannot be enforced on this host" in plain
    assert run_linpodx("sandbox", "apply", "--profile", str(prof)).returncode == 0
    script = ("grep -E '^Max processes' /proc/self/limits; "
              "cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max 2>/dev/null; true")
    for argv in (["--rm"], ["-d"]):
        res = run_linpodx("run", *argv, "--profile", "lim-be", "--image", BUSYBOX_IMAGE,
                          "--name", f"{unique_name}{argv[0]}", "--", "sh", "-c", script)
        assert res.returncode == 0, res.stderr
        if argv == ["-d"]:
            logs = subprocess.run(["podman", "wait", f"{unique_name}-d"], timeout=60)
            assert logs.returncode == 0
            out = run_linpodx("logs", f"{unique_name}-d").stdout
            run_linpodx("rm", "--force", f"{unique_name}-d")
        else:
            out = res.stdout
        # What applies everywhere: RLIMIT_NPROC, as the profile says.
        assert re.search(r"^Max processes\s+100\s+100", out, re.M), out
        if CAN_APPLY:
            assert re.search(r"^64$", out, re.M), out  # the pids cgroup
        else:
            assert not re.search(r"^64$", out, re.M), out
        if not CAN_APPLY:
            assert "not applied" in res.stderr or argv == ["--rm"]
    runs = [d for t, d in _admin_types() if t == "container.run"]
    assert len(runs) == 2
    for data in runs:
        if CAN_APPLY:
            assert "limits_not_applied" not in data
        else:
            assert data["limits_not_applied"] == ["memory", "pids_limit"]
