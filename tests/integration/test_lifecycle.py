"""ps / start / stop / rm / logs / exec on real podman, each audited in the admin chain."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from linpodx.paths import audit_dir, events_file
from tests.conftest import BUSYBOX_IMAGE, linpodx_argv, run_linpodx

pytestmark = pytest.mark.podman


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, f"podman {args}: {res.stderr}"
    return res


def admin_types() -> list[str]:
    lines = (audit_dir() / "admin.jsonl").read_text().splitlines()
    return [json.loads(line)["type"] for line in lines if line.strip()]


def admin_records() -> list[dict[str, Any]]:
    lines = (audit_dir() / "admin.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def run_ok(*args: str) -> subprocess.CompletedProcess[str]:
    res = run_linpodx(*args)
    assert res.returncode == 0, f"linpodx {args}: {res.stderr}"
    return res


@pytest.fixture
def other_name() -> Iterator[str]:
    """A second container name (an unmanaged container), removed afterwards."""
    name = f"lpx-test-{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["podman", "rm", "-f", "-t", "0", name], capture_output=True, timeout=60)


def test_full_lifecycle_is_audited(unique_name: str) -> None:
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600")
    res = run_linpodx("exec", unique_name, "--", "sh", "-c", "echo in-$((40+2)); exit 4")
    assert res.returncode == 4
    assert res.stdout == "in-42\n"
    run_ok("stop", unique_name, "--time", "2")
    assert podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip() == "exited"
    run_ok("start", unique_name)
    assert podman("inspect", "-f", "{{.State.Status}}", unique_name).stdout.strip() == "running"
    res = run_linpodx("rm", unique_name)
    assert res.returncode == 3 and "--force" in res.stderr  # running: refused without --force
    run_ok("rm", "--force", unique_name)
    assert podman("container", "exists", unique_name, check=False).returncode == 1
    types = admin_types()
    assert types == [
        "container.run",
        "container.exec",
        "container.stop",
        "container.start",
        "container.rm",
    ]
    exec_rec = admin_records()[1]
    assert exec_rec["data"]["argv"] == ["sh", "-c", "echo in-$((40+2)); exit 4"]
    assert exec_rec["data"]["name"] == unique_name
    ev = [json.loads(line)["type"] for line in events_file().read_text().splitlines()]
    for t in ("container.start", "container.exec", "container.stop", "container.rm"):
        assert t in ev
    res = run_linpodx("audit", "verify")
    # The chain linpodx wrote verifies (the audit command is another part's; if it exists).
    if "No such command" not in res.stderr:
        assert res.returncode == 0, res.stderr


def test_ps_shows_only_linpodx_containers(unique_name: str, other_name: str) -> None:
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600")
    podman("run", "-d", "--name", other_name, "--network", "none", BUSYBOX_IMAGE, "sleep", "600")
    doc = json.loads(run_ok("ps", "--json").stdout)
    rows = {r["name"]: r for r in doc["result"]["containers"]}
    assert unique_name in rows and other_name not in rows
    row = rows[unique_name]
    assert (row["profile"], row["revision"], row["state"], row["egress"]) == (
        "default",
        0,
        "running",
        "none",
    )
    run_ok("stop", unique_name, "--time", "1")
    assert unique_name not in {
        r["name"] for r in json.loads(run_ok("ps", "--json").stdout)["result"]["containers"]
    }
    everything = json.loads(run_ok("ps", "--all", "--json").stdout)["result"]["containers"]
    all_rows = {r["name"]: r for r in everything}
    assert all_rows[unique_name]["state"] == "exited"
    text = run_ok("ps", "--all").stdout.splitlines()
    assert text[0].split() == ["NAME", "PROFILE", "REVISION", "STATE", "EGRESS"]
    assert any(line.split()[0] == unique_name for line in text[1:])


def test_unmanaged_containers_are_refused(other_name: str) -> None:
    podman("run", "-d", "--name", other_name, "--network", "none", BUSYBOX_IMAGE, "sleep", "600")
    for args in (
        ("stop", other_name),
        ("rm", "--force", other_name),
        ("exec", other_name, "--", "true"),
        ("start", other_name),
        ("logs", other_name),
    ):
        res = run_linpodx(*args)
        assert res.returncode == 8, (args, res.stderr)
        assert "not managed by linpodx" in res.stderr and "hint:" in res.stderr
        assert "Traceback" not in res.stderr
    assert podman("inspect", "-f", "{{.State.Status}}", other_name).stdout.strip() == "running"


def test_logs_escape_terminal_control(unique_name: str) -> None:
    script = r"printf '\033]0;pwned\007hello\n'; printf 'plain line\n'; sleep 600"
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sh", "-c", script)
    res = run_ok("logs", unique_name)
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    assert "\\x1b]0;pwned\\x07hello" in res.stdout
    assert "plain line" in res.stdout


def test_exec_refused_when_not_running(unique_name: str) -> None:
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600")
    run_ok("stop", unique_name, "--time", "1")
    res = run_linpodx("exec", unique_name, "--", "true")
    assert res.returncode == 3 and "not running" in res.stderr
    assert "container.exec" not in admin_types()


def test_logs_follow_ends_with_the_container(unique_name: str) -> None:
    script = "echo first; sleep 3; echo second"
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sh", "-c", script)
    res = run_linpodx("logs", "--follow", unique_name, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["first", "second"]


def test_detached_rm_container_takes_its_state_dir_with_it(
    unique_name: str, tmp_path: Path
) -> None:
    """`run -d --rm`: podman removes the container when it exits on its own, long after linpodx
    returned; the state dir (run spec, mount pins) goes with it. A kept container's stays."""
    from linpodx.containers import spec_dir

    project = tmp_path / "project"
    project.mkdir()
    prof = tmp_path / "rmd.yml"
    prof.write_text(
        f"version: 1\nname: rmd\nmounts:\n  - source: {project}\n    target: /workspace\n"
    )
    run_ok("sandbox", "apply", "--profile", str(prof))
    kept = f"{unique_name}-kept"
    try:
        run_ok("run", "-d", "--profile", "rmd", "--image", BUSYBOX_IMAGE, "--name", kept,
               "--", "true")  # fmt: skip
        run_ok("run", "-d", "--rm", "--profile", "rmd", "--image", BUSYBOX_IMAGE,
               "--name", unique_name, "--", "sleep", "1")  # fmt: skip
        assert (spec_dir(unique_name) / "spec.json").is_file()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            podman("container", "exists", unique_name, check=False).returncode == 0
            or spec_dir(unique_name).exists()
        ):
            time.sleep(0.2)
        assert podman("container", "exists", unique_name, check=False).returncode == 1
        assert not spec_dir(unique_name).exists()
        # The other one exited too, but podman keeps it: so does linpodx (start needs it).
        assert podman("wait", kept).stdout.strip() == "0"
        assert (spec_dir(kept) / "spec.json").is_file()
        run_ok("start", kept)
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", kept], capture_output=True, timeout=60)


IGNORES_SIGNALS = ["sh", "-c", "trap '' TERM HUP; while :; do sleep 1; done"]
"""A container command that will not end on SIGTERM or SIGHUP (as a hostile agent can)."""


@pytest.mark.parametrize(
    ("rm", "sig", "command"),
    [
        (True, signal.SIGTERM, ["sleep", "600"]),
        (False, signal.SIGHUP, ["sleep", "600"]),
        (True, signal.SIGTERM, IGNORES_SIGNALS),
        (False, signal.SIGHUP, IGNORES_SIGNALS),
    ],
    ids=[
        "rm-one-podman-run-SIGTERM",
        "kept-create-then-attached-start-SIGHUP",
        "rm-one-podman-run-SIGTERM-ignored",
        "kept-create-then-attached-start-SIGHUP-ignored",
    ],
)
def test_signalled_foreground_run_ends_its_container_and_cleans_up(
    unique_name: str, tmp_path: Path, rm: bool, sig: signal.Signals, command: list[str]
) -> None:
    """`kill` (SIGTERM) or a closed terminal (SIGHUP) sent to linpodx alone while it runs a
    container in the foreground: the signal reaches the container through podman, the run ends,
    and linpodx cleans up as after any run. Before, linpodx died at once and left podman
    running the container with nobody watching it (and a `--rm` run's state behind). A
    container that ignores the signal is stopped after the grace period (podman's SIGKILL)
    instead of keeping linpodx waiting for ever."""
    from linpodx.containers import spec_dir

    prof = tmp_path / "sig.yml"
    prof.write_text("version: 1\nname: sig\n")
    run_ok("sandbox", "apply", "--profile", str(prof))
    argv = [*linpodx_argv(), "run", "--profile", "sig", "--image", BUSYBOX_IMAGE,
            "--name", unique_name, *(["--rm"] if rm else []), "--", *command]  # fmt: skip
    # A session of its own: the signal goes to linpodx only, as `kill PID` sends it.
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        running = ""
        while time.monotonic() < deadline and running != "true" and proc.poll() is None:
            time.sleep(0.2)
            running = podman("container", "inspect", "--format", "{{.State.Running}}",
                             unique_name, check=False).stdout.strip()  # fmt: skip
        assert running == "true", f"never saw it running: {proc.poll()} {proc.stderr}"
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    ignored = command is IGNORES_SIGNALS
    # Ended by the signal it was given, or, ignoring it, by `podman stop`'s SIGKILL.
    assert proc.returncode == 128 + (signal.SIGKILL if ignored else sig), (proc.returncode, err)
    assert "Traceback" not in err, err
    if rm:
        assert podman("container", "exists", unique_name, check=False).returncode == 1
        assert not spec_dir(unique_name).exists()
    else:
        state = podman("container", "inspect", "--format", "{{.State.Status}}", unique_name)
        assert state.stdout.strip() == "exited"
        assert (spec_dir(unique_name) / "spec.json").is_file()
        assert run_ok("start", unique_name).returncode == 0  # linpodx still knows it


def test_start_refuses_a_container_made_outside_linpodx_with_its_labels(unique_name: str) -> None:
    """A stopped linpodx container is removed and made again with plain podman under the same
    name and with linpodx's labels (it could have any flags: privileged, the host's network).
    `linpodx start` refuses it, records no start and leaves it stopped; `linpodx rm` removes
    it and the name's state."""
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600")
    run_ok("stop", "--time", "0", unique_name)
    podman("rm", unique_name)
    podman(
        "create", "--name", unique_name, "--label", "linpodx.managed=1",
        "--label", "linpodx.profile_id=builtin", "--label", "linpodx.revision=0",
        "--network", "none", BUSYBOX_IMAGE, "sleep", "600",
    )  # fmt: skip
    before = admin_types()
    res = run_linpodx("start", unique_name)
    assert res.returncode == 8, res.stderr
    assert "is not the one linpodx created under that name" in res.stderr
    assert admin_types() == before
    state = podman("inspect", "--format", "{{.State.Status}}", unique_name).stdout.strip()
    assert state in ("created", "configured")
    run_ok("rm", "-f", unique_name)
    assert podman("container", "exists", unique_name, check=False).returncode == 1


def test_an_id_is_refused_where_a_name_is_expected(unique_name: str) -> None:
    run_ok("run", "--image", BUSYBOX_IMAGE, "--name", unique_name, "-d", "--", "sleep", "600")
    cid = podman("inspect", "--format", "{{.Id}}", unique_name).stdout.strip()
    before = admin_types()
    res = run_linpodx("rm", "-f", cid[:12])
    assert res.returncode == 3, res.stderr
    assert f"podman resolves it to '{unique_name}'" in res.stderr
    assert admin_types() == before
    assert podman("container", "exists", unique_name, check=False).returncode == 0


@pytest.mark.parametrize("delay", [0.0, 0.15, 0.3])
def test_sigterm_while_the_container_is_being_set_up_leaves_nothing_half_made(
    unique_name: str, tmp_path: Path, delay: float
) -> None:
    """SIGTERM lands right after podman created the container, before it started: linpodx
    unwinds as on Ctrl-C (exit 143, `error: terminated (SIGTERM)` if it was not yet waiting on
    the container). Whatever the moment, no container is left that never started; before, one
    was left `created` with its mount gate open, which a plain `podman start` then ran with
    the profile's host paths mounted unchecked."""
    project = tmp_path / "project"
    project.mkdir()
    prof = tmp_path / "setup.yml"
    prof.write_text(
        f"version: 1\nname: setup\nmounts:\n  - source: {project}\n    target: /workspace\n"
    )
    run_ok("sandbox", "apply", "--profile", str(prof))
    argv = [*linpodx_argv(), "run", "--profile", "setup", "--image", BUSYBOX_IMAGE,
            "--name", unique_name, "--", "sleep", "30"]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while podman("container", "exists", unique_name, check=False).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, (proc.returncode, err)
    assert "Traceback" not in err and "internal error" not in err, err
    info = podman("container", "inspect", "--format", "{{.State.Status}} {{.State.StartedAt}}",
                  unique_name, check=False)  # fmt: skip
    if info.returncode == 0:
        status, started = info.stdout.strip().split(" ", 1)
        assert status == "exited" and not started.startswith("0001-01-01"), info.stdout


def test_a_signal_right_after_create_leaves_no_container_that_never_started(
    unique_name: str, tmp_path: Path
) -> None:
    """The window between `podman init` and `podman start --attach` (the announce): a SIGTERM
    there (podman 5's timing put one there in the podman5 phase) must not leave a created
    container behind with its gate open."""
    from linpodx import containers
    from linpodx.errors import Terminated

    project = tmp_path / "project"
    project.mkdir()
    prof = tmp_path / "win.yml"
    prof.write_text(
        f"version: 1\nname: win\nmounts:\n  - source: {project}\n    target: /workspace\n"
    )
    run_ok("sandbox", "apply", "--profile", str(prof))
    req = containers.RunRequest(
        image=BUSYBOX_IMAGE, name=unique_name, profile="win", command=("sleep", "30")
    )

    def announce(_info: object, _spec: object) -> None:
        assert podman("container", "exists", unique_name, check=False).returncode == 0
        raise Terminated(signal.SIGTERM)

    with pytest.raises(Terminated):
        containers.run_foreground(req, announce)
    assert podman("container", "exists", unique_name, check=False).returncode != 0
