"""Foreground `--rm` runs without a TTY, which take one `podman run` (containers.one_call).

What these pin on real podman: the id line comes before any of the container's output, stdout
and stderr pass through whole and in order, the exit status is the container's, stdin reaches it
with -i, nothing is left behind, and the error cases keep podman's words, a hint, and leave a
container that owns the name (and its run spec) alone. Each on both paths: the full one (the
built-in profile) and the fast one (linpodx/fastpath/run.py: an applied profile with a stored plan).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from linpodx import containers
from linpodx.errors import EXIT_CONFLICT
from linpodx.fastpath import plan as runplan
from linpodx.paths import audit_dir
from tests.conftest import BUSYBOX_IMAGE, run_linpodx

pytestmark = pytest.mark.podman


@pytest.fixture(params=["full", "fast"])
def via(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    """Options that send a run down one path; afterwards, checks it took that path.

    The full path ends by rewriting the revision's plan file (a new inode); the fast path only
    reads it. So an unchanged inode after the run means the fast path ran it.
    """
    if request.param == "full":
        yield []
        return
    prof = tmp_path / "fastp.yml"
    prof.write_text("version: 1\nname: fastp\ndescription: fast path\n")
    res = run_linpodx("sandbox", "apply", "--profile", str(prof), "--json")
    assert res.returncode == 0, res.stderr
    plan = runplan.plan_file(json.loads(res.stdout)["result"]["profile_id"])
    inode = os.stat(plan).st_ino
    yield ["--profile", "fastp"]
    assert os.stat(plan).st_ino == inode, "the full path ran instead of the fast one"


def exists(name: str) -> bool:
    res = subprocess.run(["podman", "container", "exists", name], capture_output=True, timeout=60)
    return res.returncode == 0


def test_id_first_then_output_and_the_containers_exit_status(
    unique_name: str, via: list[str]
) -> None:
    res = run_linpodx(
        "run", "--rm", *via, "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "sh", "-c", "echo out-1; echo err-1 >&2; echo out-2; exit 3",
    )  # fmt: skip
    assert res.returncode == 3, res.stderr
    # stdout is the container's own output; linpodx's status lines go to stderr, first.
    assert res.stdout.splitlines() == ["out-1", "out-2"]
    # (Rootless on cgroup v1, a note about the default limits comes first.)
    lines = [x for x in res.stderr.splitlines() if not x.startswith("note: ")]
    assert lines[0].startswith("container_id: ") and len(lines[0].split()[1]) == 64
    assert lines[1].split() == ["name:", unique_name]
    assert lines[2].split() == ["state:", "running"]
    assert "err-1" in lines[3:]
    # Gone afterwards, with its spec (and the id file), but audited before it ran.
    assert not exists(unique_name)
    assert not containers.spec_dir(unique_name).exists()
    records = [json.loads(x) for x in (audit_dir() / "admin.jsonl").read_text().splitlines()]
    runs = [r for r in records if r["type"] == "container.run"]
    assert runs and runs[-1]["data"]["name"] == unique_name and runs[-1]["data"]["rm"] is True


def test_large_output_passes_through_whole(unique_name: str, via: list[str]) -> None:
    # More than a pipe buffer on both streams at once: nothing lost, nothing reordered per stream.
    script = "i=0; while [ $i -lt 20000 ]; do echo line-$i; echo err-$i >&2; i=$((i+1)); done"
    res = run_linpodx(
        "run", "--rm", *via, "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "sh", "-c", script,
        timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == [f"line-{i}" for i in range(20000)]
    errs = [x for x in res.stderr.splitlines() if x.startswith("err-")]
    assert errs == [f"err-{i}" for i in range(20000)]


def test_stdin_reaches_the_container_with_interactive(unique_name: str, via: list[str]) -> None:
    res = run_linpodx(
        "run", "--rm", "-i", *via, "--name", unique_name, "--image", BUSYBOX_IMAGE, "--", "cat",
        input="from the host\n",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["from the host"]


def test_missing_image_says_so_and_leaves_nothing(unique_name: str, via: list[str]) -> None:
    res = run_linpodx(
        "run", "--rm", *via, "--name", unique_name,
        "--image", "localhost/linpodx-test/no-such-image:0", "--", "true",
    )  # fmt: skip
    assert res.returncode == 5
    assert res.stdout == ""
    assert "container_id" not in res.stderr  # no id was announced: there was no container
    assert "error: podman run failed" in res.stderr
    assert "image not known" in res.stderr  # podman's own words
    assert "hint:" in res.stderr and "podman images" in res.stderr
    assert "Traceback" not in res.stderr
    assert not exists(unique_name)
    assert not containers.spec_dir(unique_name).exists()


def test_name_taken_leaves_the_other_container_and_its_spec_alone(
    unique_name: str, via: list[str]
) -> None:
    res = run_linpodx(
        "run", "-d", "--name", unique_name, "--image", BUSYBOX_IMAGE, "--", "sleep", "600"
    )
    assert res.returncode == 0, res.stderr
    spec_dir = containers.spec_dir(unique_name)
    before = sorted(p.name for p in spec_dir.iterdir())
    spec_before = containers.spec_path(unique_name).read_bytes()
    res = run_linpodx(
        "run", "--rm", *via, "--name", unique_name, "--image", BUSYBOX_IMAGE, "--", "true"
    )
    assert res.returncode == EXIT_CONFLICT
    assert "already in use" in res.stderr and "choose another --name" in res.stderr
    state = subprocess.run(
        ["podman", "inspect", "-f", "{{.State.Status}}", unique_name],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert state.stdout.strip() == "running"
    assert sorted(p.name for p in spec_dir.iterdir()) == before  # no id file left in it
    assert containers.spec_path(unique_name).read_bytes() == spec_before
