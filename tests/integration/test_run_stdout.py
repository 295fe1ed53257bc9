"""stdout is data (issue 24): what `run` prints where, on real podman, root and rootless.

`id=$(linpodx run -d …)` gives the bare id, as `podman run -d` does; a foreground run's stdout
is the container's own output (linpodx's `container_id:`/`name:`/`state:` go to stderr);
`run -d --json` prints one envelope; `--json` without -d is refused before anything runs; and
`ps -q` prints the names linpodx's commands take.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from linpodx.errors import EXIT_USAGE
from tests.conftest import BUSYBOX_IMAGE, linpodx_argv, run_linpodx

pytestmark = pytest.mark.podman


def podman_id(name: str) -> str:
    res = subprocess.run(
        ["podman", "inspect", "--format", "{{.Id}}", name],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_id_from_a_detached_run_in_a_shell(unique_name: str) -> None:
    linpodx = shlex.join(linpodx_argv())
    script = (
        f"id=$({linpodx} run -d --name {unique_name} --image {BUSYBOX_IMAGE} -- sleep 600) "
        '&& printf "%s\\n" "$id"'
    )
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == podman_id(unique_name)
    assert re.fullmatch(r"[0-9a-f]{64}", res.stdout.strip())
    # The person still reads what started, on stderr.
    assert re.search(rf"^name: +{unique_name}$", res.stderr, re.M), res.stderr
    assert re.search(r"^state: +running$", res.stderr, re.M), res.stderr
    # `ps -q`: the names, which every linpodx command takes.
    ps = run_linpodx("ps", "-q")
    assert ps.returncode == 0, ps.stderr
    assert unique_name in ps.stdout.splitlines()
    doc = json.loads(run_linpodx("ps", "--format", "json").stdout)
    [row] = [r for r in doc["result"]["containers"] if r["name"] == unique_name]
    assert row["container_id"] == podman_id(unique_name) and isinstance(row["revision"], int)
    rm = run_linpodx("rm", "--force", unique_name)
    assert rm.returncode == 0, rm.stderr


def test_detached_json_is_one_envelope(unique_name: str) -> None:
    res = run_linpodx(
        "run", "-d", "--json", "--name", unique_name, "--image", BUSYBOX_IMAGE, "--", "sleep", "600"
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # the whole of stdout: one document
    assert doc["ok"] is True and doc["command"] == "run"
    result = doc["result"]
    assert result["container_id"] == podman_id(unique_name)
    assert (result["name"], result["state"]) == (unique_name, "running")
    assert isinstance(result["revision"], int)
    assert "container_id:" not in res.stderr


@pytest.mark.parametrize("rm", [True, False], ids=["rm", "kept"])
def test_foreground_stdout_is_only_the_containers(
    unique_name: str, tmp_path: Path, rm: bool
) -> None:
    """The issue's own command: `linpodx run --rm … -- sh -c 'echo hello' > out.txt`."""
    out = tmp_path / "out.txt"
    linpodx = shlex.join(linpodx_argv())
    flags = "--rm " if rm else ""
    script = (
        f"{linpodx} run {flags}--name {unique_name} --image {BUSYBOX_IMAGE} "
        f"-- sh -c 'echo hello; echo oops >&2' > {shlex.quote(str(out))}"
    )
    res = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert out.read_text() == "hello\n"
    # (Rootless on cgroup v1, a note about the default limits comes first.)
    lines = [x for x in res.stderr.splitlines() if not x.startswith("note: ")]
    assert lines[0].startswith("container_id: ") and len(lines[0].split()[1]) == 64, lines
    assert lines[1].split() == ["name:", unique_name]
    assert lines[2].split() == ["state:", "running"]
    assert "oops" in lines[3:]


def test_json_without_detach_is_refused_before_anything_runs(unique_name: str) -> None:
    res = run_linpodx(
        "run", "--rm", "--json", "--name", unique_name, "--image", BUSYBOX_IMAGE, "--", "true"
    )
    assert res.returncode == EXIT_USAGE
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["error"]["exit_code"] == EXIT_USAGE
    assert "--json needs --detach" in res.stderr
    assert "hint: use `linpodx run -d --json" in res.stderr
    exists = subprocess.run(["podman", "container", "exists", unique_name], timeout=60)
    assert exists.returncode == 1
