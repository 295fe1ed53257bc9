"""Profile store: revisions, audit-first applies, unchanged applies, removal, file modes,
concurrent appliers, and the committed configuration reference."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from linpodx import paths
from linpodx.audit.chain import admin_chain, read_records
from linpodx.errors import AuditError, ChainBroken, InvalidInput, NotFound, ProfileError
from linpodx.ids import is_id
from linpodx.profile import reference, store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)



def rm_killed_after_its_record(monkeypatch: pytest.MonkeyPatch, rm: Callable[[], object]) -> None:
    """Run `rm` (a `sandbox rm` of some profile) and kill it, in effect, between its
    `profile.rm` record and its last step (`put_recorded` raises what no handler catches)."""

    class Killed(BaseException):
        pass

    def killed(*_a: object, **_k: object) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(store._Staged, "put_recorded", killed)
        with pytest.raises(Killed):
            rm()

def profile_file(tmp_path: Path, body: str = "", name: str = "demo", fname: str = "p.yml") -> Path:
    f = tmp_path / fname
    f.write_text(f"name: {name}\n{body}", encoding="utf-8")
    return f


def store_files() -> list[Path]:
    base = paths.profiles_dir()
    return sorted(p for p in base.rglob("*") if p.is_file()) if base.exists() else []


class BrokenChain:
    """An admin chain that refuses every record (a full disk)."""

    def append(self, type: str, data: Any) -> Any:
        raise AuditError("could not record to the audit log: disk full")


def test_apply_stores_a_revision_audited_first(tmp_path: Path) -> None:
    f = profile_file(tmp_path, "network: {egress_dns_allowlist: [crates.io]}\n")
    r = store.apply(f)
    assert r.changed is True
    assert r.revision == 1
    assert is_id(r.profile_id, "prof")
    records = read_records(admin_chain().path)
    assert [rec.type for rec in records] == ["profile.apply"]
    rec = records[0]
    assert rec.hash == r.audit_hash
    assert rec.data == {
        "name": "demo",
        "profile_id": r.profile_id,
        "revision": 1,
        "digest": r.digest,
        "source": str(f),
    }
    sp = store.get("demo")
    assert (sp.profile_id, sp.revision, sp.audit_hash) == (r.profile_id, 1, r.audit_hash)
    assert sp.profile.network.egress_dns_allowlist == ("crates.io",)
    assert sp.current is True


def test_unchanged_apply_writes_and_audits_nothing(tmp_path: Path) -> None:
    f = profile_file(tmp_path)
    first = store.apply(f)
    before = {p: p.read_bytes() for p in store_files()}
    chain_before = admin_chain().path.read_bytes()
    # Same content, different formatting and comments: same normalized profile.
    f.write_text("# comment\nname:   demo\naudit: {hash_chain: true}\n", encoding="utf-8")
    again = store.apply(f)
    assert again.changed is False
    assert (again.profile_id, again.revision, again.audit_hash) == (
        first.profile_id,
        first.revision,
        first.audit_hash,
    )
    assert {p: p.read_bytes() for p in store_files()} == before
    assert admin_chain().path.read_bytes() == chain_before


def test_changed_apply_makes_revision_two_and_keeps_one(tmp_path: Path) -> None:
    f = profile_file(tmp_path)
    one = store.apply(f)
    f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    two = store.apply(f)
    assert two.changed is True
    assert two.revision == 2
    assert two.profile_id != one.profile_id
    assert two.audit_hash != one.audit_hash
    assert store.get("demo").profile_id == two.profile_id
    old = store.get_by_id(one.profile_id)
    assert old.revision == 1 and old.current is False
    assert old.profile.description == ""
    assert [s.revision for s in store.history("demo")] == [1, 2]


def test_failed_audit_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_admin_chain", BrokenChain)
    with pytest.raises(AuditError):
        store.apply(profile_file(tmp_path))
    assert [p for p in store_files() if p.name != ".lock"] == []
    with pytest.raises(NotFound):
        store.get("demo")


def test_refused_profile_stores_nothing(tmp_path: Path) -> None:
    with pytest.raises(ProfileError):
        store.apply(profile_file(tmp_path, "audit: {hash_chain: false}\n"))
    assert store_files() == []
    assert not admin_chain().path.exists()


def test_remove_is_audited_and_keeps_history(tmp_path: Path) -> None:
    r = store.apply(profile_file(tmp_path))
    rm = store.remove("demo")
    assert rm.profile_id == r.profile_id
    records = read_records(admin_chain().path)
    assert [rec.type for rec in records] == ["profile.apply", "profile.rm"]
    assert records[1].hash == rm.audit_hash
    assert records[1].data == {"name": "demo", "profile_id": r.profile_id, "revision": 1}
    with pytest.raises(NotFound) as exc:
        store.get("demo")
    assert exc.value.message == "profile not found: demo"
    assert "linpodx sandbox apply --profile FILE" in (exc.value.hint or "")
    assert store.list_profiles() == []
    # Containers started under the removed revision can still resolve it.
    assert store.get_by_id(r.profile_id).current is False
    with pytest.raises(NotFound):
        store.remove("demo")
    # Re-applying continues the revision count with a new id.
    again = store.apply(tmp_path / "p.yml")
    assert again.changed is True and again.revision == 2 and again.profile_id != r.profile_id


def test_not_found_and_bad_names(tmp_path: Path) -> None:
    for name in ("missing", "../../etc/passwd", "", "A"):
        with pytest.raises(NotFound) as exc:
            store.get(name)
        assert exc.value.message.startswith("profile not found: ")
    for pid in ("prof_nope", "../x", "prof_01ARZ3NDEKTSV4RRFFQ69G5FAV"):
        with pytest.raises(NotFound):
            store.get_by_id(pid)


def test_list_profiles_sorted(tmp_path: Path) -> None:
    store.apply(profile_file(tmp_path, name="zeta", fname="z.yml"))
    store.apply(profile_file(tmp_path, name="alpha", fname="a.yml"))
    assert [s.name for s in store.list_profiles()] == ["alpha", "zeta"]
    summary = store.list_profiles()[0].summary()
    assert set(summary) == {
        "name", "revision", "profile_id", "applied_at", "audit_hash", "state", "hint"
    }  # fmt: skip
    assert (summary["state"], summary["hint"]) == ("applied", None)


def test_file_modes(tmp_path: Path) -> None:
    store.apply(profile_file(tmp_path))
    base = paths.profiles_dir()
    for d in [paths.state_dir(), base, base / "revisions", base / "names"]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = store_files()
    assert len(files) == 3  # .lock, one revision, one pointer
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_tampered_revision_is_detected(tmp_path: Path) -> None:
    r = store.apply(profile_file(tmp_path))
    path = paths.profiles_dir() / "revisions" / f"{r.profile_id}.json"
    doc = json.loads(path.read_text())
    doc["profile"]["network"]["egress_dns_allowlist"] = ["evil.example.com"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ChainBroken) as exc:
        store.get("demo")
    assert "does not match its digest" in exc.value.message
    path.write_text("{not json")
    with pytest.raises(ChainBroken):
        store.get_by_id(r.profile_id)


def test_schema_pass_is_repeated_only_for_another_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from linpodx.profile import loader
    from linpodx.profile.loader import schemapass

    r = store.apply(profile_file(tmp_path))
    path = paths.profiles_dir() / "revisions" / f"{r.profile_id}.json"
    doc = json.loads(path.read_text())
    assert doc["schema_digest"] == loader.schema_digest()
    passes: list[int] = []
    real = schemapass._validator

    def counted() -> Any:
        passes.append(1)
        return real()

    monkeypatch.setattr(schemapass, "_validator", counted)
    assert store.get("demo").profile_id == r.profile_id
    assert passes == []  # validated against this very schema at apply time
    for marker in ("sha256:" + "0" * 64, None):
        if marker is None:
            del doc["schema_digest"]  # a revision stored before the marker existed
        else:
            doc["schema_digest"] = marker
        path.write_text(json.dumps(doc))
        assert store.get("demo").profile_id == r.profile_id
    assert passes == [1, 1]


@pytest.mark.parametrize(
    "field, value",
    [("network", 5), ("mcp_policy", [5]), ("resources", "x"), ("cap_add", {"a": 1}),
     ("mounts", [{"source": 1}]), ("name", None)],
)  # fmt: skip
def test_wrong_shape_revision_is_refused_without_the_schema_pass(
    tmp_path: Path, field: str, value: Any
) -> None:
    # A hand-edited revision that still claims this schema's marker: no traceback, refused.
    r = store.apply(profile_file(tmp_path))
    path = paths.profiles_dir() / "revisions" / f"{r.profile_id}.json"
    doc = json.loads(path.read_text())
    doc["profile"][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ChainBroken):
        store.get("demo")


def test_concurrent_applies_do_not_corrupt_the_store(tmp_path: Path) -> None:
    # Two processes, each applying its own version of the same profile 15 times: every apply
    # changes the content, so every one is a new revision. Numbers must come out 1..30 with no
    # gap or duplicate, each audited once, the pointer on the last one.
    for who in ("a", "b"):
        (tmp_path / f"{who}.yml").write_text(f"name: shared\ndescription: {who}\n")
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from linpodx.profile import store
        me, other = Path(sys.argv[1]), Path(sys.argv[2])
        for i in range(15):
            # Alternate between the two files so consecutive applies differ.
            r = store.apply(me if i % 2 == 0 else other)
            print(r.revision, r.changed)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / x), str(tmp_path / y)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for x, y in (("a.yml", "b.yml"), ("b.yml", "a.yml"))
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    changed = [
        int(line.split()[0])
        for out, _ in outs
        for line in out.splitlines()
        if line.split()[1] == "True"
    ]
    assert sorted(changed) == list(range(1, len(changed) + 1))
    history = store.history("shared")
    assert [s.revision for s in history] == list(range(1, len(changed) + 1))
    applies = [r for r in read_records(admin_chain().path) if r.type == "profile.apply"]
    assert len(applies) == len(changed)
    assert {r.hash for r in applies} == {s.audit_hash for s in history}
    assert store.get("shared").revision == len(changed)
    assert admin_chain().verify().ok


def test_reference_doc_is_current() -> None:
    committed = (REPO / "docs" / "profile-reference.md").read_text(encoding="utf-8")
    assert committed == reference.generate(), (
        "docs/profile-reference.md is out of date; regenerate it with: "
        f"{reference.REGENERATE}"
    )


def test_reference_names_every_property() -> None:
    text = reference.generate()
    for key in ("`mounts[].read_only`", "`network.egress_dns_allowlist`", "`audit.hash_chain`",
                "`mcp_policy[].decision`", "`resources.nofile`", "`cap_add`", "`env`"):
        assert key in text
    assert "An empty list is allowed" in text


def test_readme_reference_is_current() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert reference.update_readme(readme) == readme, (
        "README.md's configuration reference is out of date; refresh it with: "
        "python -m linpodx.profile.reference --readme"
    )


class Crash(BaseException):
    """Stands for kill -9 at that point: nothing after it runs, nothing is cleaned up."""


def _crash_apply(f: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Apply `f`, stopping dead at `where`: before the audit record, before the revision file,
    or before the pointer is moved to the new revision."""
    rename = store._rename

    def crashing_rename(tmp: str, path: Path) -> None:
        if where == "revision file" and path.parent.name == "revisions":
            raise Crash
        moving = where == "pointer" and path.parent.name == "names"
        if moving and "pending" not in Path(tmp).read_text():
            raise Crash
        rename(tmp, path)

    class CrashingChain:
        def append(self, type: str, data: Any) -> Any:
            raise Crash

    with monkeypatch.context() as m:
        m.setattr(store, "_rename", crashing_rename)
        if where == "audit record":
            m.setattr(store, "_admin_chain", CrashingChain)
        with pytest.raises(Crash):
            store.apply(f)


def _types() -> list[str]:
    return [rec.type for rec in read_records(admin_chain().path)]


@pytest.mark.parametrize("where", ["audit record", "revision file"])
def test_an_apply_killed_before_its_revision_was_stored_is_closed_as_abandoned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    f = profile_file(tmp_path)
    one = store.apply(f)
    f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    _crash_apply(f, monkeypatch, where)
    assert store.get("demo").profile_id == one.profile_id  # runs keep using revision 1
    pending = json.loads((paths.profiles_dir() / "names" / "demo.json").read_text())["pending"]
    assert pending["revision"] == 2

    again = store.apply(f)  # the person runs it again
    assert again.changed and again.revision == 3  # number 2 is never given to another one
    assert again.profile_id != pending["profile_id"]
    records = read_records(admin_chain().path)
    abandoned = [r for r in records if r.type == "profile.apply.abandoned"]
    assert [r.data["profile_id"] for r in abandoned] == [pending["profile_id"]]
    assert abandoned[0].data["revision"] == 2
    applied = [r.data["revision"] for r in records if r.type == "profile.apply"]
    assert applied == ([1, 3] if where == "audit record" else [1, 2, 3])
    assert [s.revision for s in store.history("demo")] == [1, 3]
    assert "pending" not in json.loads((paths.profiles_dir() / "names" / "demo.json").read_text())


def _killed_after_storing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Revision 1 applied, then revision 2 stored but the kill came before the pointer moved."""
    f = profile_file(tmp_path)
    store.apply(f)
    f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    _crash_apply(f, monkeypatch, "pointer")
    return f


def test_an_apply_killed_after_storing_its_revision_is_finished_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _killed_after_storing(tmp_path, monkeypatch)
    assert store.get("demo").revision == 1
    records_before = _types()

    # Same file: the interrupted revision is finished, nothing new is recorded; it is a change
    # all the same (revision 2 became current now: running containers must hear of it).
    again = store.apply(f)
    assert (again.changed, again.revision) == (True, 2)
    assert _types() == records_before == ["profile.apply", "profile.apply"]
    assert store.get("demo").profile_id == again.profile_id


def test_remove_after_an_interrupted_apply_settles_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = _killed_after_storing(tmp_path, monkeypatch)
    removed = store.remove("demo")
    assert removed.revision == 2  # the stored revision was made current, then removed
    with pytest.raises(NotFound):
        store.get("demo")
    f.write_text("name: demo\ndescription: third\n", encoding="utf-8")
    assert store.apply(f).revision == 3


def test_a_new_name_whose_first_apply_could_not_be_audited_gets_no_pointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "_admin_chain", BrokenChain)
    with pytest.raises(AuditError):
        store.apply(profile_file(tmp_path))
    assert not (paths.profiles_dir() / "names" / "demo.json").exists()


def test_an_apply_refused_by_the_audit_log_leaves_no_pending_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = profile_file(tmp_path)
    store.apply(f)
    pointer = (paths.profiles_dir() / "names" / "demo.json").read_bytes()

    f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    with monkeypatch.context() as m:
        m.setattr(store, "_admin_chain", BrokenChain)
        with pytest.raises(AuditError):
            store.apply(f)
    assert json.loads((paths.profiles_dir() / "names" / "demo.json").read_bytes()) == json.loads(
        pointer
    )
    assert store.apply(f).revision == 2  # nothing was abandoned: the number is free
    assert "profile.apply.abandoned" not in _types()


APPLIER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from linpodx.profile import store
    f, start = Path(sys.argv[1]), int(sys.argv[2])
    i = start
    while True:
        f.write_text(f"name: demo\\ndescription: round {i}\\n", encoding="utf-8")
        store.apply(f)
        if i == start:  # one apply done: the kill lands in a later one, however slow it is
            print("ready", flush=True)
        i += 1
    """
)


def test_applies_killed_at_random_moments_never_reuse_a_revision_number(tmp_path: Path) -> None:
    """Real kill -9 of a process applying changed profiles in a loop, at random moments, then
    one more apply: every audited `profile.apply` has its own revision number, and each one
    was either stored or closed by a `profile.apply.abandoned` record; the chain verifies."""
    import random
    import signal
    import time

    rng = random.Random(11)  # noqa: S311 - kill timing, not cryptography
    for round_ in range(12):
        f = tmp_path / f"p{round_}.yml"
        proc = subprocess.Popen(
            [sys.executable, "-c", APPLIER, str(f), str(round_ * 1000)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.4))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    last = store.apply(profile_file(tmp_path, "description: the end\n"))

    records = read_records(admin_chain().path)
    applied = [
        (r.data["profile_id"], r.data["revision"]) for r in records if r.type == "profile.apply"
    ]
    abandoned = {
        (r.data["profile_id"], r.data["revision"])
        for r in records
        if r.type == "profile.apply.abandoned"
    }
    numbers = [rev for _, rev in applied]
    assert len(numbers) == len(set(numbers)), numbers  # never reused
    stored = {(s.profile_id, s.revision) for s in store.history("demo")}
    for entry in applied:
        assert entry in stored or entry in abandoned, entry
    assert max(numbers) == last.revision and store.get("demo").revision == last.revision
    assert len(applied) > 12  # each loop got through one apply before its kill


# --- validate and apply give one answer -----------------------------------------------------

AGREEMENT_CASES = {
    "float nofile": "resources: {nofile: 1e3}\n",
    "float pids_limit": "resources: {pids_limit: 1.6e1}\n",
    "float nproc": "resources: {nproc: 100.0}\n",
    "float approval timeout": "mcp: {approval_timeout_seconds: 1.0}\n",
    "float max_line_bytes": "mcp: {max_line_bytes: 2048.0}\n",
    "float version": "version: 1.0\n",
    "float description": "description: 1.5\n",
    "float env value": "env: {A: 1.5}\n",
    "cpus float": "resources: {cpus: 1.5}\n",
    "cpus integral float": "resources: {cpus: 2.0}\n",
    "cpus exponent": "resources: {cpus: 1e3}\n",
    "cpus string": "resources: {cpus: '0.25'}\n",
    "cpus too precise": "resources: {cpus: 1.0005}\n",
    "cpus too large": "resources: {cpus: 1e4}\n",
    "integers": "resources: {nofile: 1000, pids_limit: 0x10, nproc: 1_000}\n",
    "deep": "description: " + "[" * 500 + "]" * 500 + "\n",
    "plain": "description: fine\n",
}


@pytest.mark.parametrize("body", AGREEMENT_CASES.values(), ids=AGREEMENT_CASES.keys())
def test_validate_and_apply_agree(tmp_path: Path, body: str) -> None:
    """Whatever `sandbox validate` (the loader) says of a file, `sandbox apply` (the store) says
    too: both accept it, or both refuse it with the same FILE:LINE:COL problems and a hint."""
    from linpodx.profile.loader import load_file

    f = profile_file(tmp_path, body)
    try:
        validated: list[str] | None = None
        load_file(f)
    except ProfileError as exc:
        validated = list(exc.problems)
        assert exc.hint and exc.exit_code == 3
        assert all(p.startswith(f"{f}:") and p.split(":")[1].isdigit() for p in validated)
    try:
        applied: list[str] | None = None
        result = store.apply(f)
    except ProfileError as exc:
        applied = list(exc.problems)
    assert applied == validated
    if validated is None:
        assert store.get("demo").profile_id == result.profile_id
    else:
        assert store_files() == [] and not admin_chain().path.exists()


# --- a full disk never leaves half a change -------------------------------------------------


class DiskFull:
    """Makes the `n`th step of a store change that needs disk space fail as a full disk would:
    staging a file (`store._stage`) raises ENOSPC, the audit append raises AuditError (what the
    real chain raises for ENOSPC)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, n: int):
        # `monkeypatch` is a `monkeypatch.context()`: undoing the whole fixture would also
        # undo the isolated HOME and state dir.
        self.n, self.steps, self.failed = n, 0, False
        stage = store._stage
        chain = admin_chain()

        def step() -> None:
            self.steps += 1
            if self.steps == self.n:
                self.failed = True
                raise OSError(28, "No space left on device")

        def failing_stage(path: Path, data: bytes) -> str:
            step()
            return stage(path, data)

        class FailingChain:
            def append(self, type: str, data: Any) -> Any:
                try:
                    step()
                except OSError:
                    raise AuditError("could not record: disk full", "df -h") from None
                return chain.append(type, data)

        monkeypatch.setattr(store, "_stage", failing_stage)
        monkeypatch.setattr(store, "_admin_chain", FailingChain)


def _snapshot() -> tuple[dict[str, bytes], list[tuple[str, Any]]]:
    files = {str(p): p.read_bytes() for p in store_files() if p.name != ".lock"}
    records = [(r.type, r.data) for r in read_records(admin_chain().path)] if (
        admin_chain().path.exists()
    ) else []
    return files, records


def _interrupted_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Revision 1 applied; an apply of revision 2 killed before its revision was stored."""
    f = profile_file(tmp_path)
    store.apply(f)
    f.write_text("name: demo\ndescription: two\n", encoding="utf-8")
    _crash_apply(f, monkeypatch, "revision file")
    f.write_text("name: demo\ndescription: three\n", encoding="utf-8")
    return f


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("op", ["apply new", "apply change", "apply after a kill", "rm"])
def test_a_full_disk_at_any_step_changes_nothing_or_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str, n: int
) -> None:
    """Fail the nth space-needing step: either nothing changed and nothing was recorded, or the
    change and its record are both there. Never a record without its change (before: `rm` wrote
    `profile.rm`, then failed to move the pointer, and the profile stayed applied)."""
    f = profile_file(tmp_path)
    if op == "apply change":
        store.apply(f)
        f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    elif op == "apply after a kill":
        f = _interrupted_apply(tmp_path, monkeypatch)
    elif op == "rm":
        store.apply(f)
    before_files, before_records = _snapshot()
    before_current = None if op == "apply new" else store.get("demo").profile_id

    with monkeypatch.context() as m:
        disk = DiskFull(m, n)
        try:
            store.remove("demo") if op == "rm" else store.apply(f)
        except AuditError as exc:
            assert disk.failed and exc.exit_code == 6 and exc.hint
            assert "nothing was changed" in exc.hint or "could not record" in exc.message
    after_files, after_records = _snapshot()
    leftovers = [p for p in paths.profiles_dir().rglob("*.tmp")]
    assert leftovers == []

    if not disk.failed:  # fewer steps than n: the change went through
        return
    new_records = after_records[len(before_records):]
    assert after_records[: len(before_records)] == before_records
    if op == "rm":
        if new_records:
            assert [t for t, _ in new_records] == ["profile.rm"]
            with pytest.raises(NotFound):
                store.get("demo")
        else:
            assert after_files == before_files and store.get("demo").profile_id == before_current
        return
    applied = [d for t, d in new_records if t == "profile.apply"]
    if applied:  # recorded: then it is stored and current
        assert store.get("demo").profile_id == applied[0]["profile_id"]
    elif op == "apply after a kill" and new_records:
        # Only the interrupted apply was closed (its own record and pointer move, together).
        assert [t for t, _ in new_records] == ["profile.apply.abandoned"]
        assert "pending" not in json.loads((paths.profiles_dir() / "names/demo.json").read_text())
        assert store.get("demo").profile_id == before_current
    else:
        assert new_records == [] and after_files == before_files
        if op == "apply new":
            with pytest.raises(NotFound):
                store.get("demo")
    # And the next try, with space again, applies it under a number never used before.
    again = store.apply(f)
    numbers = [r.data["revision"] for r in read_records(admin_chain().path)
               if r.type in ("profile.apply", "profile.apply.abandoned")]
    assert numbers.count(again.revision) == 1 or again.changed is False


def test_a_full_disk_gives_a_clean_error_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any
) -> None:
    """Before: `sandbox apply` and `sandbox rm` on a full disk ended in `internal error` (70)."""
    f = profile_file(tmp_path)

    def full(path: Path, data: bytes) -> str:
        raise OSError(28, "No space left on device")

    for argv in (["sandbox", "apply", "--profile", str(f)], ["sandbox", "rm", "demo"]):
        if argv[1] == "rm":
            store.apply(f)
        records = _types() if admin_chain().path.exists() else []
        with monkeypatch.context() as m:
            m.setattr(store, "_stage", full)
            r = cli(*argv)
        assert r.exit_code == 6, r
        assert r.stdout == ""
        lines = r.stderr.splitlines()
        assert len(lines) == 2, lines
        assert lines[0].startswith("error: could not write linpodx's profile store")
        assert lines[0].endswith("No space left on device")
        assert lines[1].startswith("hint: ") and "nothing was changed" in lines[1]
        assert (_types() if admin_chain().path.exists() else []) == records
    assert store.get("demo").revision == 1  # still applied: the rm did not happen


# --- a damaged pointer is damage, and numbers are never given twice ---------------------------

DAMAGED_POINTERS = {
    "current only": {"current": 5},
    "no last revision": {"name": "demo", "current": "CURRENT"},
    "name only": {"name": "demo"},
    "other name": {"name": "other", "current": "CURRENT", "last_revision": 1},
    "missing revision": {"name": "demo", "current": "prof_01M8PKSGD01QMK9GRA8B9FTNB1",
                         "last_revision": 1},
    "last revision a string": {"name": "demo", "current": "CURRENT", "last_revision": "1"},
    "last revision too low": {"name": "demo", "current": "CURRENT", "last_revision": 0},
    "unknown key": {"name": "demo", "current": "CURRENT", "last_revision": 1, "x": 1},
    "bad pending": {"name": "demo", "current": "CURRENT", "last_revision": 1, "pending": 3},
    "pending reuses a number": {"name": "demo", "current": "CURRENT", "last_revision": 1,
                                "pending": {"profile_id": "prof_01M8PKSGD01QMK9GRA8B9FTNB1",
                                            "revision": 1}},
    "not an object": [],
}


@pytest.mark.parametrize("doc", DAMAGED_POINTERS.values(), ids=DAMAGED_POINTERS.keys())
def test_a_damaged_pointer_is_refused_and_its_hint_works(tmp_path: Path, doc: Any) -> None:
    """Before: `{"current": 5}` read as "not applied", so `show` said not found and `apply`
    stored a second revision 1 under a new id."""
    f = profile_file(tmp_path)
    one = store.apply(f)
    pointer = paths.profiles_dir() / "names" / "demo.json"
    text = json.dumps(doc).replace("CURRENT", one.profile_id)
    pointer.write_text(text, encoding="utf-8")
    records = _types()
    f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    for call in (lambda: store.get("demo"), lambda: store.apply(f), lambda: store.remove("demo"),
                 lambda: store.history("demo"), lambda: store.get_by_id(one.profile_id)):
        with pytest.raises(ChainBroken) as exc:
            call()
        assert exc.value.exit_code == 7
        assert exc.value.message.startswith(f"profile store file {pointer} is damaged")
    assert _types() == records  # nothing recorded
    assert pointer.read_text(encoding="utf-8") == text  # nor changed

    # The hint's way out: move it aside and apply again; the number goes on from 1.
    hint = exc.value.hint or ""
    assert f"mv {pointer} {pointer}.damaged" in hint
    pointer.rename(f"{pointer}.damaged")
    two = store.apply(f)
    assert (two.changed, two.revision) == (True, 2)
    assert [r.data["revision"] for r in read_records(admin_chain().path)] == [1, 2]


def test_numbers_used_only_in_the_audit_log_are_not_given_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Revision 2 was recorded, never stored (killed), and then the pointer was lost: the next
    apply is revision 3, not 2 again. A pointer restored from an old backup: the same."""
    f = profile_file(tmp_path)
    store.apply(f)
    backup = (paths.profiles_dir() / "names" / "demo.json").read_bytes()
    f.write_text("name: demo\ndescription: two\n", encoding="utf-8")
    _crash_apply(f, monkeypatch, "revision file")
    (paths.profiles_dir() / "names" / "demo.json").unlink()
    f.write_text("name: demo\ndescription: three\n", encoding="utf-8")
    assert store.apply(f).revision == 3

    (paths.profiles_dir() / "names" / "demo.json").write_bytes(backup)  # says last_revision 1
    f.write_text("name: demo\ndescription: four\n", encoding="utf-8")
    assert store.apply(f).revision == 4
    applied = [r.data["revision"] for r in read_records(admin_chain().path)
               if r.type == "profile.apply"]
    assert applied == [1, 2, 3, 4]


def test_an_admin_log_that_is_not_a_file_refuses_a_new_revision(
    tmp_path: Path, watchdog: None
) -> None:
    """A new revision's number must not repeat one in the audit log, so a log that cannot be
    read (here a FIFO, which a plain open would wait on forever) refuses the apply."""
    store.apply(profile_file(tmp_path))
    log = admin_chain().path
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(AuditError) as ei:
        store.apply(profile_file(tmp_path, "description: changed\n"))
    assert "could not read the audit log" in ei.value.message
    assert "not a regular file" in ei.value.message
    assert ei.value.hint and "linpodx audit verify" in ei.value.hint


def test_finishing_an_interrupted_apply_counts_as_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An apply that stopped after its record (here the pointer's final rename fails) is
    finished by running the same apply again, as its hint says. That re-run makes the new
    revision current, so it reports `changed` (the CLI then pushes the new allowlist to the
    running containers' guards; before, it said unchanged and they kept the old one)."""
    import errno

    f = profile_file(tmp_path)
    store.apply(f)
    f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    real = store._rename

    def no_space_for_the_last_step(tmp: str, path: str | Path) -> None:
        if "/names/" in str(path) and b"pending" not in Path(tmp).read_bytes():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tmp, path)

    with monkeypatch.context() as m:
        m.setattr(store, "_rename", no_space_for_the_last_step)
        with pytest.raises(AuditError):
            store.apply(f)
    assert store.get("demo").revision == 1
    again = store.apply(f)
    assert (again.revision, again.changed) == (2, True)
    assert store.get("demo").revision == 2
    third = store.apply(f)
    assert (third.revision, third.changed) == (2, False)


def test_a_fifo_in_the_store_never_blocks_an_apply(tmp_path: Path, watchdog: None) -> None:
    """A FIFO where a revision file or a pointer belongs: the store's reads never wait on it
    (they hold the store's lock, so every other apply would wait too)."""
    f = profile_file(tmp_path)
    store.apply(f)
    os.mkfifo(paths.profiles_dir() / "revisions" / "prof_x.json")
    f.write_text("name: demo\ndescription: changed\n", encoding="utf-8")
    assert store.apply(f).revision == 2
    other = profile_file(tmp_path, name="other", fname="o.yml")
    store.apply(other)
    pointer = paths.profiles_dir() / "names" / "other.json"
    pointer.unlink()
    os.mkfifo(pointer)
    with pytest.raises(InvalidInput) as ei:
        store.get("other")
    assert "not a regular file" in ei.value.message


def _pointer_doc(name: str = "demo") -> dict[str, Any]:
    return json.loads((paths.profiles_dir() / "names" / f"{name}.json").read_text())


def test_an_rm_killed_after_its_record_is_finished_by_the_next_rm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kill -9 between the `profile.rm` record and the pointer's rename: the log says removed,
    so the profile must not stay in use. It is refused until settled, and the next `rm`
    finishes the removal without recording it twice."""
    from linpodx.errors import EXIT_TAMPERED, LinpodxError
    from linpodx.fastpath import plan as runplan

    store.apply(profile_file(tmp_path))

    rm_killed_after_its_record(monkeypatch, lambda: store.remove("demo"))
    assert _types() == ["profile.apply", "profile.rm"]
    assert "removing" in _pointer_doc()
    with pytest.raises(LinpodxError) as ei:
        store.get("demo")
    assert ei.value.exit_code == EXIT_TAMPERED and "interrupted" in ei.value.message
    assert ei.value.hint and "linpodx sandbox rm demo" in ei.value.hint
    assert runplan.load("demo") is None  # the fast path does not run it either
    done = store.remove("demo")
    assert done.revision == 1 and done.audit_hash == read_records(admin_chain().path)[-1].hash
    assert _types() == ["profile.apply", "profile.rm"]
    with pytest.raises(NotFound):
        store.get("demo")


def test_list_shows_a_profile_whose_rm_was_interrupted_beside_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A marked pointer makes `get` refuse its profile; `list_profiles` (and so `sandbox list`
    and the admin log's cross-check of the store) must still see every profile, that one as
    `removing`."""
    store.apply(profile_file(tmp_path, name="alpha", fname="a.yml"))
    marked = store.apply(profile_file(tmp_path))
    store.apply(profile_file(tmp_path, name="zeta", fname="z.yml"))

    rm_killed_after_its_record(monkeypatch, lambda: store.remove("demo"))
    listed = store.list_profiles()
    assert [(s.name, s.state) for s in listed] == [
        ("alpha", "applied"), ("demo", "removing"), ("zeta", "applied")
    ]  # fmt: skip
    summary = listed[1].summary()
    assert summary["profile_id"] == marked.profile_id and summary["state"] == "removing"
    assert "linpodx sandbox rm demo" in summary["hint"]
    from linpodx import integrity

    notes = integrity.verify_admin().notes
    assert "3 profile revision(s) found in the admin chain" in notes, notes
    store.remove("demo")  # settles it: gone from the list
    assert [s.name for s in store.list_profiles()] == ["alpha", "zeta"]


def test_an_rm_killed_before_its_record_removed_nothing(tmp_path: Path) -> None:
    """kill -9 after the `removing` mark and before the record: nothing was removed. The next
    apply drops the mark and finds the profile as it was; the next rm removes it once."""
    f = profile_file(tmp_path)
    first = store.apply(f)
    doc = _pointer_doc()
    doc["removing"] = {"profile_id": first.profile_id, "revision": 1}
    (paths.profiles_dir() / "names" / "demo.json").write_text(json.dumps(doc))
    again = store.apply(f)
    assert (again.profile_id, again.changed) == (first.profile_id, False)
    assert "removing" not in _pointer_doc()
    assert store.get("demo").profile_id == first.profile_id
    store.remove("demo")
    assert _types() == ["profile.apply", "profile.rm"]


def test_a_failed_rm_record_leaves_the_profile_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.apply(profile_file(tmp_path))
    before = _pointer_doc()

    def refuse(*_a: object, **_k: object) -> None:
        raise AuditError("the audit log could not be written")

    with monkeypatch.context() as m:
        m.setattr(type(admin_chain()), "append", refuse)
        with pytest.raises(AuditError):
            store.remove("demo")
    assert _pointer_doc() == before
    assert store.get("demo").revision == 1
