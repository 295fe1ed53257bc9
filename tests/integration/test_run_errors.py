"""Error cases of `linpodx run` on real podman: podman's own words, a hint, nothing left over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from linpodx import containers
from linpodx.errors import EXIT_CONFLICT, EngineError
from linpodx.profile.model import Profile
from tests.conftest import BUSYBOX_IMAGE, run_linpodx

pytestmark = pytest.mark.podman


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, f"podman {args}: {res.stderr}"
    return res


def exists(name: str) -> bool:
    return podman("container", "exists", name, check=False).returncode == 0


@pytest.fixture
def other_name() -> Iterator[str]:
    name = f"lpx-test-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)


def test_missing_image(unique_name: str) -> None:
    res = run_linpodx(
        "run", "--image", "localhost/linpodx-test/no-such-image:0", "--name", unique_name
    )
    assert res.returncode == 5
    assert "image not known" in res.stderr  # podman's own words
    assert "hint:" in res.stderr and "podman images" in res.stderr
    assert "Traceback" not in res.stderr
    assert not exists(unique_name)
    assert not containers.spec_dir(unique_name).exists()


def test_name_taken_by_linpodx_container(unique_name: str) -> None:
    res = run_linpodx(
        "run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600"
    )
    assert res.returncode == 0, res.stderr
    spec_before = containers.spec_path(unique_name).read_bytes()
    res = run_linpodx("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "true")
    assert res.returncode == EXIT_CONFLICT
    assert "already in use" in res.stderr
    assert "choose another --name" in res.stderr
    # The first container is untouched, and so is its spec.
    assert podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip() == "running"
    assert containers.spec_path(unique_name).read_bytes() == spec_before


def test_name_taken_by_someone_elses_container(other_name: str) -> None:
    podman("run", "-d", "--name", other_name, "--network", "none", BUSYBOX_IMAGE, "sleep", "600")
    res = run_linpodx("run", "--image", BUSYBOX_IMAGE, "--name", other_name, "-d", "--", "true")
    assert res.returncode == EXIT_CONFLICT and "already in use" in res.stderr
    assert podman("inspect", "-f", "{{.State.Status}}", other_name).stdout.strip() == "running"
    assert not containers.spec_dir(other_name).exists()


def test_podman_missing(tmp_path: Path, unique_name: str) -> None:
    empty = tmp_path / "emptybin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    res = subprocess.run(
        [sys.executable, "-m", "linpodx", "run", "--image", BUSYBOX_IMAGE, "--name", unique_name],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 5
    assert "error: podman not found" in res.stderr
    assert "hint: install podman" in res.stderr
    assert not exists(unique_name)


@pytest.mark.parametrize("detach", [True, False])
def test_start_failure_leaves_nothing(unique_name: str, detach: bool) -> None:
    # podman refuses to start a container whose working directory does not exist: a failure
    # after `podman create` succeeded, which must remove the container and its spec again.
    profile = Profile(name="broken", workdir="/no/such/dir")
    ref = containers.ProfileRef(profile, "broken", "prof_TEST", 1, "ee" * 32)
    req = containers.RunRequest(image=BUSYBOX_IMAGE, name=unique_name, command=("true",))
    spec = containers.make_spec(req, ref)
    if detach:
        with pytest.raises(EngineError) as ei:
            containers.create_and_start(spec, ref, start=True)
        assert "/no/such/dir" in ei.value.stderr  # podman's own words
        assert ei.value.hint is not None and "removed again" in ei.value.hint
    else:
        containers.create_and_start(spec, ref, start=False)
        assert exists(unique_name)
        rc = containers.attached_start(unique_name, False, remove_on_failure=True)
        assert rc != 0
    assert not exists(unique_name)
    assert not containers.spec_dir(unique_name).exists()


def test_command_not_found_is_the_containers_exit_status(unique_name: str) -> None:
    # With --init the container does start (catatonit runs) and its command fails: that is the
    # container's own result, reported as its exit status, not a linpodx failure.
    res = run_linpodx(
        "run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "--", "/no/such/program"
    )
    assert res.returncode != 0
    assert "No such file or directory" in res.stderr


def test_bad_options_are_usage_errors(unique_name: str) -> None:
    res = run_linpodx("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-t", "--", "true")
    assert res.returncode == 3 and "--interactive" in res.stderr
    res = run_linpodx("run", "--image", "--privileged", "--name", unique_name)
    assert res.returncode == 3
    res = run_linpodx("run", "--image", BUSYBOX_IMAGE, "--json", "--", "true")
    assert res.returncode == 2
    assert json.loads(res.stdout)["ok"] is False
    assert not exists(unique_name)


@pytest.mark.parametrize("path", ["full", "fast"])
def test_a_mount_source_swapped_for_a_symlink_after_apply_is_refused(
    tmp_path: Path, unique_name: str, path: str
) -> None:
    """A mount source that was a plain directory when the profile was applied and is now a
    symlink to ~/.ssh (an agent with a writable mount can make one between two runs): every
    `linpodx run` checks the sources again, on both paths, before anything is recorded or
    started."""
    from linpodx.fastpath import plan as runplan

    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(exist_ok=True)
    (home / ".ssh" / "id_test").write_text("secret\n")
    project = tmp_path / "project"
    project.mkdir()
    prof = tmp_path / "swap.yml"
    prof.write_text(
        f"version: 1\nname: swap\nmounts:\n  - source: {project}\n    target: /workspace\n"
    )
    applied = run_linpodx("sandbox", "apply", "--profile", str(prof), "--json")
    assert applied.returncode == 0, applied.stderr
    if path == "full":
        os.unlink(runplan.plan_file(json.loads(applied.stdout)["result"]["profile_id"]))
    project.rmdir()
    project.symlink_to(home / ".ssh")
    admin = Path(os.environ["HOME"]) / ".local/state/linpodx/audit/admin.jsonl"
    runs_before = admin.read_text().count('"container.run"')
    res = run_linpodx(
        "run", "--rm", "--profile", "swap", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "cat", "/workspace/id_test",
    )  # fmt: skip
    assert res.returncode == 3, res.stdout + res.stderr
    assert "secret" not in res.stdout
    assert "error: profile swap: mount source" in res.stderr and "sensitive path" in res.stderr
    assert "hint:" in res.stderr and "Traceback" not in res.stderr
    assert not exists(unique_name)
    assert admin.read_text().count('"container.run"') == runs_before  # refused before recording


def test_start_refuses_a_mount_source_swapped_after_the_container_was_made(
    tmp_path: Path, unique_name: str
) -> None:
    """`podman start` mounts the sources again by path, so `linpodx start` checks them again."""
    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(exist_ok=True)
    project = tmp_path / "project"
    project.mkdir()
    prof = tmp_path / "swap2.yml"
    prof.write_text(
        f"version: 1\nname: swap2\nmounts:\n  - source: {project}\n    target: /workspace\n"
    )
    assert run_linpodx("sandbox", "apply", "--profile", str(prof)).returncode == 0
    made = run_linpodx(
        "run", "-d", "--profile", "swap2", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "sleep", "600",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert run_linpodx("stop", unique_name).returncode == 0
    project.rmdir()
    project.symlink_to(home / ".ssh")
    res = run_linpodx("start", unique_name)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "sensitive path" in res.stderr and "hint:" in res.stderr
    state = podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip()
    assert state in ("exited", "stopped", "created")


def _admin_chain() -> list[dict[str, object]]:
    admin = Path(os.environ["HOME"]) / ".local/state/linpodx/audit/admin.jsonl"
    return [json.loads(line) for line in admin.read_text().splitlines()]


@pytest.mark.parametrize(
    ("case", "step", "container"),
    [
        ("missing-image", "podman_create", "not_created"),
        ("missing-image-one-call", "podman_run", "not_created"),
        ("missing-workdir", "podman_start", "removed"),
    ],
)
def test_a_run_that_fails_after_its_record_gets_a_failed_record(
    tmp_path: Path, unique_name: str, case: str, step: str, container: str
) -> None:
    """Real failures after the `container.run` record (podman refuses the image, or cannot
    start the command in a working directory that does not exist): the chain says how the run
    ended, and still verifies."""
    prof = tmp_path / "p.yml"
    workdir = "/no/such/dir" if case == "missing-workdir" else "/"
    prof.write_text(f"version: 1\nname: failing\nworkdir: {workdir}\n")
    assert run_linpodx("sandbox", "apply", "--profile", str(prof)).returncode == 0
    image = BUSYBOX_IMAGE if case == "missing-workdir" else "localhost/linpodx-test/no-such:0"
    how = ["--rm"] if case == "missing-image-one-call" else ["-d"]
    res = run_linpodx(
        "run", *how, "--profile", "failing", "--image", image, "--name", unique_name,
        "--", "true",
    )  # fmt: skip
    assert res.returncode == 5, res.stdout + res.stderr
    assert res.stderr.startswith("error: podman ") and "Traceback" not in res.stderr
    assert not exists(unique_name)
    run, failed = _admin_chain()[-2:]
    assert run["type"] == "container.run" and failed["type"] == "container.run.failed"
    data = failed["data"]
    assert isinstance(data, dict)
    assert data["name"] == unique_name and data["step"] == step
    assert data["container"] == container and data["error"] == "EngineError"
    assert str(data["reason"]).startswith("podman ")
    verified = run_linpodx("audit", "verify")
    assert verified.returncode == 0 and "chain:   OK" in verified.stdout, verified.stdout
    shown = run_linpodx("audit", "show", "--limit", "1")
    assert "container.run.failed" in shown.stdout and f'"step":"{step}"' in shown.stdout


def test_a_state_dir_failure_after_podman_create_removes_the_container(unique_name: str) -> None:
    """An OSError (not one of linpodx's own errors) after `podman create`: here the run spec
    cannot be written, because a directory sits where it belongs. The run fails with `error:`
    and `hint:`, and the created container is removed again, never left behind."""
    containers.spec_path(unique_name).mkdir(parents=True)
    res = run_linpodx(
        "run", "-d", "--image", BUSYBOX_IMAGE, "--name", unique_name, "--", "sleep", "600"
    )  # fmt: skip
    assert res.returncode == 6, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert "error: cannot use linpodx's state dir: Is a directory" in res.stderr
    assert "hint:" in res.stderr
    assert f"note: the container {unique_name} was removed again" in res.stderr
    assert not exists(unique_name)
    failed = _admin_chain()[-1]
    assert failed["type"] == "container.run.failed"
    assert failed["data"] == {
        "name": unique_name,
        "step": "run_spec",
        "error": "IsADirectoryError",
        "reason": "Is a directory",  # an OSError says its C library text, nothing more
        "container": "removed",
    }


def test_what_a_killed_rm_leaves_is_taken_over_by_run_and_removed_by_rm(unique_name: str) -> None:
    """`linpodx rm -f NAME` killed after `podman rm`, before it removed its state dir (as
    `podman rm` itself does it here): no container, a state dir. `ps --all` has nothing to
    list, `run --name NAME` takes the name, and the next `rm` removes the state and says the
    container was already gone."""
    argv = ("run", "-d", "--image", BUSYBOX_IMAGE, "--name", unique_name, "--", "sleep", "600")
    assert run_linpodx(*argv).returncode == 0
    podman("rm", "-f", "-t", "0", unique_name)
    assert containers.spec_dir(unique_name).exists()
    ps = run_linpodx("ps", "--all")
    assert ps.returncode == 0 and unique_name not in ps.stdout
    again = run_linpodx(*argv)
    assert again.returncode == 0, again.stderr
    cid = again.stdout.strip()  # `run -d` prints the bare id
    assert json.loads(containers.spec_path(unique_name).read_text())["container_id"] == cid
    podman("rm", "-f", "-t", "0", unique_name)
    res = run_linpodx("rm", unique_name)
    assert res.returncode == 0, res.stderr
    assert "present: false" in res.stdout and "already gone" in res.stderr
    assert "Traceback" not in res.stderr
    assert not containers.spec_dir(unique_name).exists()
    res = run_linpodx("rm", unique_name)
    assert res.returncode == 4 and "container not found" in res.stderr and "hint:" in res.stderr
