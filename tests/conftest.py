"""Fixtures shared by every test.

Every test gets its own HOME and XDG dirs under tmp_path (autouse), so nothing touches the real
user's state. Podman tests use images built by `scripts/test.sh`; their names come from the
environment so a person can point the suite at other images.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

DEBIAN_IMAGE = os.environ.get("LINPODX_TEST_IMAGE", "localhost/linpodx-test/debian:12")
BUSYBOX_IMAGE = os.environ.get("LINPODX_TEST_BUSYBOX", "localhost/linpodx-test/busybox:latest")
ROOTLESS = os.geteuid() != 0


@dataclass
class CliResult:
    """What one in-process CLI call left."""

    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def watchdog() -> Iterator[None]:
    """Opening or reading a FIFO blocking would hang the suite: turn that into a failure after
    60 s (not a timing assertion: nothing that passes comes anywhere near it)."""
    import signal

    def hung(_sig: int, _frame: object) -> None:
        raise AssertionError("hung: something was opened or read blocking")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point HOME, XDG dirs and the linpodx state dir at a fresh temp dir."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.delenv("LINPODX_STATE_DIR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    # `run` pulls a missing image by default: tests never reach a registry (a test of a
    # missing image would ask docker.io). Tests of `--pull` give it explicitly.
    monkeypatch.setenv("LINPODX_PULL", "never")
    return home


@pytest.fixture
def cli() -> object:
    """Run `linpodx ARGS…` in-process; returns a function giving a CliResult."""
    from linpodx.cli.main import main

    def invoke(*args: str) -> CliResult:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = main(list(args))
        return CliResult(code, out.getvalue(), err.getvalue())

    return invoke


def linpodx_argv() -> list[str]:
    """argv prefix that runs linpodx in a subprocess with this interpreter."""
    return [sys.executable, "-m", "linpodx"]


def run_linpodx(*args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run linpodx as a real subprocess (inherits the test's isolated env)."""
    return subprocess.run(  # type: ignore[call-overload,no-any-return]
        [*linpodx_argv(), *args], capture_output=True, text=True, timeout=timeout, **kw
    )


def podman_available() -> bool:
    if shutil.which("podman") is None:
        return False
    return subprocess.run(["podman", "info"], capture_output=True, timeout=60).returncode == 0


@pytest.fixture
def unique_name() -> Iterator[str]:
    """A container name no other test uses; the container is removed afterwards."""
    name = f"lpx-test-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Podman tests must run where the suite is meant to run: fail loudly, never skip silently.

    `LINPODX_SKIP_PODMAN=1` is the one explicit way to leave them out (a developer's laptop
    without podman); `scripts/test.sh` never sets it.
    """
    if os.environ.get("LINPODX_SKIP_PODMAN") == "1":
        skip = pytest.mark.skip(reason="LINPODX_SKIP_PODMAN=1 set explicitly")
        for item in items:
            if "podman" in item.keywords:
                item.add_marker(skip)
