"""A rollback keeps the newest egress policy the container had been given.

The defect: a container created under revision 21 of a profile (allowlist with allowed.test)
was given revision 72 by a re-apply (allowed.test taken away); `snapshot rollback` removed the
container's egress state with its guard, recreated it under revision 21, and its guard allowed
allowed.test again. Real files under the isolated state dir and the real guard code that writes
and removes them; only podman and the containers service's podman calls are faked (a container
here is a dict), and the fake's `create_and_start` / `start` write the creation revision's
policy exactly as `guard.prepare` does (`guard._write_policy`, which keeps a newer one).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from linpodx import proc
from linpodx.egress import guard
from linpodx.egress.state import EgressState
from linpodx.errors import LinpodxError
from linpodx.ids import new_ulid
from linpodx.paths import admin_log, containers_dir
from linpodx.proc import Result
from linpodx.snapshot import jobs, journal, names
from tests.faultinject import Inject
from tests.unit.snapshot_host import FakeHost, host_fixture  # noqa: F401 (a fixture)

NAME = "box"
PROFILE_ID_21 = "prof_01J0000000000000000000021"
PROFILE_ID_72 = "prof_01J0000000000000000000072"


def _ref(profile_id: str, revision: int, allowlist: list[str]) -> Any:
    network = SimpleNamespace(
        egress_dns_allowlist=tuple(allowlist), upstream_dns=("127.0.0.1:5353",),
        allow_private_answers=False, wildcard_budget=100, max_connections=512,
        max_new_connections_per_second=100, helper_max_files=4096, helper_max_memory_mib=1024,
    )
    return SimpleNamespace(
        name="agent", profile_id=profile_id, revision=revision, audit_hash="h" * 64,
        profile=SimpleNamespace(network=network, mounts=()),
    )


CREATED = _ref(PROFILE_ID_21, 21, ["allowed.test", "other.test"])
REAPPLIED = _ref(PROFILE_ID_72, 72, ["other.test"])
LABELS = {
    "linpodx.managed": "1", "linpodx.profile": "agent", "linpodx.profile_id": PROFILE_ID_21,
    "linpodx.revision": "21", "linpodx.audit_hash": "h" * 64,
}


def _policy(name: str = NAME) -> dict[str, Any] | None:
    p = EgressState(name).policy_file
    return json.loads(p.read_text()) if p.exists() else None


def _guard_up(name: str) -> None:
    """What a guard that became ready leaves: guard.json with the revision it read."""
    pol = _policy(name)
    assert pol is not None
    EgressState(name).guard_file.write_text(json.dumps(
        {"state": "ready", "guard_pid": 999_999_999, "policy_revision": pol["revision"]}))


@dataclass
class Podman:
    """The containers podman holds, by name; and what the fake service was asked to do."""

    by_name: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    next_id: int = 0xB

    def find(self, ref: str) -> dict[str, Any]:
        for n, c in self.by_name.items():
            if ref in (n, c["Id"]):
                return {**c, "Name": n}
        from linpodx.errors import NotFound

        raise NotFound(f"no such container {ref}")

    def add(self, name: str, running: bool, image: str = "base") -> dict[str, Any]:
        c = {"Id": f"{self.next_id:x}" * 64, "Config": {"Labels": dict(LABELS)},
             "State": {"Running": running}, "Mounts": [], "HostConfig": {},
             "ImageName": image}
        c["Id"] = c["Id"][:64]
        self.next_id += 1
        self.by_name[name] = c
        return c

    def run(self, argv: list[str], **_kw: object) -> Result:
        self.calls.append(" ".join(argv[:2]))
        if argv[:2] == ["podman", "rename"]:
            old = next(n for n, c in self.by_name.items() if c["Id"] == argv[2])
            self.by_name[argv[3]] = self.by_name.pop(old)
        elif argv[:2] == ["podman", "rm"]:
            for n, c in list(self.by_name.items()):
                if c["Id"] == argv[-1]:
                    del self.by_name[n]
        return Result(tuple(argv), 0, "", "")


@pytest.fixture
def podman(monkeypatch: pytest.MonkeyPatch, host: FakeHost) -> Podman:
    from linpodx import containers
    from linpodx.snapshot import rollback, workspace

    pm = Podman()
    spec_dir = containers_dir() / NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "spec.json").write_text('{"fake": "spec"}\n')
    man = {"image": names.image_ref(NAME, "s1"), "image_id": "a" * 64, "mounts": []}
    monkeypatch.setattr(rollback, "_verify_snapshot", lambda name, label: man)
    host.set(inspect_container=pm.find)
    monkeypatch.setattr(proc, "run", pm.run)  # what the engine verbs run
    monkeypatch.setattr(workspace, "other_containers", lambda own: [])
    monkeypatch.setattr(containers, "load_spec", lambda name: {"fake": "spec"})
    monkeypatch.setattr(containers, "profile_by_id",
                        lambda pid: {PROFILE_ID_21: CREATED, PROFILE_ID_72: REAPPLIED}[pid])
    monkeypatch.setattr(containers, "spec_from_record", lambda doc, ref, **kw: kw)

    def create_and_start(
        spec: dict[str, Any], ref: Any, *, start: bool = True, env: Any = None
    ) -> Any:
        pm.calls.append(f"create_and_start {ref.revision}")
        guard._write_policy(EgressState(spec["name"]), ref)  # what guard.prepare writes
        _guard_up(spec["name"])
        c = pm.add(spec["name"], running=True, image=spec["image"])
        return SimpleNamespace(container_id=c["Id"])

    def stop(name: str, timeout: int = 10) -> dict[str, Any]:
        pm.calls.append("stop")
        pm.by_name[name]["State"] = {"Running": False}
        return {}

    def start(name: str) -> Any:
        pm.calls.append("start")
        ref = containers.profile_by_id(pm.by_name[name]["Config"]["Labels"]["linpodx.profile_id"])
        guard._write_policy(EgressState(name), ref)  # `bring_up`'s guard.prepare
        _guard_up(name)
        pm.by_name[name]["State"] = {"Running": True}
        return None

    def remove(name: str, force: bool = False) -> dict[str, Any]:
        pm.calls.append("remove")
        del pm.by_name[name]
        guard.detach(name)
        containers.state.remove_spec(name)
        return {}

    for fn in (create_and_start, stop, start, remove):
        monkeypatch.setattr(containers, fn.__name__, fn)
    return pm


def _given_the_reapplied_policy(podman: Podman, *, running: bool) -> None:
    """Created under revision 21, then `sandbox apply` pushed revision 72 (force=True)."""
    podman.add(NAME, running=running)
    guard._write_policy(EgressState(NAME), CREATED)
    guard._write_policy(EgressState(NAME), REAPPLIED, force=True)
    if running:
        _guard_up(NAME)


def _admin(event_type: str) -> list[dict[str, Any]]:
    lines = Path(admin_log()).read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    return [r["data"] for r in recs if r["type"] == event_type]


@pytest.mark.parametrize("running", [True, False], ids=["running", "stopped"])
def test_rollback_keeps_the_reapplied_allowlist(podman: Podman, running: bool) -> None:
    from linpodx.snapshot import rollback

    _given_the_reapplied_policy(podman, running=running)
    before = podman.by_name[NAME]["Id"]
    out = rollback.rollback(NAME, "s1")
    assert out["rolled_back"] is True
    # Whole ids and a number, as `run --json` and `ps --json` give them.
    assert out["container_id"] == podman.by_name[NAME]["Id"] and out["previous_id"] == before
    assert out["revision"] == 21
    pol = _policy()
    assert pol is not None, "the recreated container has no egress policy at all"
    assert (pol["revision"], pol["allowlist"]) == (72, ["other.test"])
    assert podman.by_name[NAME]["State"]["Running"] is running
    # The audit trail says which revision the recreated container's guard enforces.
    assert _admin("snapshot.rollback")[-1]["egress_policy"]["revision"] == 72
    commit = _admin("snapshot.rollback.commit")[-1]["egress_policy"]
    assert commit == {"profile": "agent", "profile_id": PROFILE_ID_72, "revision": 72}
    assert not journal.exists(NAME)
    if not running:
        # The next `linpodx start` of the stopped one keeps it too.
        from linpodx import containers

        containers.start(NAME)
        assert _policy()["revision"] == 72  # type: ignore[index]


def test_an_undone_rollback_starts_the_original_with_the_reapplied_allowlist(
    podman: Podman,
) -> None:
    from linpodx.snapshot import rollback

    _given_the_reapplied_policy(podman, running=True)
    orig = podman.by_name[NAME]["Id"]
    with pytest.raises(LinpodxError, match="put back as they were"):
        rollback.rollback(NAME, "s1", faults=Inject("create"))
    assert podman.by_name[NAME]["Id"] == orig and "start" in podman.calls
    assert _policy()["revision"] == 72  # type: ignore[index]


@pytest.mark.parametrize("failing", ["inspect", "rename"])
def test_an_undo_that_cannot_rename_the_original_back_still_puts_the_policy_back(
    podman: Podman, monkeypatch: pytest.MonkeyPatch, failing: str, host: FakeHost
) -> None:
    """Undoing a rollback after its create step: removing the new container took the name's
    policy file away. If podman then fails to say where the original is, or to rename it
    back (an error, a timeout), the policy must still be put back, as the undo did before
    the saga: `sandbox apply` finds the containers it updates by that file (a re-apply
    before `snapshot recover` would otherwise pass this one by, and the recovery restart it
    on revision 72 with what the re-apply took away still allowed)."""
    from linpodx.errors import EngineError
    from linpodx.snapshot import rollback

    _given_the_reapplied_policy(podman, running=True)
    orig = podman.by_name[NAME]["Id"]

    def inspect(ref: str) -> dict[str, Any]:
        if ref == orig and failing == "inspect":  # only the undo looks it up by its id
            raise EngineError("podman container inspect failed", stderr="storage busy")
        return podman.find(ref)

    def run(argv: list[str], **kw: object) -> Result:
        if argv[:2] == ["podman", "rename"] and argv[3] == NAME and failing == "rename":
            raise EngineError("podman rename timed out after 120 s")
        return podman.run(argv, **kw)

    host.set(inspect_container=inspect)
    monkeypatch.setattr(proc, "run", run)
    with pytest.raises(LinpodxError):
        rollback.rollback(NAME, "s1", faults=Inject("create"))
    assert journal.exists(NAME)  # half undone: `snapshot recover` tries again
    pol = _policy()
    assert pol is not None, "the undo left the name without its egress policy"
    assert (pol["revision"], pol["allowlist"]) == (72, ["other.test"])
    assert guard._containers_of("agent") == [NAME]  # what a re-apply updates
    assert NAME not in podman.by_name  # not renamed back: the original is still aside


def test_a_killed_rollback_is_recovered_with_the_reapplied_allowlist(podman: Podman) -> None:
    """What a rollback killed at step create leaves when the new container's failed creation
    had already removed the name's state dir: the original stopped and renamed aside, no
    policy file. Only the journal still knows revision 72."""
    from linpodx.snapshot import rollback

    _given_the_reapplied_policy(podman, running=True)
    rb = new_ulid()
    aside = journal.aside_name(NAME, rb)
    orig = podman.by_name.pop(NAME)
    orig["State"] = {"Running": False}
    podman.by_name[aside] = orig
    guard.detach(NAME)
    assert _policy() is None
    pid, start = _dead_pid()
    jour = journal.new(
        rollback_id=rb, container=NAME, label="s1", image=names.image_ref(NAME, "s1"),
        orig_id=orig["Id"], aside=aside, was_running=True, spec=b'{"fake": "spec"}\n',
        mounts=[], egress_policy=guard.policy_doc(REAPPLIED),
    )
    journal.write(replace(jour, step="create", pid=pid, pid_start=start))
    out = rollback.recover(NAME)
    assert out["action"] == "undone"
    assert podman.by_name[NAME]["Id"] == orig["Id"] and "start" in podman.calls
    assert podman.by_name[NAME]["State"]["Running"] is True
    pol = _policy()
    assert pol is not None and (pol["revision"], pol["allowlist"]) == (72, ["other.test"])
    assert not journal.exists(NAME)


def test_a_damaged_policy_file_refuses_the_rollback_before_anything_changes(
    podman: Podman,
) -> None:
    from linpodx.snapshot import rollback

    _given_the_reapplied_policy(podman, running=True)
    EgressState(NAME).policy_file.write_text('{"profile": "agent"}')
    with pytest.raises(LinpodxError, match=r"egress policy of box .* is damaged"):
        rollback.rollback(NAME, "s1")
    assert podman.calls == [] and not journal.exists(NAME)


def test_a_journal_with_a_bad_egress_policy_is_damage(podman: Podman) -> None:
    from linpodx.errors import ChainBroken

    rb = new_ulid()
    j = journal.new(
        rollback_id=rb, container=NAME, label="s1", image=names.image_ref(NAME, "s1"),
        orig_id="c" * 64, aside=journal.aside_name(NAME, rb), was_running=True, spec=None,
        mounts=[], egress_policy=guard.policy_doc(REAPPLIED),
    )
    journal.write(j)
    assert journal.read(NAME) == j
    journal.write(replace(j, egress_policy={"profile": "agent"}))
    with pytest.raises(ChainBroken, match="egress policy"):
        journal.read(NAME)


def _dead_pid() -> tuple[int, int | None]:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pid, start = jobs.pid_info(child.pid)
    child.wait()
    return pid, start
