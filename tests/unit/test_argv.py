"""The pure podman argv builder, pinned against fixed expected argv tuples."""

from __future__ import annotations

import os

import pytest

from linpodx import paths
from linpodx.errors import EngineError, InvalidInput, UsageError
from linpodx.podman.argv import (
    CreateSpec,
    HostLimits,
    build_create_argv,
    clamp_limit,
    limit_notes,
)
from linpodx.podman.runline import create_pull, hostname_for, pull_policy
from linpodx.profile.model import Mount, Profile, Resources, default_profile

SECCOMP = "/state/seccomp/0123.json"
ROOTFUL = HostLimits(
    nofile_hard=20000, nproc_hard=96364, cgroup_limits=True, init=True, seccomp=SECCOMP
)
ROOTLESS_V1 = HostLimits(
    nofile_hard=20000, nproc_hard=96364, cgroup_limits=False, init=False, seccomp=SECCOMP
)
HASH = "ab" * 32


def spec(profile: Profile | None = None, **kw: object) -> CreateSpec:
    base: dict[str, object] = dict(
        profile=profile or default_profile(),
        profile_name="default",
        profile_id="builtin",
        revision=0,
        audit_hash=HASH,
        image="localhost/linpodx-test/busybox:latest",
        name="agent-1",
        host=ROOTFUL,
    )
    base.update(kw)
    return CreateSpec(**base)  # type: ignore[arg-type]


DEFAULT_ROOTFUL = (
    "create",
    "--name=agent-1",
    "--hostname=agent-1",
    "--label=linpodx.managed=1",
    "--label=linpodx.profile=default",
    "--label=linpodx.profile_id=builtin",
    "--label=linpodx.revision=0",
    f"--label=linpodx.audit_hash={HASH}",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    f"--security-opt=seccomp={SECCOMP}",
    "--network=none",
    "--http-proxy=false",
    "--ipc=private",
    "--systemd=false",
    "--read-only=false",
    "--init",
    "--ulimit=nofile=1024:1024",
    "--ulimit=nproc=4096:4096",
    "--log-driver=k8s-file",
    "--log-opt=max-size=64m",
    "--pids-limit=512",
    "--memory=2g",
    "--memory-swap=2g",
    "--cpus=2",
    "--env=HOME=/home/agent",
    "--workdir=/home/agent",
    "--pull=never",
    "localhost/linpodx-test/busybox:latest",
)


def test_a_spec_without_a_seccomp_profile_is_refused() -> None:
    # Never podman's default profile alone: it lets a rootful container make setuid files.
    spec = CreateSpec(
        profile=default_profile(), profile_name="default", profile_id="builtin", revision=0,
        audit_hash=HASH, image="busybox", name="agent-1", host=HostLimits(),
    )  # fmt: skip
    with pytest.raises(EngineError, match="no seccomp profile"):
        build_create_argv(spec)


def test_default_profile_rootful() -> None:
    assert build_create_argv(spec()) == DEFAULT_ROOTFUL


def test_rootless_cgroup_v1_interactive_rm_with_command() -> None:
    got = build_create_argv(
        spec(
            host=ROOTLESS_V1,
            rootless=True,
            rm=True,
            interactive=True,
            tty=True,
            command=("sh", "-c", "echo --network=host"),
        )
    )
    assert got == (
        "create",
        "--name=agent-1",
        "--hostname=agent-1",
        "--label=linpodx.managed=1",
        "--label=linpodx.profile=default",
        "--label=linpodx.profile_id=builtin",
        "--label=linpodx.revision=0",
        f"--label=linpodx.audit_hash={HASH}",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        f"--security-opt=seccomp={SECCOMP}",
        "--network=none",
        "--http-proxy=false",
        "--ipc=private",
        "--systemd=false",
        "--read-only=false",
        "--userns=keep-id",
        "--ulimit=nofile=1024:1024",
        "--ulimit=nproc=4096:4096",
        "--log-driver=k8s-file",
        "--log-opt=max-size=64m",
        "--env=HOME=/home/agent",
        "--workdir=/home/agent",
        "--pull=never",
        "--mount=type=tmpfs,destination=/home/agent,tmpfs-mode=0700,tmpfs-size=512m,chown=true",
        "--rm",
        "--interactive",
        "--tty",
        "localhost/linpodx-test/busybox:latest",
        "sh",
        "-c",
        "echo --network=host",
    )


def test_profile_mounts_env_caps_limits_and_resolv_conf() -> None:
    prof = Profile(
        name="agent-readonly",
        mounts=(
            Mount(source="/srv/src", target="/workspace", read_only=True),
            Mount(source="/srv/out", target="/out", read_only=False),
        ),
        cap_add=("NET_BIND_SERVICE",),
        env=(("LANG", "C.UTF-8"), ("EMPTY", "")),
        workdir="/workspace",
        resources=Resources(memory="512m", cpus="1.5", pids_limit=64, nofile=50000, nproc=128),
    )
    got = build_create_argv(
        spec(
            prof,
            profile_name="agent-readonly",
            profile_id="prof_01JABCDEF",
            revision=3,
            resolv_conf="/run/linpodx/agent-1/resolv.conf",
        )
    )
    gate = os.path.join(paths.containers_root(), "agent-1", "mounts", "use-linpodx-start")
    assert got == (
        "create",
        "--name=agent-1",
        "--hostname=agent-1",
        "--label=linpodx.managed=1",
        "--label=linpodx.profile=agent-readonly",
        "--label=linpodx.profile_id=prof_01JABCDEF",
        "--label=linpodx.revision=3",
        f"--label=linpodx.audit_hash={HASH}",
        "--cap-drop=all",
        "--cap-add=NET_BIND_SERVICE",
        "--security-opt=no-new-privileges",
        f"--security-opt=seccomp={SECCOMP}",
        "--network=none",
        "--http-proxy=false",
        "--ipc=private",
        "--systemd=false",
        "--read-only=false",
        "--init",
        # nofile 50000 is above the host's hard 20000: clamped, never passed through.
        "--ulimit=nofile=20000:20000",
        "--ulimit=nproc=128:128",
        "--log-driver=k8s-file",
        "--log-opt=max-size=64m",
        "--pids-limit=64",
        "--memory=512m",
        "--memory-swap=512m",
        "--cpus=1.5",
        "--env=HOME=/home/agent",
        "--env=LANG=C.UTF-8",
        "--env=EMPTY=",
        "--workdir=/workspace",
        "--mount=type=bind,source=/srv/src,destination=/workspace,ro=true,bind-propagation=rprivate",
        "--mount=type=bind,source=/srv/out,destination=/out,ro=false,bind-propagation=rprivate",
        "--pull=never",
        # The mount gate (linpodx.podman.mountpin): only linpodx's own starts find it open.
        f"--mount=type=bind,source={gate},destination=/run/linpodx/mount-gate,ro=true,"
        "bind-propagation=rprivate",
        "--mount=type=bind,source=/run/linpodx/agent-1/resolv.conf,destination=/etc/resolv.conf,"
        "ro=true,bind-propagation=rprivate",
        "--pidfile=/run/linpodx/agent-1/init.pid",
        "localhost/linpodx-test/busybox:latest",
    )


def test_hostname_override_for_recreate() -> None:
    got = build_create_argv(spec(name="agent-1-lpxnew-abc123", hostname="agent-1"))
    assert got[1:3] == ("--name=agent-1-lpxnew-abc123", "--hostname=agent-1")


def test_never_host_env_or_network() -> None:
    argv = build_create_argv(spec(rootless=True))
    joined = " ".join(argv)
    assert "--env-host" not in joined
    assert "--http-proxy=false" in argv
    assert [a for a in argv if a.startswith("--network")] == ["--network=none"]
    assert not [a for a in argv if a.startswith("--device")]
    assert not [a for a in argv if a.startswith(("--privileged", "--volume", "-v"))]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "bad name"),
        ("name", "-x"),
        ("name", ""),
        ("name", "a" * 64),
        ("image", "--privileged"),
        ("image", ""),
        ("image", "busybox latest"),
    ],
)
def test_refuses_bad_name_and_image(field: str, value: str) -> None:
    with pytest.raises(InvalidInput):
        build_create_argv(spec(**{field: value}))


@pytest.mark.parametrize(
    "profile",
    [
        Profile(name="p", env=(("FOO*", "x"),)),
        Profile(name="p", env=(("A=B", "x"),)),
        Profile(name="p", cap_add=("sys_admin",)),
        Profile(name="p", mounts=(Mount(source="/a,b", target="/x"),)),
        Profile(name="p", mounts=(Mount(source="/a", target="/x,ro=false"),)),
        Profile(name="p", mounts=(Mount(source='/a"b', target="/x"),)),
        Profile(name="p", mounts=(Mount(source="/a", target='/w"x'),)),
        # linpodx's $HOME (a tmpfs for --rm containers) and its parent.
        Profile(name="p", mounts=(Mount(source="/a", target="/home/agent"),)),
        Profile(name="p", mounts=(Mount(source="/a", target="/home"),)),
        Profile(name="p", mounts=(Mount(source="relative", target="/x"),)),
        Profile(name="p", resources=Resources(memory="2g; rm -rf /")),
        Profile(name="p", resources=Resources(cpus="-1")),
    ],
)
def test_refuses_values_podman_could_misread(profile: Profile) -> None:
    with pytest.raises(InvalidInput):
        build_create_argv(spec(profile))


def test_clamp_and_notes() -> None:
    assert clamp_limit("nofile", 1024, 20000) == (1024, None)
    assert clamp_limit("nofile", 1024, None) == (1024, None)
    value, note = clamp_limit("nofile", 30000, 20000)
    assert value == 20000
    assert note is not None and "20000" in note
    notes = limit_notes(spec(host=ROOTLESS_V1))
    assert len(notes) == 1 and "RLIMIT_NPROC=4096" in notes[0]
    assert limit_notes(spec()) == []


def test_hostname_for() -> None:
    assert hostname_for("agent_1.x") == "agent-1-x"
    assert hostname_for("___") == "linpodx"


def test_a_mount_inside_home_goes_over_the_tmpfs_home() -> None:
    # Allowed: podman mounts the tmpfs $HOME first (shorter destination), then this inside it.
    prof = Profile(name="p", mounts=(Mount(source="/srv/work", target="/home/agent/work"),))
    got = build_create_argv(spec(prof, rm=True))
    mounts = [a for a in got if a.startswith("--mount=")]
    dests = [part for a in mounts for part in a.split(",") if part.startswith("destination=")]
    assert len(dests) == len(set(dests))
    assert (
        "--mount=type=tmpfs,destination=/home/agent,tmpfs-mode=0700,tmpfs-size=512m,chown=true"
    ) in got
    assert ("--mount=type=bind,source=/srv/work,destination=/home/agent/work,ro=true,"
            "bind-propagation=rprivate") in got


def test_limits_the_host_cannot_apply_are_refused_unless_best_effort() -> None:
    limited = Profile(name="lim", resources=Resources(memory="64m", pids_limit=64))
    with pytest.raises(InvalidInput) as ei:
        build_create_argv(spec(profile=limited, host=ROOTLESS_V1))
    assert "sets resources.memory, resources.pids_limit" in ei.value.message
    assert ei.value.hint and "enforcement: best_effort" in ei.value.hint
    best = Profile(
        name="lim",
        resources=Resources(memory="64m", pids_limit=64, enforcement="best_effort"),
    )
    argv = build_create_argv(spec(profile=best, host=ROOTLESS_V1))
    assert not [a for a in argv if a.startswith(("--memory", "--pids-limit", "--cpus"))]
    assert "--ulimit=nproc=4096:4096" in argv
    notes = limit_notes(spec(profile=best, host=ROOTLESS_V1))
    assert any("memory, pids_limit (enforcement: best_effort) are not applied" in n for n in notes)
    # Where the host can apply them, both give exactly the profile's limits.
    for p in (limited, best):
        argv = build_create_argv(spec(profile=p))
        assert "--memory=64m" in argv and "--pids-limit=64" in argv and "--cpus=2" in argv


@pytest.mark.parametrize(
    ("policy", "flag"),
    [("never", "--pull=never"), ("missing", "--pull=missing"), ("always", "--pull=missing"),
     ("newer", "--pull=missing")],
)  # fmt: skip
def test_pull_policy_reaches_podman_as_its_create_form(policy: str, flag: str) -> None:
    # linpodx pulls first for always/newer (`containers.images`); create then only pulls an
    # image removed in between, never a second time.
    argv = build_create_argv(spec(pull=create_pull(pull_policy(policy))))
    assert [a for a in argv if a.startswith("--pull")] == [flag]


def test_pull_policy_default_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LINPODX_PULL", raising=False)
    assert pull_policy(None) == "missing"
    monkeypatch.setenv("LINPODX_PULL", "never")
    assert pull_policy(None) == "never"
    assert pull_policy("always") == "always"  # --pull wins over the environment
    monkeypatch.setenv("LINPODX_PULL", "sometimes")
    with pytest.raises(InvalidInput, match="LINPODX_PULL"):
        pull_policy(None)
    with pytest.raises(UsageError, match="--pull"):
        pull_policy("--privileged")


def test_run_env_goes_by_memory_file_and_secrets_by_name() -> None:
    argv = build_create_argv(
        spec(
            env_keys=("API_KEY",),
            env_file="/dev/fd/7",
            secrets=("gh-token,type=env,target=GH_TOKEN", "cert"),
        )
    )
    assert argv[-5:] == (
        "--pull=never",
        "--env-file=/dev/fd/7",
        "--secret=gh-token,type=env,target=GH_TOKEN",
        "--secret=cert",
        "localhost/linpodx-test/busybox:latest",
    )
    with pytest.raises(InvalidInput):
        build_create_argv(spec(env_file="/tmp/values"))  # only a descriptor, never a file
