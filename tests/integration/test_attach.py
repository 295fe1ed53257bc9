"""`linpodx attach` and a rollback of a container someone is attached to, on real podman (root
and rootless), with real terminals (pexpect).

What these pin: attach reaches a running linpodx container's terminal, detaches with podman's
keys and leaves it running, is recorded, and refuses containers linpodx did not make or that
do not run; a rollback refuses to stop a container with an attached session unless --force,
and with it the attached terminal is told what happened and how to get back in, which then
works.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BUSYBOX_IMAGE, CliResult, linpodx_argv
from tests.integration.test_snapshot import (
    HELD,
    audit_types,
    cleanup,
    inspect,
    ok,
    podman,
    rootless_storage_conf,  # noqa: F401  (autouse here too: rootless `podman commit`)
)

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.podman

Cli = Callable[..., CliResult]
PROMPT = r"[#$] "


def spawn(*args: str) -> Any:
    argv = [*linpodx_argv(), *args]
    return pexpect.spawn(argv[0], argv[1:], env=dict(os.environ), timeout=90, encoding="utf-8")


def apply_profile(cli: Cli, name: str, tmp_path: Path) -> str:
    """A profile with a writable workspace (what a snapshot keeps) and no network."""
    ws = tmp_path / "work" / "ws"
    ws.mkdir(parents=True)
    (ws / "f.txt").write_text("v1\n")
    profile = f"att-{name[-10:]}"
    pfile = tmp_path / "profile.yaml"
    pfile.write_text(
        f"name: {profile}\n"
        "mounts:\n"
        f"  - source: {ws}\n"
        "    target: /ws\n"
        "    read_only: false\n"
        "network:\n"
        "  egress_dns_allowlist: []\n"
    )
    ok(cli("sandbox", "apply", "--profile", str(pfile)))
    return profile


@pytest.fixture
def profile(cli: Cli, unique_name: str, tmp_path: Path) -> Iterator[str]:
    try:
        yield apply_profile(cli, unique_name, tmp_path)
    finally:
        cleanup(unique_name, tmp_path)


def attach_and_detach(name: str, marker: str) -> None:
    """`linpodx attach NAME`, a command typed in its shell, then podman's detach keys."""
    child = spawn("attach", name)
    try:
        child.send("\r")  # attach shows nothing until the shell prompts again
        child.expect(PROMPT)
        child.send(f"echo {marker}-$((6*7))\r")
        child.expect(f"{marker}-42")
        # podman's default detach keys, ctrl-p ctrl-q; podman 4.3 misses them in one read.
        child.send("\x10")
        time.sleep(0.3)
        child.send("\x11")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before


def test_attach_reaches_the_terminal_and_detaches_leaving_it_running(
    cli: Cli, profile: str, unique_name: str
) -> None:
    ok(cli("run", "-d", "-i", "-t", "--profile", profile, "--image", BUSYBOX_IMAGE,
           "--name", unique_name, "--", "sh"))  # fmt: skip
    attach_and_detach(unique_name, "in")
    assert inspect(unique_name)["State"]["Status"] == "running"  # type: ignore[index]
    assert audit_types().count("container.attach") == 1
    # Its session marker goes with the session: nothing is left for a rollback to see.
    from linpodx.containers import sessions

    assert sessions.live(unique_name) == []
    assert not list((Path(str(sessions.spec_dir(unique_name))) / "sessions").glob("*"))


def test_attach_refuses_a_stopped_an_unknown_and_a_foreign_container(
    cli: Cli, profile: str, unique_name: str
) -> None:
    ok(cli("run", "-d", "--profile", profile, "--image", BUSYBOX_IMAGE, "--name", unique_name,
           "--", "sh", "-c", "exit 0"))  # fmt: skip
    podman("wait", unique_name)
    stopped = cli("attach", unique_name)
    assert stopped.exit_code == 3, stopped.stderr
    assert f"error: container {unique_name} is not running" in stopped.stderr
    assert f"linpodx start {unique_name}" in stopped.stderr
    typo = cli("attach", unique_name[:-1] + "x")
    assert typo.exit_code == 4
    assert f"hint: did you mean `{unique_name}`" in typo.stderr  # best first (others run too)
    foreign = f"{unique_name}-plain"
    podman("create", "--name", foreign, BUSYBOX_IMAGE, "sleep", "60")  # refused before state
    denied = cli("attach", foreign)
    assert denied.exit_code == 8, denied.stderr
    assert "is not managed by linpodx" in denied.stderr
    assert "container.attach" not in audit_types()


def test_rollback_of_an_attached_container_warns_then_tells_the_terminal(
    cli: Cli, profile: str, unique_name: str
) -> None:
    name = unique_name
    session = spawn("run", "-i", "-t", "--profile", profile, "--image", BUSYBOX_IMAGE,
                    "--name", name, "--", "sh")  # fmt: skip
    try:
        session.expect(PROMPT)
        ok(cli("snapshot", "create", *HELD, name, "--label", "s1", "--wait"))
        session.sendline("echo v2 > /ws/f.txt; echo wrote-$((1+1))")
        session.expect("wrote-2")

        # As the walk-through's step 7 does under its `run -it` terminal: no --force.
        rolled = cli("snapshot", "rollback", name, "--to", "s1")
        ok(rolled)
        assert f"warning: {name} has an attached session (`linpodx run`, pid " in rolled.stderr
        assert f"`linpodx attach {name}`" in rolled.stderr
        # The attached terminal is told what happened, and how to get back in.
        session.expect(f"linpodx: {name} was stopped by `linpodx snapshot rollback {name} "
                       "--to s1`")  # fmt: skip
        session.expect(f"get back in with `linpodx attach {name}`")
        session.expect(pexpect.EOF)
    finally:
        session.close(force=True)
    # And getting back in works: the rolled-back container, with its own terminal.
    attach_and_detach(name, "back")
    assert podman("exec", name, "cat", "/ws/f.txt").stdout == "v1\n"


class PodmanSays:
    """A `saga.Faults` that fails the step named as podman fails: with its exit status and its
    own words on stderr (what a Ctrl-C that reached `podman init` gives)."""

    def __init__(self, step: str) -> None:
        self.step = step

    def at(self, point: str) -> None:
        from linpodx.errors import EngineError

        if point == self.step:
            raise EngineError(
                "podman init failed (exit 125)",
                argv=("podman", "init", "x"),
                returncode=125,
                stderr="Error: preparing container: first line of podman's words\n"
                "Error: interrupted: last line of podman's words\n",
            )


def test_a_rollback_that_podman_fails_shows_podmans_own_words(
    cli: Cli, profile: str, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools

    from linpodx.snapshot import rollback

    ok(cli("run", "-d", "--profile", profile, "--image", BUSYBOX_IMAGE, "--name", unique_name,
           "--", "sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"))  # fmt: skip
    ok(cli("snapshot", "create", *HELD, unique_name, "--label", "s1", "--wait"))
    monkeypatch.setattr(
        rollback, "rollback", functools.partial(rollback.rollback, faults=PodmanSays("create"))
    )
    r = cli("snapshot", "rollback", unique_name, "--to", "s1")
    assert r.exit_code == 5, r.stderr  # podman failed
    assert "failed at step create: podman init failed (exit 125)" in r.stderr
    assert "put back as they were" in r.stderr
    # All of podman's words, not only the exit status (and not only its last line).
    assert "  Error: preparing container: first line of podman's words" in r.stderr
    assert "  Error: interrupted: last line of podman's words" in r.stderr
    assert inspect(unique_name)["State"]["Status"] == "running"  # type: ignore[index]
