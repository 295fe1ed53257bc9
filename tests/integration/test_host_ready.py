"""The test host is what scripts/test.sh promises: podman runs both test images with runc and the
default ulimits, as whichever user runs the suite (root, then the rootless test user).

These run plain podman on purpose (no linpodx code): when they fail, the host is broken, not
linpodx. They also prove that each pytest phase of scripts/test.sh really ran podman.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import BUSYBOX_IMAGE, DEBIAN_IMAGE, ROOTLESS

pytestmark = pytest.mark.podman


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run podman; fail the test with podman's own stderr when it exits non-zero."""
    result = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"podman {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
    )
    return result


def test_engine_is_runc_and_rootless_matches_euid() -> None:
    out = podman(
        "info", "--format", "{{.Host.OCIRuntime.Name}} {{.Host.Security.Rootless}}"
    ).stdout.split()
    assert out == ["runc", "true" if ROOTLESS else "false"]


def test_busybox_image_runs(unique_name: str) -> None:
    result = podman(
        "run",
        "--rm",
        "--name",
        unique_name,
        "--network",
        "none",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "echo hello-from-busybox; id -u",
    )
    # Inside the container we are root; rootless, that root is the test user outside.
    assert result.stdout.splitlines() == ["hello-from-busybox", "0"]


def test_debian_image_has_python_and_mcp(unique_name: str) -> None:
    script = "import sys, mcp.server; print(sys.version_info[:2] == (3, 11), mcp.server.__name__)"
    result = podman(
        "run",
        "--rm",
        "--name",
        unique_name,
        "--network",
        "none",
        DEBIAN_IMAGE,
        "python3",
        "-c",
        script,
    )
    assert result.stdout.split() == ["True", "mcp.server"]


def test_debian_image_has_network_tools(unique_name: str) -> None:
    tools = ["curl", "ip", "dig", "ps", "nc"]
    result = podman(
        "run",
        "--rm",
        "--name",
        unique_name,
        "--network",
        "none",
        DEBIAN_IMAGE,
        "sh",
        "-c",
        "for t in " + " ".join(tools) + "; do command -v $t >/dev/null && echo $t; done",
    )
    assert result.stdout.split() == tools


def test_default_ulimits_apply(unique_name: str) -> None:
    # containers.conf's default_ulimits: without them every start fails on this host (the hard
    # nofile limit cannot be raised), so a container that starts at all shows these values.
    result = podman(
        "run",
        "--rm",
        "--name",
        unique_name,
        "--network",
        "none",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "ulimit -n; ulimit -Hn; ulimit -u",
    )
    assert result.stdout.split() == ["1024", "1024", "4096"]


def test_explicit_ulimits_replace_the_defaults(unique_name: str) -> None:
    # Any --ulimit replaces ALL of default_ulimits (checked on this host: `--ulimit nofile=...`
    # alone fails as root with "error setting rlimit type 6" because nproc then falls back to the
    # host's limit). Whoever passes ulimits must pass both.
    result = podman(
        "run",
        "--rm",
        "--name",
        unique_name,
        "--network",
        "none",
        "--ulimit",
        "nofile=256:512",
        "--ulimit",
        "nproc=2048:2048",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "ulimit -n; ulimit -Hn; ulimit -u",
    )
    assert result.stdout.split() == ["256", "512", "2048"]


def test_default_network_gives_an_interface(unique_name: str) -> None:
    # Rootless this needs slirp4netns and a usable /dev/net/tun; rootful, netavark's bridge.
    # Only the container's own interface list is read: no traffic leaves the machine.
    result = podman(
        "run",
        "--rm",
        "--name",
        unique_name,
        BUSYBOX_IMAGE,
        "ip",
        "-o",
        "-4",
        "addr",
        "show",
    )
    names = {line.split()[1] for line in result.stdout.splitlines() if line.strip()}
    assert "lo" in names
    assert names - {"lo"}, f"no interface besides lo: {result.stdout!r}"


def test_user_namespace_matches_the_user(unique_name: str) -> None:
    lines = podman(
        "run",
        "--rm",
        "--name",
        unique_name,
        "--network",
        "none",
        BUSYBOX_IMAGE,
        "cat",
        "/proc/self/uid_map",
    ).stdout.splitlines()
    maps = [line.split() for line in lines]
    if ROOTLESS:
        # Container root is the test user itself; its subordinate range follows
        # (uid_map lines are "inside outside count").
        assert maps[0] == ["0", str(os.getuid()), "1"]
        assert len(maps) == 2
        assert maps[1][0] == "1"
        assert int(maps[1][2]) >= 65535
    else:
        # Rootful podman without --userns: the identity map of all ids.
        assert maps == [["0", "0", "4294967295"]]


def test_commit_and_run_the_committed_image(unique_name: str) -> None:
    # `podman commit` reads the storage configuration through another code path than `run`;
    # rootless with the tests' temp HOME it once failed with "runroot must be set".
    image = f"localhost/linpodx-test/host-ready-{unique_name}:1"
    podman(
        "run",
        "--name",
        unique_name,
        "--network",
        "none",
        BUSYBOX_IMAGE,
        "sh",
        "-c",
        "echo committed > /marker",
    )
    try:
        podman("commit", "--quiet", unique_name, image)
        out = podman("run", "--rm", "--network", "none", image, "cat", "/marker").stdout
        assert out == "committed\n"
    finally:
        subprocess.run(["podman", "rmi", "-f", image], capture_output=True, timeout=60, check=False)
