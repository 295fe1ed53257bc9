"""`containers.recreate` (used for rollback): same name, profile revision and hostname from a new
image; a failure leaves the original container as it was."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from linpodx import containers
from linpodx.errors import EngineError
from tests.conftest import BUSYBOX_IMAGE, run_linpodx

pytestmark = pytest.mark.podman


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, f"podman {args}: {res.stderr}"
    return res


def sh(name: str, script: str) -> str:
    return podman("exec", name, "sh", "-c", script).stdout


@pytest.fixture
def image_ref() -> Iterator[str]:
    ref = f"localhost/lpx-test-recreate-{uuid.uuid4().hex[:8]}:1"
    yield ref
    subprocess.run(["podman", "rmi", "-f", ref], capture_output=True, timeout=120)


def leftovers(name: str) -> list[str]:
    out = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    return [n for n in out if n.startswith(name[:48] + "-lpx")]


def test_recreate_from_committed_image(unique_name: str, image_ref: str) -> None:
    res = run_linpodx(
        "run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600"
    )
    assert res.returncode == 0, res.stderr
    labels_before = podman("inspect", "-f", "{{json .Config.Labels}}", unique_name).stdout
    sh(unique_name, 'echo v1 > "$HOME/marker"')
    podman("commit", unique_name, image_ref)
    sh(unique_name, 'echo v2 > "$HOME/marker"; touch "$HOME/after"')

    info = containers.recreate(unique_name, image_ref)
    assert info.state == "running" and info.image == image_ref
    assert sh(unique_name, 'cat "$HOME/marker"; ls "$HOME"') == "v1\nmarker\n"
    assert json.loads(podman("inspect", "-f", "{{json .Config.Labels}}", unique_name).stdout) == (
        json.loads(labels_before)
    )
    assert sh(unique_name, "hostname").strip() == unique_name[:63]
    assert containers.load_spec(unique_name)["image"] == image_ref
    assert leftovers(unique_name) == []
    # Still hardened the same way.
    assert "NoNewPrivs:\t1" in sh(unique_name, "cat /proc/self/status")


def test_recreate_failure_leaves_original(unique_name: str) -> None:
    res = run_linpodx(
        "run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600"
    )
    assert res.returncode == 0, res.stderr
    sh(unique_name, 'echo original > "$HOME/marker"')
    cid = podman("inspect", "-f", "{{.Id}}", unique_name).stdout.strip()
    with pytest.raises(EngineError) as ei:
        containers.recreate(unique_name, "localhost/linpodx-test/no-such-image:0")
    assert "image not known" in ei.value.stderr
    assert podman("inspect", "-f", "{{.Id}} {{.State.Status}}", unique_name).stdout.split() == [
        cid,
        "running",
    ]
    assert sh(unique_name, 'cat "$HOME/marker"') == "original\n"
    assert leftovers(unique_name) == []
    assert containers.load_spec(unique_name)["image"] == BUSYBOX_IMAGE
