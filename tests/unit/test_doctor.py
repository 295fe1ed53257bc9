"""`linpodx doctor` without podman: what it would run."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_test_container_gets_the_flags_linpodx_run_gives_the_default_profile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """doctor's test containers are what a run is (they had their own, shorter list of
    hardening flags: no seccomp profile in the container check, no limits, no tmpfs $HOME)."""
    from linpodx.podman import probe, trial
    from linpodx.podman.argv import CreateSpec, HostLimits, build_create_argv
    from linpodx.profile.model import default_profile

    host = HostLimits(nofile_hard=20000, nproc_hard=9000, cgroup_limits=True, init=False)
    monkeypatch.setattr(probe, "host_limits", lambda: host)
    monkeypatch.setattr(probe, "rootless", lambda: True)
    seccomp = "/state/seccomp/0123.json"
    image = "localhost/busybox:latest"
    run = CreateSpec(
        profile=default_profile(), profile_name="default", profile_id="builtin", revision=0,
        audit_hash="ab" * 32, image=image, name="agent-1", rm=True, command=("true",),
        rootless=True, host=HostLimits(**{**host.__dict__, "seccomp": seccomp}),
    )  # fmt: skip
    made = build_create_argv(run)
    own = ("--name=", "--hostname=", "--label=")
    assert trial.run_argv("/usr/bin/podman", image, ["true"], seccomp) == [
        "/usr/bin/podman", "run", *(a for a in made[1:] if not a.startswith(own))
    ]  # fmt: skip


def test_podman_info_nested_past_the_stack_is_no_info(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`podman info` printing JSON nested past Python's stack ended `doctor` in an internal
    error (RecursionError); it is output doctor cannot read, as any other that is not JSON."""
    import os

    from linpodx import doctor

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman").write_text("#!/bin/sh\npython3 -c 'print(\"[\" * 100000)'\n")
    (bindir / "podman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    assert doctor._info(str(bindir / "podman")) is None
