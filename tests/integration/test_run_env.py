"""`run -e`/`--env-file`/`--secret` and `--pull` on real podman.

The values reach the container and nothing else linpodx writes or prints: the state dir (run
spec, audit log, events, plans), `ps --json`, the run's own stdout and stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from linpodx import containers, paths
from tests.conftest import BUSYBOX_IMAGE, run_linpodx

pytestmark = pytest.mark.podman

E_VALUE = "lpx-e-" + uuid.uuid4().hex
FILE_VALUE = "lpx-file-" + uuid.uuid4().hex
HERE_VALUE = "lpx-here-" + uuid.uuid4().hex
SECRET_VALUE = "lpx-secret-" + uuid.uuid4().hex
VALUES = (E_VALUE, FILE_VALUE, HERE_VALUE, SECRET_VALUE)


@pytest.fixture
def secret_name() -> Iterator[str]:
    name = f"lpx-test-{uuid.uuid4().hex[:10]}"
    subprocess.run(
        ["podman", "secret", "create", name, "-"],
        input=SECRET_VALUE, text=True, capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    yield name
    subprocess.run(["podman", "secret", "rm", name], capture_output=True, timeout=60)


def files_holding(root: Path, values: tuple[str, ...]) -> list[str]:
    """Every file under `root` that holds one of `values`."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if any(v.encode() in data for v in values):
                found.append(str(path))
    return found


def test_a_container_gets_its_values_and_nothing_else_keeps_them(
    unique_name: str, secret_name: str, tmp_path: Path, isolated_state: Path
) -> None:
    env_file = tmp_path / "agent.env"
    env_file.write_text(f"# the agent's key\nFROM_FILE={FILE_VALUE}\n")
    env_file.chmod(0o600)
    script = 'echo "$API_KEY|$FROM_FILE|$FROM_HERE|$GH_TOKEN"; sleep 600'
    res = run_linpodx(
        "run", "-d", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "-e", f"API_KEY={E_VALUE}", "--env-file", str(env_file), "-e", "FROM_HERE",
        "--secret", f"{secret_name},type=env,target=GH_TOKEN",
        "--", "sh", "-c", script,
        env={**os.environ, "FROM_HERE": HERE_VALUE},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    for value in VALUES:
        assert value not in res.stdout + res.stderr
    logs = run_linpodx("logs", unique_name)
    assert logs.stdout.strip() == f"{E_VALUE}|{FILE_VALUE}|{HERE_VALUE}|{SECRET_VALUE}"
    ps = run_linpodx("ps", "--json")
    assert ps.returncode == 0 and unique_name in ps.stdout
    for value in VALUES:
        assert value not in ps.stdout
    # The whole state dir (run spec, audit log, events, plans) and the runtime dir: names only.
    state = Path(paths.state_root())
    assert files_holding(state, VALUES) == []
    assert files_holding(paths.runtime_dir(), VALUES) == []
    assert files_holding(isolated_state, VALUES) == []
    spec = json.loads((state / "containers" / unique_name / "spec.json").read_text())
    assert spec["env_keys"] == ["FROM_FILE", "API_KEY", "FROM_HERE"]
    assert spec["secrets"] == [f"{secret_name},type=env,target=GH_TOKEN"]
    audit = (state / "audit" / "admin.jsonl").read_text()
    assert '"env_keys"' in audit and secret_name in audit
    # podman keeps the values (its own `inspect` shows them); linpodx's does not.
    info = containers.inspect(unique_name)
    env = info["Config"]["Env"]
    assert f"API_KEY={containers.manage.REDACTED}" in env and "HOME=/home/agent" in env
    assert not [v for v in VALUES if v in json.dumps(info)]
    assert run_linpodx("rm", "-f", unique_name).returncode == 0


def test_values_never_on_podmans_command_line(unique_name: str, tmp_path: Path) -> None:
    # podman's argv as linpodx hands it over: a wrapper in front of podman writes it down.
    real = subprocess.run(["which", "podman"], capture_output=True, text=True).stdout.strip()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "argv.log"
    (bindir / "podman").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log}\nexec {real} "$@"\n'
    )
    (bindir / "podman").chmod(0o755)
    res = run_linpodx(
        "run", "--rm", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "-e", f"API_KEY={E_VALUE}", "--", "sh", "-c", 'test "$API_KEY" = ' + E_VALUE,
        env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    argv = log.read_text()
    assert "--env-file=/dev/fd/" in argv
    assert E_VALUE not in argv.replace(f'test "$API_KEY" = {E_VALUE}', "")


def test_a_bad_env_is_refused_before_anything_runs(unique_name: str) -> None:
    res = run_linpodx(
        "run", "--rm", "--name", unique_name, "--image", BUSYBOX_IMAGE, "-e", "HOME=/x",
        "--", "true",
    )  # fmt: skip
    assert res.returncode == 3, res.stderr
    assert "error: HOME is set by linpodx" in res.stderr and "hint:" in res.stderr
    res = run_linpodx(
        "run", "--rm", "--name", unique_name, "--image", BUSYBOX_IMAGE, "-e", "LPX_UNSET_VAR",
        "--", "true",
    )  # fmt: skip
    assert res.returncode == 3 and "LPX_UNSET_VAR is not set" in res.stderr


def test_pull_missing_with_the_image_present_pulls_nothing(unique_name: str) -> None:
    res = run_linpodx(
        "run", "--rm", "--pull", "missing", "--name", unique_name, "--image", BUSYBOX_IMAGE,
        "--", "echo", "ran",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "ran"
    assert "pulling" not in res.stderr


def test_pull_never_with_the_image_missing_is_podmans_error_and_our_hint(
    unique_name: str,
) -> None:
    res = run_linpodx(
        "run", "--rm", "--pull", "never", "--name", unique_name,
        "--image", "localhost/linpodx-test/no-such-image:0", "--", "true",
    )  # fmt: skip
    assert res.returncode != 0
    assert "image not known" in res.stderr  # podman's own words
    assert "hint:" in res.stderr and "--pull=missing" in res.stderr
    assert "pulling" not in res.stderr


def test_pull_missing_says_so_and_shows_podmans_words(unique_name: str) -> None:
    # A registry on a closed local port: podman tries, and fails at once (nothing leaves the
    # machine).
    image = "127.0.0.1:1/linpodx-test/no-such-image:0"
    res = run_linpodx(
        "run", "--rm", "--pull", "missing", "--name", unique_name, "--image", image,
        "--", "true",
    )  # fmt: skip
    assert res.returncode == 5, res.stderr
    assert f"note: pulling {image} (--pull=missing)" in res.stderr
    assert "connection refused" in res.stderr.lower()  # podman's own words, as they came
    assert f"error: podman pull {image} failed" in res.stderr
    assert res.stdout == ""
    audit = (Path(paths.state_root()) / "audit" / "admin.jsonl").read_text()
    assert '"image.pull"' in audit
