"""`linpodx run` without typer (linpodx.cli.runcmd) and the one-`podman run` path.

What these pin: for every form the fast parser accepts, typer builds the very same request (so
the two can never disagree); every other form goes to typer; the fast path really leaves typer
and jsonschema unimported; and a foreground --rm run without a TTY is audited first, then one
`podman run`, and on failure removes only what it created.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from linpodx import containers
from linpodx.cli import main as cli_main
from linpodx.cli import runcmd
from linpodx.containers import runner
from linpodx.errors import EngineError
from linpodx.paths import audit_dir, containers_dir
from linpodx.podman import engine

ACCEPTED = [
    ["--image", "img:1"],
    ["--image=img:1", "--rm", "--", "true"],
    ["--rm", "--profile", "p", "--image", "img:1", "--name", "a-1", "--", "sh", "-c", "x y"],
    ["-it", "--image", "img:1", "--name=a-1"],
    ["-i", "-t", "-d", "--image", "img:1", "--", "--rm", "-x"],
    ["--detach", "--interactive", "--tty", "--image", "img:1", "--"],
    ["-dit", "--image", "img:1", "--profile=p", "--", "ls", "--", "-l"],
    ["--image", "img=1"],
    ["--rm", "--pull", "never", "--image", "img:1", "--", "true"],
    ["--pull=always", "--image", "img:1"],
]

REJECTED = [
    [],
    ["--help"],
    ["--image", "img:1", "--json", "-d"],
    ["--image", "img:1", "true"],  # a command before `--`: typer's rules decide
    ["--image", "img:1", "--image", "img:2"],
    ["--image"],
    ["--image="],
    ["--image", "-x"],
    ["--rm", "--rm", "--image", "img:1"],
    ["-ii", "--image", "img:1"],
    ["-x", "--image", "img:1"],
    ["--name", "a", "--", "true"],  # no image
    ["--im", "img:1"],
    ["-e", "K=V", "--image", "img:1"],  # the run's own variables: typer, then the full path
    ["--env-file", "f", "--image", "img:1"],
    ["--secret", "s", "--image", "img:1"],
    ["--pull", "never", "--pull", "never", "--image", "img:1"],
]


def typer_request(args: list[str], monkeypatch: pytest.MonkeyPatch) -> containers.RunRequest:
    seen: list[containers.RunRequest] = []

    def capture(req: containers.RunRequest, json_mode: bool = False) -> int:
        seen.append(req)
        return 0

    monkeypatch.setattr(runcmd, "execute", capture)
    app = cli_main.build_app("run")
    rc = app(args=["run", *args], prog_name="linpodx", standalone_mode=False)
    assert rc == 0 and len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("args", ACCEPTED, ids=" ".join)
def test_fast_parser_agrees_with_typer(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fast = runcmd.parse(args)
    assert fast is not None
    assert fast == typer_request(args, monkeypatch)


@pytest.mark.parametrize("args", REJECTED, ids=lambda a: " ".join(a) or "(nothing)")
def test_other_forms_go_to_typer(args: list[str]) -> None:
    assert runcmd.parse(args) is None


def test_rejected_forms_still_get_typers_answer(cli: Any) -> None:
    res = cli("run", "--image", "img:1", "--image", "img:2", "--json")
    assert res.exit_code == 2 and "error:" in res.stderr and "--detach" in res.stderr
    res = cli("run", "--help")
    assert res.exit_code == 0 and "--interactive" in res.stdout


def test_fast_path_imports_neither_typer_nor_jsonschema(tmp_path: Path) -> None:
    # Structural, not timed: the start-up cost of `run` is what these imports would add.
    script = """
import sys
from linpodx import containers
from linpodx.cli.main import main
seen = []
containers.run_foreground = lambda req, announce: seen.append(req) or 7
rc = main(["run", "--rm", "--image", "img:1", "--", "true"])
print(rc, len(seen), "typer" in sys.modules, "jsonschema" in sys.modules,
      "ruamel.yaml" in sys.modules)
"""
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert res.stdout.split() == ["7", "1", "False", "False", "False"]


# --- the one-call path, with a fake engine -------------------------------------------------


class FakeRun:
    """Stands in for starting and relaying `podman run`: writes the id file like podman, or
    fails first."""

    def __init__(self, *, create: bool = True, fail: EngineError | None = None, rc: int = 0):
        self.creates, self.fail, self.rc = create, fail, rc
        self.argv: tuple[str, ...] = ()
        self.removed: list[str] = []

    def install(self, mp: pytest.MonkeyPatch) -> None:
        """Be the podman the container service calls (`runner.use`, undone at the test's end)."""
        mp.setattr(runner, "_current", self)

    def podman_bin(self) -> str:
        return "/usr/bin/podman"

    def start_run(self, argv: Any) -> Any:
        return SimpleNamespace(argv=tuple(argv))

    def relay_announced(self, child: Any, cidfile: Path, on_created: Any) -> int:
        return self.run(child.argv[1:], cidfile, on_created)

    def remove_quietly(self, name: str) -> None:
        self.removed.append(name)

    def exists(self, name: str) -> bool:
        return False

    @staticmethod
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the one-call path made a second podman call")

    create = create_home = init = start = stop = stop_quietly = forbidden
    remove = inspect = container_pid = list_managed = run_inherited = stream_chunks = forbidden

    def run(self, argv: Any, cidfile: Path, on_created: Any) -> int:
        self.argv = tuple(argv)
        # Audited before podman is asked for anything.
        assert (audit_dir() / "admin.jsonl").read_text().count('"container.run"') == 1
        if self.creates:
            cidfile.write_text("ab" * 32)
        if self.fail is not None:
            raise self.fail
        on_created("ab" * 32, lambda: True)
        return self.rc


REQ = containers.RunRequest(image="localhost/img:1", name="agent-1", command=("true",), rm=True)


def test_rm_run_is_one_podman_run_announced_then_cleaned_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRun(rc=3)
    fake.install(monkeypatch)
    announced: list[tuple[str, bool]] = []

    def announce(info: containers.ContainerInfo, spec: Any) -> None:
        spec_doc = json.loads(containers.spec_path("agent-1").read_text())
        announced.append((info.container_id, spec_doc["container_id"] == info.container_id))

    assert containers.run_foreground(REQ, announce) == 3
    assert announced == [("ab" * 32, True)]  # the spec is saved before the id is announced
    assert fake.argv[0] == "run" and fake.argv[1].startswith("--cidfile=")
    assert "--rm" in fake.argv and "--name=agent-1" in fake.argv
    assert not (containers_dir() / "agent-1").exists()


@pytest.mark.parametrize("rc, removed", [(0, []), (1, ["ab" * 32]), (3, ["ab" * 32])])
def test_a_run_podman_ends_with_an_error_has_its_container_removed_by_id(
    monkeypatch: pytest.MonkeyPatch, rc: int, removed: list[str]
) -> None:
    """podman 4.3 interrupted between create and start exits 1 and leaves the --rm container:
    after any non-zero exit it is removed by the id podman wrote (--ignore: gone is fine)."""
    fake = FakeRun(rc=rc)
    fake.install(monkeypatch)
    assert containers.run_foreground(REQ, lambda info, spec: None) == rc
    assert fake.removed == removed
    assert not (containers_dir() / "agent-1").exists()


class FakeGuard:
    """Records the guard calls of a guarded one-call run; fails where told to."""

    def __init__(self, fail_attach: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_attach = fail_attach

    def prepare(self, name: str, stored: Any) -> Path:
        self.calls.append("prepare")
        return Path("/run/fake/resolv.conf")

    def hook_setup(self, name: str) -> Path:
        self.calls.append("hook_setup")
        return Path("/run/fake/hooks")

    def hook_pid(self, name: str, running: Any, container_id: str | None = None) -> int:
        self.calls.append("hook_pid")
        assert container_id == "ab" * 32  # the state must be this container's
        return 4242

    def hook_release(self, name: str, answer: str, running: Any) -> None:
        self.calls.append(f"release:{answer.split(':')[0]}")

    def attach(self, name: str, pid: int, stored: Any) -> None:
        self.calls.append(f"attach:{pid}")
        if self.fail_attach:
            raise EngineError("egress filter for agent-1 could not be set up: nft said no")

    def detach(self, name: str) -> None:
        self.calls.append("detach")

    @staticmethod
    def policy_doc(stored: Any) -> dict[str, Any]:
        return {"profile": stored.name}


def guarded(monkeypatch: pytest.MonkeyPatch, guard: FakeGuard) -> containers.ProfileRef:
    from linpodx.profile.model import Network, Profile

    monkeypatch.setattr(containers.bringup, "egress_guard", lambda: guard)
    prof = Profile(name="net", network=Network(egress_dns_allowlist=("crates.io",)))
    ref = containers.ProfileRef(prof, "net", "prof_X", 2, "cd" * 32)
    monkeypatch.setattr(containers.request, "resolve_profile", lambda name: ref)
    return ref


def test_guarded_rm_run_attaches_through_the_hook_before_announcing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guard = FakeGuard()
    guarded(monkeypatch, guard)
    fake = FakeRun()
    fake.install(monkeypatch)
    seen: list[list[str]] = []
    req = containers.RunRequest(image="localhost/img:1", name="agent-1", rm=True, profile="net")
    assert containers.run_foreground(req, lambda info, spec: seen.append(list(guard.calls))) == 0
    # Global flag first, then `run`; the resolv.conf the guard wrote is mounted.
    assert fake.argv[0] == "--hooks-dir=/run/fake/hooks" and fake.argv[1] == "run"
    assert any("/run/fake/resolv.conf" in a and "/etc/resolv.conf" in a for a in fake.argv)
    assert guard.calls == ["prepare", "hook_setup", "hook_pid", "attach:4242", "release:ready"]
    assert seen == [guard.calls]  # announced only once the guard was ready


def test_guarded_rm_run_fails_closed_and_removes_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    guard = FakeGuard(fail_attach=True)
    guarded(monkeypatch, guard)
    fake = FakeRun()
    fake.install(monkeypatch)
    announced: list[str] = []
    req = containers.RunRequest(image="localhost/img:1", name="agent-1", rm=True, profile="net")
    with pytest.raises(EngineError) as ei:
        containers.run_foreground(req, lambda info, spec: announced.append(info.name))
    assert announced == []
    assert "release:not started" in guard.calls  # the hook is told: the command never starts
    assert fake.removed == ["agent-1"] and "detach" in guard.calls
    assert ei.value.hint and "removed again" in ei.value.hint
    assert not (containers_dir() / "agent-1").exists()


@pytest.mark.parametrize(
    "req",
    [
        containers.RunRequest(image="localhost/img:1", name="a", rm=False),
        containers.RunRequest(
            image="localhost/img:1", name="a", rm=True, interactive=True, tty=True
        ),
    ],
)
def test_other_foreground_runs_keep_create_then_start(req: containers.RunRequest) -> None:
    ref = containers.builtin_ref()
    assert not containers.one_call(containers.make_spec(req, ref))


def test_podman_refusing_before_create_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The name belongs to another container with a spec of its own: both stay as they were.
    other = containers_dir() / "agent-1"
    other.mkdir(parents=True)
    (other / "spec.json").write_text("{}")
    fake = FakeRun(create=False, fail=EngineError("podman run failed (exit 125)"))
    fake.install(monkeypatch)
    with pytest.raises(EngineError):
        containers.run_foreground(REQ, lambda info, spec: None)
    assert fake.removed == []
    assert sorted(p.name for p in other.iterdir()) == ["spec.json"]


def test_failure_after_create_removes_the_container(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRun()
    fake.install(monkeypatch)

    def announce(info: containers.ContainerInfo, spec: Any) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        containers.run_foreground(REQ, announce)
    assert fake.removed == ["agent-1"]
    assert not (containers_dir() / "agent-1").exists()


@pytest.mark.parametrize(("rc", "ran"), [(0, True), (3, True), (125, False)])
def test_podman_that_ran_the_container_without_writing_its_id_is_no_hang(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], watchdog: None, rc: int, ran: bool
) -> None:
    """podman 4.3 runs the container even when it cannot write the id file (a full disk).
    The container's output waited for a release that never came and linpodx hung for good,
    holding the name's lock. Now the output is passed on and the error says the container
    ran; a podman that printed nothing and failed is the plain "podman run failed"."""

    code = "import sys; sys.stderr.write('write cid: no space left on device\\n')\n"
    if ran:
        code += "print('hello from the container', flush=True)\n"
    code += f"sys.exit({rc})"
    child = engine.start_run([sys.executable, "-c", code])
    with pytest.raises(EngineError) as ei:  # (the watchdog fails a hang after 60 s)
        engine.relay_announced(child, tmp_path / "never.cid", lambda cid, running: None)
    err = ei.value
    if ran:
        assert err.message.startswith("podman ran the container but did not write its id")
        assert "hello from the container" in capfd.readouterr().out
    else:
        assert err.message == f"podman run failed (exit {rc})"
    assert "no space left on device" in (err.stderr or "")
