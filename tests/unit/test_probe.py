"""Which cgroup limits this host applies for the caller (`linpodx.podman.probe`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from linpodx.podman import probe


def _cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str | None, own: str | None,
             *, version: int = 2) -> None:
    """A cgroup tree under tmp_path: the user's manager delegates `user` (None: no such
    cgroup), this process's own cgroup `/app` has `own`."""
    uid = 1234
    root = tmp_path / "cg"
    if user is not None:
        d = root / f"user.slice/user-{uid}.slice/user@{uid}.service"
        d.mkdir(parents=True)
        (d / "cgroup.controllers").write_text(user + "\n")
    if own is not None:
        (root / "app").mkdir(parents=True)
        (root / "app" / "cgroup.controllers").write_text(own + "\n")
    (tmp_path / "self").write_text("0::/app\n")
    monkeypatch.setattr(probe, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(probe, "SELF_CGROUP", str(tmp_path / "self"))
    monkeypatch.setattr(probe, "cgroup_version", lambda: version)
    monkeypatch.setattr(probe.os, "getuid", lambda: uid)


@pytest.mark.parametrize(
    ("user", "own", "applies"),
    [
        ("cpuset cpu io memory pids", None, True),
        # systemd's default delegation on many hosts: memory and pids, no cpu. podman would
        # drop --cpus with a warning and run without it.
        ("memory pids", "cpu memory pids", False),
        ("cpu memory", None, False),
        (None, "cpu memory pids", True),  # no systemd manager: podman's own cgroup (cgroupfs)
        (None, None, False),  # nothing readable: not known to apply, so not promised
    ],
)
def test_rootless_cgroup_v2_limits_apply_only_with_every_controller_delegated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str | None, own: str | None,
    applies: bool,
) -> None:
    _cgroups(tmp_path, monkeypatch, user, own)
    monkeypatch.setattr(probe, "rootless", lambda: True)
    assert probe.host_facts()[3] is applies


def test_root_always_and_rootless_cgroup_v1_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cgroups(tmp_path, monkeypatch, None, None)
    monkeypatch.setattr(probe, "rootless", lambda: False)
    assert probe.host_facts()[3] is True
    _cgroups(tmp_path / "v1", monkeypatch, "cpu memory pids", None, version=1)
    monkeypatch.setattr(probe, "rootless", lambda: True)
    assert probe.host_facts()[3] is False
