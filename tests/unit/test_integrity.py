"""`linpodx.integrity`: the audit ↔ profile store ↔ built-in profile checks, above both packages."""

from __future__ import annotations

import ast
from pathlib import Path

from linpodx import integrity
from linpodx.audit import verify as audit_verify
from linpodx.profile import store
from linpodx.profile.model import BUILTIN_ID, builtin_ref

AUDIT_DIR = Path(audit_verify.__file__).parent


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_audit_package_imports_nothing_above_it() -> None:
    """The audit package is below the profile store and the container service: it imports
    neither (not by string through importlib either); integrity wires them together."""
    for path in sorted(AUDIT_DIR.glob("*.py")):
        names = _imports(path)
        above = {
            n for n in names
            if n.startswith(("linpodx.profile", "linpodx.containers", "linpodx.integrity"))
        }  # fmt: skip
        assert above == set(), (path.name, above)
        assert "importlib" not in names, path.name


def test_the_builtin_profile_id_is_the_same_on_both_sides() -> None:
    assert audit_verify.BUILTIN_PROFILE_ID == BUILTIN_ID


def _apply(tmp_path: Path) -> store.StoredProfile:
    f = tmp_path / "p.yml"
    f.write_text("name: demo\n", encoding="utf-8")
    return store.apply(f)


def test_the_store_is_cross_checked_only_through_integrity(tmp_path: Path) -> None:
    _apply(tmp_path)
    alone = audit_verify.verify_admin()
    assert alone.ok
    assert "profile store not available: profile revisions not cross-checked" in alone.notes
    wired = integrity.verify_admin()
    assert wired.ok
    assert "1 profile revision(s) found in the admin chain" in wired.notes


def test_a_stored_revision_the_chain_lacks_is_a_problem(tmp_path: Path) -> None:
    sp = _apply(tmp_path)
    problems, _notes = integrity.CHECKS.store({})
    assert len(problems) == 1 and "is not a profile.apply record" in problems[0]
    found, said = integrity.CHECKS.revision(sp.profile_id, "0" * 64)
    assert found and "the session starts from" in found[0] and said == []
    found, said = integrity.CHECKS.revision(sp.profile_id, sp.audit_hash)
    assert found == [] and said == [f"profile {sp.profile_id} matches the profile store"]


def test_builtin_note_tells_this_linpodx_from_another() -> None:
    assert "digest matches this linpodx" in integrity.CHECKS.builtin_note(
        builtin_ref().audit_hash
    )
    assert "another linpodx version" in integrity.CHECKS.builtin_note("1" * 64)
