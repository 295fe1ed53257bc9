"""Profile store: revisions, audit-first applies, unchanged applies, removal, file modes,
concurrent appliers, and the committed configuration reference."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from linpodx import paths
from linpodx.audit.chain import admin_chain, read_records
from linpodx.errors import AuditError, ChainBroken, NotFound, ProfileError
from linpodx.ids import is_id
from linpodx.profile import reference, store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


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
    assert set(summary) == {"name", "revision", "profile_id", "applied_at", "audit_hash"}


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

    r = store.apply(profile_file(tmp_path))
    path = paths.profiles_dir() / "revisions" / f"{r.profile_id}.json"
    doc = json.loads(path.read_text())
    assert doc["schema_digest"] == loader.schema_digest()
    passes: list[int] = []
    real = loader._validator

    def counted() -> Any:
        passes.append(1)
        return real()

    monkeypatch.setattr(loader, "_validator", counted)
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
    write_json = store._write_json

    def crashing_write(path: Path, doc: dict[str, Any]) -> None:
        if where == "revision file" and path.parent.name == "revisions":
            raise Crash
        if where == "pointer" and path.parent.name == "names" and "pending" not in doc:
            raise Crash
        write_json(path, doc)

    class CrashingChain:
        def append(self, type: str, data: Any) -> Any:
            raise Crash

    with monkeypatch.context() as m:
        m.setattr(store, "_write_json", crashing_write)
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

    again = store.apply(f)  # same file: the interrupted revision is finished, nothing new
    assert (again.changed, again.revision) == (False, 2)
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
    print("ready", flush=True)
    i = start
    while True:
        f.write_text(f"name: demo\\ndescription: round {i}\\n", encoding="utf-8")
        store.apply(f)
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
    assert len(applied) > 12  # the loops got somewhere before each kill
