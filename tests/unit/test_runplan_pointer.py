"""The fast run path's read of a profile's pointer (`runplan.load`) agrees with the store's
(`store.get`, what a full `linpodx run --profile NAME` uses): every pointer the store refuses,
the fast path refuses too (returns None, so the full path runs and says what is wrong), and
neither hangs on a FIFO or follows a link."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from linpodx import containers, paths
from linpodx.errors import EXIT_INVALID, EXIT_NOT_FOUND, EXIT_TAMPERED, LinpodxError
from linpodx.fastpath import plan as runplan
from linpodx.profile import store


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@dataclass
class Store:
    """Two applies of `fast` (revisions 1 and 2, a plan for 2) and one of `other`."""

    first: store.ApplyResult
    second: store.ApplyResult
    other: store.ApplyResult

    @property
    def pointer(self) -> Path:
        return paths.profiles_dir() / "names" / "fast.json"

    def doc(self) -> dict[str, Any]:
        return dict(json.loads(self.pointer.read_text()))

    def write(self, doc: Any) -> None:
        self.pointer.write_text(json.dumps(doc))

    def edit(self, **changes: Any) -> None:
        self.write({**self.doc(), **changes})

    def revision(self, profile_id: str) -> Path:
        return Path(runplan.revision_file(profile_id))


@pytest.fixture
def st(tmp_path: Path) -> Store:
    f = tmp_path / "fast.yml"
    f.write_text("name: fast\nenv: {LANG: C.UTF-8}\n", encoding="utf-8")
    first = store.apply(f)
    f.write_text("name: fast\nenv: {LANG: C.UTF-8}\ndescription: two\n", encoding="utf-8")
    second = store.apply(f)
    o = tmp_path / "other.yml"
    o.write_text("name: other\n", encoding="utf-8")
    other = store.apply(o)
    containers.save_plan(containers.profile_by_id(second.profile_id))
    return Store(first, second, other)


def full_path(name: str = "fast") -> int | None:
    """The exit code the full path's read of the profile ends in; None if it would run it."""
    try:
        store.get(name)
    except LinpodxError as exc:
        return exc.exit_code
    return None


def test_an_intact_pointer_runs_on_both_paths(st: Store) -> None:
    assert full_path() is None
    plan = runplan.load("fast")
    assert plan is not None and plan.profile_id == st.second.profile_id


def _link_to_a_copy(path: Path) -> None:
    copy = path.with_name(path.name + ".copy")
    copy.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(copy)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


Damage = Callable[[Store], None]
DAMAGE: dict[str, tuple[Damage, int]] = {
    "not json": (lambda s: s.pointer.write_text('{"name": "fast", '), EXIT_TAMPERED),
    "not utf-8": (lambda s: s.pointer.write_bytes(b'{"name": "\xff"}'), EXIT_TAMPERED),
    "a json list": (lambda s: s.write([s.doc()]), EXIT_TAMPERED),
    "unknown key": (lambda s: s.edit(extra=1), EXIT_TAMPERED),
    "no name": (lambda s: s.write({k: v for k, v in s.doc().items() if k != "name"}),
                EXIT_TAMPERED),
    "another name": (lambda s: s.edit(name="other"), EXIT_TAMPERED),
    "no last_revision": (
        lambda s: s.write({k: v for k, v in s.doc().items() if k != "last_revision"}),
        EXIT_TAMPERED,
    ),
    "last_revision a string": (lambda s: s.edit(last_revision="2"), EXIT_TAMPERED),
    "last_revision a bool": (lambda s: s.edit(last_revision=True), EXIT_TAMPERED),
    "last_revision zero": (lambda s: s.edit(last_revision=0), EXIT_TAMPERED),
    "last_revision below current's": (lambda s: s.edit(last_revision=1), EXIT_TAMPERED),
    "removed_at not a time": (lambda s: s.edit(removed_at=5), EXIT_TAMPERED),
    "pending not an id": (lambda s: s.edit(pending={"profile_id": "x", "revision": 3}),
                          EXIT_TAMPERED),
    "pending number used": (
        lambda s: s.edit(pending={"profile_id": s.first.profile_id, "revision": 2}),
        EXIT_TAMPERED,
    ),
    "current not an id": (lambda s: s.edit(current="../../etc/passwd"), EXIT_TAMPERED),
    "current a number": (lambda s: s.edit(current=7), EXIT_TAMPERED),
    "current missing": (lambda s: s.edit(current="prof_01ARZ3NDEKTSV4RRFFQ69G5FAV"),
                        EXIT_TAMPERED),
    "current another profile's": (lambda s: s.edit(current=s.other.profile_id), EXIT_TAMPERED),
    "removal under way": (
        lambda s: s.edit(removing={"profile_id": s.second.profile_id, "revision": 2}),
        EXIT_TAMPERED,
    ),
    "removal of another revision": (
        lambda s: s.edit(removing={"profile_id": s.first.profile_id, "revision": 1}),
        EXIT_TAMPERED,
    ),
    "removal with pending": (
        lambda s: s.edit(
            removing={"profile_id": s.second.profile_id, "revision": 2},
            pending={"profile_id": s.first.profile_id, "revision": 3},
        ),
        EXIT_TAMPERED,
    ),
    "removed": (lambda s: s.edit(current=None), EXIT_NOT_FOUND),
    "no pointer": (lambda s: s.pointer.unlink(), EXIT_NOT_FOUND),
    "pointer a link": (lambda s: _link_to_a_copy(s.pointer), EXIT_INVALID),
    "pointer a fifo": (lambda s: _fifo(s.pointer), EXIT_INVALID),
    "pointer a directory": (lambda s: _dir(s.pointer), EXIT_INVALID),
    "revision a link": (lambda s: _link_to_a_copy(s.revision(s.second.profile_id)),
                        EXIT_INVALID),
    "revision a fifo": (lambda s: _fifo(s.revision(s.second.profile_id)), EXIT_INVALID),
    "revision not json": (lambda s: s.revision(s.second.profile_id).write_text("{"),
                          EXIT_TAMPERED),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_pointer_the_store_refuses_is_refused_by_the_fast_path_too(
    st: Store, case: str, watchdog: None
) -> None:
    damage, code = DAMAGE[case]
    damage(st)
    assert full_path() == code
    assert runplan.load("fast") is None
    # The damage is the pointer's (or its revision's) alone: the other profile still runs.
    assert full_path("other") is None


def test_a_plan_that_is_not_a_regular_file_is_not_used(st: Store, watchdog: None) -> None:
    """A FIFO in the plan's place must not hang `linpodx run`; a link is not a file linpodx
    wrote. Either way: no plan, the full path runs."""
    plan = Path(runplan.plan_file(st.second.profile_id))
    _link_to_a_copy(plan)
    assert runplan.load("fast") is None
    _fifo(plan)
    assert runplan.load("fast") is None


def test_a_plan_is_not_used_for_another_revision_number_or_hash(st: Store) -> None:
    """The plan names the revision and audit hash the container.run record gets: they must be
    the revision file's own."""
    path = Path(runplan.plan_file(st.second.profile_id))
    good = json.loads(path.read_text())
    for change in ({"revision": 1}, {"audit_hash": st.first.audit_hash}):
        path.write_text(json.dumps({**good, **change}))
        assert runplan.load("fast") is None, change
    path.write_text(json.dumps(good))
    assert runplan.load("fast") is not None
