"""linpodx's seccomp profile: podman's default with no way to set S_ISUID/S_ISGID."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from linpodx.errors import EngineError
from linpodx.podman import seccomp

DEFAULT: dict[str, Any] = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 38,
    "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]}],
    "syscalls": [
        {"names": ["read", "chmod", "openat", "openat2", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["fchmod"], "action": "SCMP_ACT_ALLOW", "args": []},
        {"names": ["kexec_load"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
    ],
}


def _rules_for(doc: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in doc["syscalls"] if name in r["names"]]


def test_mode_calls_leave_the_unconditional_allow_list() -> None:
    # libseccomp lets an unconditional allow win over a conditional errno for the same call.
    out = seccomp.build(DEFAULT)
    for rule in out["syscalls"]:
        if not rule.get("args"):
            assert rule["action"] != "SCMP_ACT_ALLOW" or not (
                set(rule["names"]) & set(seccomp.MODE_ARG)
            ), rule
    assert _rules_for(out, "read") == [{"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"}]
    # A rule left with no name at all is dropped, others are kept as they were.
    assert not any(r["names"] == [] for r in out["syscalls"])
    assert _rules_for(out, "kexec_load") == [DEFAULT["syscalls"][2]]
    assert {k: out[k] for k in ("defaultAction", "defaultErrnoRet", "archMap")} == {
        k: DEFAULT[k] for k in ("defaultAction", "defaultErrnoRet", "archMap")
    }


@pytest.mark.parametrize(("name", "index"), sorted(seccomp.MODE_ARG.items()))
def test_each_mode_call_is_allowed_only_without_setid_bits(name: str, index: int) -> None:
    rules = _rules_for(seccomp.build(DEFAULT), name)
    allow = [r for r in rules if r["action"] == "SCMP_ACT_ALLOW"]
    deny = [r for r in rules if r["action"] == "SCMP_ACT_ERRNO"]
    assert [r["args"] for r in allow] == [
        [{"index": index, "value": 0o6000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    ]
    assert sorted(
        (r["errnoRet"], r["args"][0]["value"], r["args"][0]["valueTwo"]) for r in deny
    ) == [
        (1, 0o2000, 0o2000),
        (1, 0o4000, 0o4000),
    ]
    assert all(
        a["index"] == index and a["op"] == "SCMP_CMP_MASKED_EQ" for r in deny for a in r["args"]
    )


def _action(doc: dict[str, Any], name: str, args: dict[int, int]) -> tuple[str, int | None]:
    """What the filter does with a call, evaluated as libseccomp orders it: a matching rule
    with conditions, else an unconditional one, else the default (enough for this profile)."""
    matches = []
    for r in doc["syscalls"]:
        if name not in r["names"]:
            continue
        conds = r.get("args") or []
        if all((args.get(c["index"], 0) & c["value"]) == c["valueTwo"] for c in conds):
            matches.append(r)
    if not matches:
        return doc["defaultAction"], doc["defaultErrnoRet"]
    assert len({(m["action"], m.get("errnoRet")) for m in matches}) == 1, matches
    return matches[0]["action"], matches[0].get("errnoRet")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (0o755, ("SCMP_ACT_ALLOW", None)),
        (0o1777, ("SCMP_ACT_ALLOW", None)),
        (0o4755, ("SCMP_ACT_ERRNO", 1)),
        (0o2755, ("SCMP_ACT_ERRNO", 1)),
        (0o6755, ("SCMP_ACT_ERRNO", 1)),
        (0o100000 | 0o4755, ("SCMP_ACT_ERRNO", 1)),  # mknod S_IFREG with setuid
    ],
)
def test_what_a_mode_gets(mode: int, expected: tuple[str, int | None]) -> None:
    doc = seccomp.build(DEFAULT)
    for name, index in seccomp.MODE_ARG.items():
        assert _action(doc, name, {index: mode}) == expected, name


def test_uninspectable_calls_get_enosys() -> None:
    doc = seccomp.build(DEFAULT)
    for name in seccomp.UNINSPECTABLE:
        assert _action(doc, name, {}) == ("SCMP_ACT_ERRNO", 38), name


def test_a_real_default_builds_and_keeps_every_other_call(tmp_path: Path) -> None:
    src = next((p for p in seccomp.SOURCES if os.path.exists(p)), None)
    if src is None:
        pytest.skip("no podman default seccomp profile on this machine")
    with open(src, "rb") as f:
        default = json.load(f)
    out = seccomp.build(default)
    before = {n for r in default["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    after = {n for r in out["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    taken = set(seccomp.MODE_ARG) | set(seccomp.UNINSPECTABLE)
    assert before - taken <= after
    assert not any(
        r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") and set(r["names"]) & taken
        for r in out["syscalls"]
    )


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"defaultAction": "SCMP_ACT_ERRNO"},
        {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": {}},
        {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": "chmod"}]},
    ],
)
def test_a_default_in_another_form_is_refused(doc: dict[str, Any]) -> None:
    with pytest.raises(EngineError, match="expected form"):
        seccomp.build(doc)


def test_written_once_per_content_and_rewritten_when_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "default.json"
    src.write_text(json.dumps(DEFAULT))
    monkeypatch.setattr(seccomp, "SOURCES", (str(tmp_path / "missing.json"), str(src)))
    monkeypatch.setenv("LINPODX_STATE_DIR", str(tmp_path / "state"))
    assert seccomp.current() is None  # not written yet: the fast path takes no plan
    where = seccomp.ensure()
    assert seccomp.current() == where
    data = Path(where).read_bytes()
    assert json.loads(data) == seccomp.build(DEFAULT)
    assert os.path.basename(where) == f"{seccomp.sha256(data).hexdigest()}.json"
    mtime = os.stat(where).st_mtime_ns
    assert seccomp.ensure() == where and os.stat(where).st_mtime_ns == mtime
    Path(where).write_bytes(data.replace(b"SCMP_ACT_ERRNO", b"SCMP_ACT_ALLOW"))
    assert seccomp.current() is None  # an edited file is not used ...
    assert seccomp.ensure() == where and Path(where).read_bytes() == data  # ... but rewritten
    src.write_text(json.dumps({**DEFAULT, "defaultErrnoRet": 1}))
    assert seccomp.current() is None and seccomp.ensure() != where  # another default, another file


def test_no_default_profile_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seccomp, "SOURCES", (str(tmp_path / "a.json"),))
    monkeypatch.setenv("LINPODX_STATE_DIR", str(tmp_path / "state"))
    with pytest.raises(EngineError, match="missing") as e:
        seccomp.ensure()
    assert e.value.hint
    (tmp_path / "a.json").write_text("{nope")
    with pytest.raises(EngineError, match="not valid JSON"):
        seccomp.ensure()
