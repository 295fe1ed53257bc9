"""The fast run path (linpodx.fastpath: run, plan) against a stand-in `podman` on PATH.

What these pin: a `--rm` run without a terminal under an applied profile starts podman with the
very argv the full path builds, after the very `container.run` record the full path writes,
having imported none of the heavy modules; a plan is used only when everything it was made from
is unchanged, and in every other case nothing at all is done before the full path takes over.
The real podman runs the same path in tests/integration/test_run_once.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import linpodx
from linpodx import containers, fastpath, proc
from linpodx.audit import writer
from linpodx.cli.main import main
from linpodx.fastpath import plan as runplan
from linpodx.fastpath import run as fastrun
from linpodx.fastpath.argv import PlainRun
from linpodx.paths import admin_log, containers_dir
from linpodx.podman import argv as argv_mod
from linpodx.podman import probe, spawn
from linpodx.profile import store

PROFILE = """\
version: 1
name: fast
description: fast path test
mounts:
  - source: {project}
    target: /workspace
  - source: {project}
    target: /rw
    read_only: false
env:
  ZZ_FIRST: written before LANG
  LANG: C.UTF-8
cap_add: [CHOWN]
resources:
  memory: 256m
  cpus: "1.5"
  pids_limit: 128
"""

FAKE_PODMAN = """\
#!{python}
# Stands in for podman: logs its argv (and the mount-check hook's expectations), writes the id
# file like `podman run --cidfile`, says something on both streams and exits with FAKE_PODMAN_RC.
import json, os, sys
with open(os.environ["FAKE_PODMAN_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
for a in sys.argv[1:]:
    if a.startswith("--hooks-dir=") and a.endswith("/mounts/hooks"):
        with open(a[len("--hooks-dir="):-len("hooks")] + "expect") as src:
            with open(os.environ["FAKE_PODMAN_LOG"] + ".expect", "w") as dst:
                dst.write(src.read())
    if a.startswith("--cidfile="):
        with open(a[len("--cidfile="):], "w") as f:
            f.write("ab" * 32)
sys.stdout.write("out from the container\\n")
sys.stderr.write("err from the container\\n")
sys.exit(int(os.environ.get("FAKE_PODMAN_RC", "0")))
"""


@pytest.fixture
def fake_podman(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `podman` first on PATH; returns the file its calls are logged to."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "podman"
    exe.write_text(FAKE_PODMAN.format(python=sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "podman.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_PODMAN_LOG", str(log))
    return log


@pytest.fixture
def applied(tmp_path: Path) -> containers.ProfileRef:
    project = tmp_path / "project"
    project.mkdir()
    path = tmp_path / "fast.yml"
    path.write_text(PROFILE.format(project=project))
    res = store.apply(path)
    ref = containers.profile_by_id(res.profile_id)
    containers.save_plan(ref)  # what `sandbox apply` does after storing
    return ref


def fields(**kw: Any) -> PlainRun:
    """What `linpodx.fastpath.argv.parse_fields` reads from a plain `run`, changed by `kw`."""
    return PlainRun(**raw_fields(**kw))


def request(**kw: Any) -> containers.RunRequest:
    """The request of `fields(**kw)`."""
    return containers.RunRequest(**raw_fields(**kw))


def raw_fields(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "image": "localhost/img:1",
        "name": "agent-1",
        "profile": "fast",
        "pull": None,
        "command": ("sh", "-c", "echo hi"),
        "interactive": False,
        "tty": False,
        "detach": False,
        "rm": True,
    }
    return {**base, **kw}


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def admin_records() -> list[dict[str, Any]]:
    with open(admin_log(), "rb") as f:
        return [json.loads(line) for line in f]


def not_announced(info: Any, spec: Any) -> None:
    raise AssertionError("announced")


def test_fast_run_starts_the_full_paths_argv_after_the_full_paths_record(
    applied: containers.ProfileRef, fake_podman: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_path(*a: Any) -> int:
        raise AssertionError("the full path ran")

    monkeypatch.setattr(containers, "run_foreground", full_path)
    before = len(admin_records())
    rc = main(["run", "--rm", "--profile", "fast", "--image", "localhost/img:1",
               "--name", "agent-1", "--", "sh", "-c", "echo hi"])  # fmt: skip
    assert rc == 0
    [argv] = calls(fake_podman)
    cidfile = argv[2].removeprefix("--cidfile=")
    req = request()
    spec = containers.make_spec(req, applied)
    # The full path's flag for the mount-check hook (containers.pin_mounts), then its argv.
    hooks = containers_dir() / "agent-1" / "mounts" / "hooks"
    assert argv == [f"--hooks-dir={hooks}", *argv_mod.build_run_argv(spec, cidfile)]
    st = os.stat(applied.profile.mounts[0].source)
    expect = Path(f"{fake_podman}.expect").read_text()
    assert expect == f"{st.st_dev} {st.st_ino} /workspace\n{st.st_dev} {st.st_ino} /rw\n"
    records = admin_records()[before:]
    assert [r["type"] for r in records] == ["container.run"]
    assert records[0]["data"] == containers.plan.run_record(spec, applied)
    assert not (containers_dir() / "agent-1").exists()  # --rm: the spec dir went with it


def test_fast_run_returns_podmans_status_and_saves_the_spec_before_announcing(
    applied: containers.ProfileRef, fake_podman: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    monkeypatch.setenv("FAKE_PODMAN_RC", "3")
    seen: list[tuple[str, bool, bool]] = []
    before = signal.getsignal(signal.SIGINT)

    def announce(info: containers.ContainerInfo, spec: Any) -> None:
        doc = json.loads(containers.spec_path("agent-1").read_text())
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # Ctrl-C is podman's now
        seen.append((info.container_id, doc["container_id"] == info.container_id, ignored))

    assert fastrun.run(fields(), announce) == 3
    assert seen == [("ab" * 32, True, True)]
    assert signal.getsignal(signal.SIGINT) == before


def fast_path_modules(extra_import: str = "") -> set[str]:
    """The modules a fast `linpodx run --rm` has loaded when it starts podman, beyond those the
    interpreter had before linpodx was imported. Python runs with `-S` and the repository on
    its path: an editable install's import hook (or any `.pth` file) brings modules of its own
    with `site`, which would hide some of linpodx's from the count."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(linpodx.__file__).parent.parent)!r})
        before = set(sys.modules)
        from linpodx import proc
        real = proc.Child.__init__
        def spy(self, argv):
            new = sorted(set(sys.modules) - before)
            print("MODULES " + " ".join(new), file=sys.stderr)
            real(self, argv)
        proc.Child.__init__ = spy
        {extra_import}
        from linpodx.cli.main import main
        sys.exit(main(["run", "--rm", "--profile", "fast", "--image", "localhost/img:1",
                       "--", "true"]))
        """
    )
    res = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    [line] = [x for x in res.stderr.splitlines() if x.startswith("MODULES ")]
    return set(line.split()[1:])


def outside_the_budget(loaded: set[str]) -> set[str]:
    """What of `loaded` neither the fast path's package nor its two lists name."""
    # The command's entry (every command starts there) is above the fast path, so it is not
    # in the package's lists; it keeps to the same budget.
    allowed = {*fastpath.KERNEL, *fastpath.STDLIB, "linpodx.cli", "linpodx.cli.main"}
    return {
        m for m in loaded
        if m not in allowed and m != "linpodx.fastpath" and not m.startswith("linpodx.fastpath.")
    }  # fmt: skip


def test_the_fast_path_loads_only_its_kernel_before_podman_starts(
    applied: containers.ProfileRef, fake_podman: Path
) -> None:
    # Structural, not timed: the lists in linpodx/fastpath/__init__.py are the fast path's
    # import budget, and every module outside them is start-up cost before podman runs.
    loaded = fast_path_modules()
    assert outside_the_budget(loaded) == set()
    assert {"linpodx.fastpath.run", "linpodx.fastpath.plan", "linpodx.audit.core"} <= loaded
    assert "linpodx.cli.runcmd" not in loaded  # the full path's body, loaded only for it


def test_an_import_outside_the_kernel_breaks_the_budget(
    applied: containers.ProfileRef, fake_podman: Path
) -> None:
    # The check above can fail: a module that pulls in typing and pathlib is seen.
    loaded = fast_path_modules("import linpodx.errors, pathlib, typing")
    assert {"pathlib", "typing"} <= outside_the_budget(loaded)


def test_what_a_guarded_run_adds_before_podman_starts_is_in_the_budget() -> None:
    # A guarded run also launches the guard before podman starts (`fastpath.run._guard_first`);
    # what that import adds to the unguarded run's modules must be in the lists too.
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(linpodx.__file__).parent.parent)!r})
        import linpodx.cli.main, linpodx.fastpath.argv, linpodx.fastpath.run
        before = set(sys.modules)
        import linpodx.egress.launch
        print(" ".join(sorted(set(sys.modules) - before)))
        """
    )
    res = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    added = set(res.stdout.split())
    assert "linpodx.egress.launch" in added
    assert outside_the_budget(added) == set()


def test_the_kernel_is_the_ground_and_stays_off_the_heavy_modules() -> None:
    heavy = {
        "linpodx.containers", "linpodx.profile.model", "linpodx.profile.loader",
        "linpodx.profile.store", "linpodx.podman.argv", "linpodx.podman.engine",
        "linpodx.audit.chain", "linpodx.events", "linpodx.cli.runcmd",
    }  # fmt: skip
    assert heavy.isdisjoint(fastpath.KERNEL)
    assert {"typing", "pathlib", "subprocess", "threading", "hashlib"}.isdisjoint(
        fastpath.STDLIB
    )


def stale_revision(ref: containers.ProfileRef) -> None:
    path = Path(runplan.revision_file(ref.profile_id))
    path.write_bytes(path.read_bytes() + b" ")


def stale_code(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(runplan, "_code_digest", "0" * 64)


def stale_host(mp: pytest.MonkeyPatch) -> None:
    real = probe.host_facts()
    mp.setattr(probe, "host_facts", lambda: (real[0], 64, *real[2:]))


def garbage_plan(ref: containers.ProfileRef) -> None:
    Path(runplan.plan_file(ref.profile_id)).write_text('{"format": 1, "flags": ["--privileged"')


def foreign_flag(ref: containers.ProfileRef) -> None:
    path = Path(runplan.plan_file(ref.profile_id))
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "flags": [*doc["flags"], "privileged"]}))


def edited_plan(ref: containers.ProfileRef, spoil: str) -> None:
    """What someone with the state dir's owner's rights can do to a plan: flags and mounts that
    look like linpodx's own, but are not what the revision gives."""
    path = Path(runplan.plan_file(ref.profile_id))
    doc = json.loads(path.read_text())
    flags = doc["flags"]
    if spoil == "privileged":
        flags.append("--privileged")
    elif spoil == "host network":
        flags[flags.index("--network=none")] = "--network=host"
    elif spoil == "no cap-drop":
        flags.remove("--cap-drop=all")
    elif spoil == "extra mount":
        flags.append("--mount=type=bind,source=/etc,destination=/hostetc,ro=false")
        doc["mounts"].append(["/etc", "/hostetc"])
    elif spoil == "writable mount":
        i = next(i for i, f in enumerate(flags) if "destination=/workspace" in f)
        flags[i] = flags[i].replace("ro=true", "ro=false")
    path.write_text(json.dumps(doc))


def no_plan(ref: containers.ProfileRef) -> None:
    os.unlink(runplan.plan_file(ref.profile_id))


@pytest.mark.parametrize(
    "spoil",
    [
        "revision",
        "code",
        "host",
        "garbage",
        "foreign flag",
        "privileged",
        "host network",
        "no cap-drop",
        "extra mount",
        "writable mount",
        "no plan",
        "removed",
        "swapped mount",
        "empty log",
        "torn log",
    ],
)
def test_a_plan_is_used_only_when_nothing_it_came_from_changed(
    spoil: str,
    applied: containers.ProfileRef,
    fake_podman: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = Path(admin_log())
    if spoil == "revision":
        stale_revision(applied)
    elif spoil == "code":
        stale_code(monkeypatch)
    elif spoil == "host":
        stale_host(monkeypatch)
    elif spoil == "garbage":
        garbage_plan(applied)
    elif spoil == "foreign flag":
        foreign_flag(applied)
    elif spoil in ("privileged", "host network", "no cap-drop", "extra mount", "writable mount"):
        edited_plan(applied, spoil)
    elif spoil == "no plan":
        no_plan(applied)
    elif spoil == "removed":
        store.remove("fast")  # its revision and plan stay; the name points nowhere
    elif spoil == "swapped mount":
        # The plan is current, but its mount source is now a symlink to ~/.ssh.
        home = Path(os.environ["HOME"])
        (home / ".ssh").mkdir(exist_ok=True)
        project = Path(applied.profile.mounts[0].source)
        project.rmdir()
        project.symlink_to(home / ".ssh")
    elif spoil == "empty log":
        log.write_bytes(b"")  # a first record names its log: the full append's job
    elif spoil == "torn log":
        with open(log, "ab") as f:
            f.write(b'{"data":{"half a rec')
    before = log.read_bytes()
    assert fastrun.run(fields(), not_announced) is None
    assert log.read_bytes() == before  # nothing recorded: the full path does it all
    assert calls(fake_podman) == []
    assert not (containers_dir() / "agent-1").exists()


@pytest.mark.parametrize(
    "change",
    [
        {"tty": True, "interactive": True},
        {"detach": True},
        {"rm": False},
        {"profile": None},
        {"profile": "../fast"},
        {"name": "-bad"},
        {"image": "--privileged"},
    ],
)
def test_other_requests_go_the_full_path_untouched(
    change: dict[str, Any], applied: containers.ProfileRef, fake_podman: Path
) -> None:
    before = Path(admin_log()).read_bytes()
    assert fastrun.run(fields(**change), not_announced) is None
    assert Path(admin_log()).read_bytes() == before
    assert calls(fake_podman) == []


def test_a_guarded_fast_run_starts_the_full_paths_argv_and_fails_closed(
    tmp_path: Path, fake_podman: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an allowlist the plan also holds the guard's policy; the fast path writes the
    guard's files, launches it and gives podman the hook, exactly as the full path would. This
    stand-in podman writes the id file but runs no hook: the run must fail and leave nothing,
    not even the guard."""
    path = tmp_path / "net.yml"
    path.write_text(
        "version: 1\nname: net\nnetwork:\n  egress_dns_allowlist: [crates.io]\n"
        "  upstream_dns: ['127.0.0.1:5353']\n"
    )
    res = store.apply(path)
    ref = containers.profile_by_id(res.profile_id)
    containers.save_plan(ref)
    from linpodx.egress import guard, launch

    plan = json.loads(Path(runplan.plan_file(res.profile_id)).read_text())
    assert plan["guarded"] is True and plan["egress_policy"] == guard.policy_doc(ref)
    monkeypatch.setenv("FAKE_PODMAN_RC", "125")
    monkeypatch.setattr(
        containers, "run_foreground", lambda *a: pytest.fail("the full path ran")
    )
    with pytest.raises(Exception) as err:
        fastrun.run(fields(profile="net", command=("true",)), not_announced)
    assert "did not hand over this container's state" in str(err.value)
    [argv] = [c for c in calls(fake_podman) if "run" in c[:2]]
    hooks, run_argv = argv[0], argv[1:]
    assert hooks == f"--hooks-dir={launch.egress_dir('agent-1')}/hooks"
    cidfile = run_argv[1].removeprefix("--cidfile=")
    req = request(profile="net", command=("true",))
    resolv = f"{launch.egress_dir('agent-1')}/resolv.conf"
    spec = containers.make_spec(req, ref, resolv_conf=resolv)
    assert run_argv == list(argv_mod.build_run_argv(spec, cidfile))
    run, failed = admin_records()[-2:]
    assert run["type"] == "container.run" and run["data"] == containers.plan.run_record(spec, ref)
    assert failed["type"] == "container.run.failed"
    assert failed["data"]["name"] == "agent-1" and failed["data"]["step"] == "egress_guard"
    assert not (containers_dir() / "agent-1").exists()
    assert launch._launched == {}  # the guard's control socket is closed: it ends by itself


def test_a_plan_whose_egress_policy_was_edited_is_not_used(tmp_path: Path) -> None:
    """The guard of a fast run gets the plan's policy: a plan whose allowlist, upstream or
    private-answers switch is not the revision's is no plan at all."""
    path = tmp_path / "net.yml"
    path.write_text(
        "version: 1\nname: net\nnetwork:\n  egress_dns_allowlist: [crates.io]\n"
        "  upstream_dns: ['127.0.0.1:5353']\n"
    )
    res = store.apply(path)
    containers.save_plan(containers.profile_by_id(res.profile_id))
    where = Path(runplan.plan_file(res.profile_id))
    good = where.read_text()
    assert runplan.load("net") is not None
    for key, value in (
        ("allowlist", ["crates.io", "exfil.example"]),
        ("upstream_dns", ["192.0.2.53"]),
        ("allow_private_answers", True),
    ):
        doc = json.loads(good)
        doc["egress_policy"][key] = value
        where.write_text(json.dumps(doc))
        assert runplan.load("net") is None, key
    doc = json.loads(good)
    doc["guarded"], doc["egress_policy"] = False, None  # a run with no guard at all
    where.write_text(json.dumps(doc))
    assert runplan.load("net") is None


def test_a_full_run_writes_the_plan_the_next_run_uses(
    applied: containers.ProfileRef, fake_podman: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    no_plan(applied)
    req = request()
    assert containers.run_foreground(req, lambda info, spec: None) == 0
    assert os.path.exists(runplan.plan_file(applied.profile_id))
    took: list[str] = []
    real = containers.run_started
    monkeypatch.setattr(
        containers, "run_started", lambda *a, **k: took.append("fast") or real(*a, **k)
    )
    assert fastrun.run(fields(), lambda info, spec: None) == 0
    assert took == ["fast"]
    assert calls(fake_podman)[0] == calls(fake_podman)[1][:1] + calls(fake_podman)[0][1:]


def test_podman_that_cannot_start_is_an_error_and_leaves_nothing(
    applied: containers.ProfileRef, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "podman"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    monkeypatch.setattr(proc, "which", lambda program: str(broken))
    with pytest.raises(Exception) as err:
        fastrun.run(fields(), not_announced)
    assert "podman run could not be started" in str(err.value)
    # Recorded, then failed, and the failure recorded too: as a full run.
    run, failed = admin_records()[-2:]
    assert (run["type"], failed["type"]) == ("container.run", "container.run.failed")
    assert "podman run could not be started" in failed["data"].pop("reason")
    assert failed["data"] == {
        "name": "agent-1", "step": "podman_run", "error": "EngineError",
        "container": "not_created",
    }  # fmt: skip
    assert not (containers_dir() / "agent-1").exists()


def test_append_simple_chains_like_append(tmp_path: Path) -> None:
    from linpodx.audit.chain import Chain, verify_file

    path = tmp_path / "a.jsonl"
    assert writer.append_simple(str(path), "test.event", {"i": 0}) is False  # no log yet
    chain = Chain(path)
    chain.append("test.event", {"i": 0})
    assert writer.append_simple(str(path), "test.event", {"i": 1, "s": "é"}) is True
    chain.append("test.event", {"i": 2})
    report = verify_file(path)
    assert report.ok and report.events == 3


def test_digest_without_hashlib_is_hashlibs_digest() -> None:
    import hashlib

    from linpodx import digest

    data = b"linpodx" * 1000
    if digest._builtin is not None:
        assert digest._builtin(data).hexdigest() == hashlib.sha256(data).hexdigest()
    assert digest.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()


def test_imports_yield_in_their_own_thread_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from linpodx import yielding

    (tmp_path / "lpx_probe_mod.py").write_text(
        "import os, threading\n"
        "NICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
        "THREAD = threading.get_native_id()\n"
    )
    (tmp_path / "lpx_broken_mod.py").write_text("raise ValueError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    [mod] = yielding.import_yielding(("lpx_probe_mod",))
    assert mod.THREAD != threading.get_native_id()
    assert mod.NICE == min(19, mine + yielding.NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # ours unchanged
    with pytest.raises(ValueError, match="broken on purpose"):
        yielding.import_yielding(("lpx_broken_mod",))


def test_the_full_path_refuses_a_mount_source_that_is_no_longer_fine(
    applied: containers.ProfileRef,
) -> None:
    from linpodx.errors import InvalidInput

    home = Path(os.environ["HOME"])
    (home / ".ssh").mkdir(exist_ok=True)
    project = Path(applied.profile.mounts[0].source)
    project.rmdir()
    project.symlink_to(home / ".ssh")
    with pytest.raises(InvalidInput, match="sensitive path") as err:
        containers.make_spec(request(), applied)
    assert err.value.hint and "re-apply" in err.value.hint
    project.unlink()  # gone altogether: refused too
    with pytest.raises(InvalidInput, match="does not exist"):
        containers.make_spec(request(), applied)


def test_held_signals_are_passed_on_and_a_container_that_ignores_them_is_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`spawn.hold_signals`: SIGTERM/SIGHUP go to `send` (podman) instead of ending linpodx;
    if the wait is still on after the grace period, `stop` runs once; restoring the handlers
    ends the timer, and a hold that saw no signal never stops anything."""
    import signal
    import threading


    monkeypatch.setattr(spawn, "STOP_GRACE_SECONDS", 0.2)
    sent: list[int] = []
    stopped = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    held = spawn.hold_signals(sent.append, stopped.set)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGHUP)
        assert stopped.wait(10)
    finally:
        spawn.restore_signals(held)
    assert sent == [signal.SIGTERM, signal.SIGHUP]
    assert signal.getsignal(signal.SIGTERM) == before

    quiet = threading.Event()
    held = spawn.hold_signals(sent.append, quiet.set)
    spawn.restore_signals(held)
    assert not quiet.wait(0.5)
