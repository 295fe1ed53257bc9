"""`linpodx sandbox …` as a person (and a script with --json) sees it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from linpodx import paths
from linpodx.audit.chain import admin_chain, read_records
from linpodx.errors import EXIT_NOT_FOUND
from tests.conftest import CliResult, run_linpodx
from tests.unit.test_profile_store import rm_killed_after_its_record

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "agent-readonly.yml"
Cli = Callable[..., CliResult]


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture
def demo(isolated_state: Path) -> Path:
    (isolated_state / "demo-project").mkdir()
    return EXAMPLE


def one_json(out: str) -> dict[str, Any]:
    doc = json.loads(out)  # raises if stdout is not exactly one JSON document
    assert isinstance(doc, dict)
    assert doc["schema"] == "linpodx/v1"
    return doc


def nothing_stored() -> bool:
    base = paths.profiles_dir()
    stored = [p for p in base.rglob("*.json")] if base.exists() else []
    return not stored and not admin_chain().path.exists()


def test_validate_prints_the_walkthrough_summary(cli: Cli, demo: Path) -> None:
    r = cli("sandbox", "validate", str(demo))
    assert r.exit_code == 0, r.stderr
    assert r.stdout == (
        "profile: agent-readonly\n"
        "status:  ok\n"
        "mounts:  1\n"
        "egress:  2 hosts allowed\n"
        "mcp:     3 rules\n"
    )
    assert r.stderr == ""
    assert nothing_stored()


def test_validate_says_a_tcp_entry_is_weaker(cli: Cli, tmp_path: Path) -> None:
    prof = tmp_path / "p.yml"
    prof.write_text(
        "version: 1\nname: ports\nnetwork:\n  egress_dns_allowlist:\n"
        "    - Git.Example.com:22/tcp\n    - mirror.example.com:80/http\n    - crates.io\n"
    )
    r = cli("sandbox", "validate", str(prof))
    assert r.exit_code == 0, r.stderr
    assert "egress:  3 hosts allowed" in r.stdout
    assert r.stderr == (
        "note: git.example.com:22/tcp is checked by address only (weaker than a TLS or /http "
        "entry: any name served on that address is reachable on that port)\n"
    )
    bad = tmp_path / "bad.yml"
    bad.write_text("version: 1\nname: ports\nnetwork:\n  egress_dns_allowlist: ['a.test:80/udp']\n")
    r = cli("sandbox", "validate", str(bad))
    assert r.exit_code != 0 and "unknown kind" in r.stderr and "hint:" in r.stderr


def test_validate_json(cli: Cli, demo: Path) -> None:
    r = cli("sandbox", "validate", str(demo), "--json")
    assert r.exit_code == 0
    doc = one_json(r.stdout)
    assert doc["ok"] is True and doc["command"] == "sandbox validate"
    assert doc["result"] == {
        "name": "agent-readonly",
        "status": "ok",
        "mounts": 1,
        "egress": 2,
        "wildcards": 0,
        "wildcard_budget": 100,
        "mcp": 3,
        "mcp_on_arguments": 0,
        "mcp_rated": [],
        "limits": {"enforcement": "required", "not_enforceable_here": []},
    }


HOSTILE = [
    # (file body, expected first error line suffix after FILE:)
    ("name: a\nmounts:\n  - source: /etc\n    target: /w\n",
     "3:13: mounts[0].source: mount source \"/etc\" is the sensitive path /etc"),
    ("name: a\nmounts:\n  - source: /var/run/docker.sock\n    target: /w\n",
     "3:13: mounts[0].source: mount source \"/var/run/docker.sock\""),
    ("name: a\nmounts:\n  - source: ${HOME}\n    target: /w\n",
     "3:13: mounts[0].source: mount source"),
    ("name: a\nmounts:\n  - source: ${HOME}/demo-project\n    target: /sys/x\n",
     "4:13: mounts[0].target: mount target \"/sys/x\" is over /sys, which is not allowed"),
    ("name: a\nname: b\n", "2:1: name: duplicate key \"name\" (first at line 1, column 1)"),
    ("name: a\nx: &a [1]\ny: *a\n", "2:4: x: YAML anchors and aliases are not allowed (&a)"),
    ("name: a\ndescription: ${LINPODX_VAR_NOT_SET_ANYWHERE}\n",
     "2:14: description: environment variable LINPODX_VAR_NOT_SET_ANYWHERE is not set"),
    # Set or not, a host variable outside the fixed set is never expanded (HOME is set here).
    ("name: a\nenv: {STOLEN: \"${SECRET_TOKEN:-x}\"}\n",
     "2:15: env.STOLEN: `${SECRET_TOKEN}` is not expanded"),
    ("name: a\nnetwork: {egress_dns_allowlist: ['*.com']}\n",
     "2:34: network.egress_dns_allowlist[0]: \"*.com\": a wildcard needs a domain of at least "
     "two labels"),
    ("name: a\nmcp_policy: [{method: tools/call, decision: yes}]\n",
     "2:45: mcp_policy[0].decision: \"yes\" is not one of: auto_allow, prompt, deny"),
    ("name: a\naudit: {hash_chain: false}\n",
     "2:21: audit.hash_chain: hash_chain: false is refused"),
    ("%YAML 1.1\n---\nname: a\nmounts: [{source: /x, target: /y, read_only: yes}]\n",
     "1:1: YAML version \"1.1\" is not supported"),
    ("name: a\nmounts:\n  - read_only: !!bool yes\n    source: ${HOME}/demo-project\n"
     "    target: /y\n", "3:16: mounts[0].read_only: \"yes\" tagged !!bool is not a YAML boolean"),
    # A folded scalar ends in a newline: this deny rule never matched and the next rule won.
    ("name: a\nmcp_policy:\n  - method: tools/call\n    tool_name: >\n      delete_file\n"
     "    decision: deny\n  - {method: tools/call, decision: auto_allow}\n",
     "4:16: mcp_policy[0].tool_name: \"delete_file\\n\" is not valid here"),
    ("name: a\nresources: {memory: \"2g\\n\"}\n",
     "2:21: resources.memory: \"2g\\n\" is not valid here"),
    ("name: \"abc\\n\"\n", "1:7: name: \"abc\\n\" is not valid here"),
    ("name: a\nenv: {\"X\\n\": v}\n",
     "2:7: env[\"X\\n\"]: \"X\\n\" is not a valid environment variable name"),
]


@pytest.mark.parametrize(("body", "first"), HOSTILE)
def test_validate_and_apply_refuse_hostile_profiles(
    cli: Cli, demo: Path, tmp_path: Path, body: str, first: str
) -> None:
    f = tmp_path / "bad.yml"
    f.write_text(body, encoding="utf-8")
    for args in (("sandbox", "validate", str(f)), ("sandbox", "apply", "--profile", str(f))):
        r = cli(*args)
        assert r.exit_code == 3
        assert r.stdout == ""
        lines = r.stderr.splitlines()
        assert lines[0].startswith(f"error: {f}:{first}"), lines
        assert lines[-1].startswith("hint: ")
        assert all(line.startswith(("error: ", "hint: ")) for line in lines)
        assert "Traceback" not in r.stderr
        assert nothing_stored()
        base = paths.profiles_dir()
        assert not base.exists() or not [p for p in base.rglob("*") if p.is_dir()]


def test_validate_failure_json_is_one_document(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "bad.yml"
    f.write_text("name: a\nbogus: 1\n", encoding="utf-8")
    r = cli("sandbox", "validate", str(f), "--json")
    assert r.exit_code == 3
    doc = one_json(r.stdout)
    assert doc["ok"] is False
    err = doc["error"]
    assert err["type"] == "ProfileError" and err["exit_code"] == 3
    assert err["problems"] == [f"{f}:2:1: bogus: unknown key \"bogus\""]
    assert err["hint"]


def test_apply_prints_id_and_hash_then_unchanged(cli: Cli, demo: Path) -> None:
    r = cli("sandbox", "apply", "--profile", str(demo))
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"profile_id: prof_[0-9A-HJKMNP-TV-Z]{26}", lines[0])
    assert re.fullmatch(r"audit_hash: [0-9a-f]{64}", lines[1])
    assert lines[2:] == ["revision: 1", "changed: true"]
    records = read_records(admin_chain().path)
    assert records[-1].hash == lines[1].split()[1]

    again = cli("sandbox", "apply", "--profile", str(demo))
    assert again.exit_code == 0
    assert again.stdout.splitlines() == [*lines[:2], "revision: 1", "changed: false"]
    assert "unchanged" in again.stderr
    assert len(read_records(admin_chain().path)) == len(records)


def test_apply_json_and_modified_profile(cli: Cli, demo: Path, tmp_path: Path) -> None:
    r = cli("sandbox", "apply", "--profile", str(demo), "--json")
    first = one_json(r.stdout)["result"]
    assert first["changed"] is True and first["revision"] == 1
    changed = tmp_path / "changed.yml"
    changed.write_text(demo.read_text().replace("crates.io", "static.crates.io"))
    r2 = cli("sandbox", "apply", "--profile", str(changed), "--json")
    second = one_json(r2.stdout)["result"]
    assert second["revision"] == 2
    assert second["profile_id"] != first["profile_id"]
    assert second["changed"] is True


def test_apply_missing_file(cli: Cli, tmp_path: Path) -> None:
    r = cli("sandbox", "apply", "--profile", str(tmp_path / "nope.yml"), "--json")
    assert r.exit_code == EXIT_NOT_FOUND
    doc = one_json(r.stdout)
    assert "not found" in doc["error"]["message"]
    assert nothing_stored()


def test_list_show_rm(cli: Cli, demo: Path) -> None:
    empty = cli("sandbox", "list")
    assert empty.exit_code == 0 and empty.stdout == ""
    assert "no profiles applied" in empty.stderr

    applied = cli("sandbox", "apply", "--profile", str(demo)).stdout.splitlines()
    pid = applied[0].split()[1]

    listed = cli("sandbox", "list")
    assert listed.exit_code == 0
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "REVISION", "PROFILE_ID", "APPLIED_AT", "STATE"]
    assert row.split()[:3] == ["agent-readonly", "1", pid] and row.split()[4] == "applied"
    assert listed.stderr == ""
    lj = one_json(cli("sandbox", "list", "--json").stdout)
    assert [p["profile_id"] for p in lj["result"]["profiles"]] == [pid]

    shown = cli("sandbox", "show", "agent-readonly")
    assert shown.exit_code == 0
    assert f"# profile_id: {pid}" in shown.stdout
    doc = YAML(typ="safe", pure=True).load(shown.stdout)
    assert doc["name"] == "agent-readonly"
    assert doc["mounts"][0]["read_only"] is True
    assert doc["network"]["egress_dns_allowlist"] == ["registry.example.com", "crates.io"]
    sj = one_json(cli("sandbox", "show", "agent-readonly", "--json").stdout)["result"]
    assert sj["profile_id"] == pid and sj["profile"]["mcp_policy"][0]["decision"] == "auto_allow"
    by_id = one_json(cli("sandbox", "show", pid, "--json").stdout)["result"]
    assert by_id["profile"] == sj["profile"]
    as_json = cli("sandbox", "show", "agent-readonly", "--format", "json")
    assert json.loads(as_json.stdout) == sj["profile"]

    rm = cli("sandbox", "rm", "agent-readonly")
    assert rm.exit_code == 0
    assert rm.stdout.splitlines()[:2] == ["removed: agent-readonly", f"profile_id: {pid}"]
    assert [r.type for r in read_records(admin_chain().path)] == ["profile.apply", "profile.rm"]

    gone = cli("sandbox", "show", "agent-readonly")
    assert gone.exit_code == 4
    assert gone.stderr.splitlines() == [
        "error: profile not found: agent-readonly",
        "hint: run `linpodx sandbox apply --profile FILE` to apply it "
        "(see `linpodx sandbox list`)",
    ]
    # The revision stays resolvable by id for containers started under it.
    assert cli("sandbox", "show", pid).exit_code == 0


def test_list_shows_every_profile_while_one_rm_is_interrupted(
    cli: Cli, demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sandbox rm` killed after its record: that profile is listed as `removing` with a hint,
    every other one as before, and the listing itself succeeds."""

    other = tmp_path / "other.yml"
    other.write_text("name: other\n", encoding="utf-8")
    assert cli("sandbox", "apply", "--profile", str(demo)).exit_code == 0
    assert cli("sandbox", "apply", "--profile", str(other)).exit_code == 0

    rm_killed_after_its_record(monkeypatch, lambda: cli("sandbox", "rm", "agent-readonly"))

    listed = cli("sandbox", "list")
    assert listed.exit_code == 0, listed.stderr
    header, first, second = listed.stdout.splitlines()
    assert header.split() == ["NAME", "REVISION", "PROFILE_ID", "APPLIED_AT", "STATE"]
    assert (first.split()[0], first.split()[-1]) == ("agent-readonly", "removing")
    assert (second.split()[0], second.split()[-1]) == ("other", "applied")
    [hint] = listed.stderr.splitlines()
    assert hint.startswith("hint: profile agent-readonly: a `sandbox rm` of it was interrupted")
    assert "`linpodx sandbox rm agent-readonly`" in hint

    lj = cli("sandbox", "list", "--json")
    assert lj.exit_code == 0
    rows = one_json(lj.stdout)["result"]["profiles"]
    assert [(p["name"], p["state"]) for p in rows] == [
        ("agent-readonly", "removing"), ("other", "applied")
    ]  # fmt: skip
    assert "linpodx sandbox rm agent-readonly" in rows[0]["hint"] and rows[1]["hint"] is None

    # The profile stays refused for use, and the next rm settles it.
    shown = cli("sandbox", "show", "agent-readonly")
    assert shown.exit_code == 7 and "interrupted" in shown.stderr
    assert cli("sandbox", "rm", "agent-readonly").exit_code == 0
    after = cli("sandbox", "list", "--json")
    assert [p["name"] for p in one_json(after.stdout)["result"]["profiles"]] == ["other"]


@pytest.mark.parametrize(
    "args",
    [("sandbox", "show", "nope"), ("sandbox", "rm", "nope"), ("sandbox", "show", "prof_bad")],
)
def test_not_found_json(cli: Cli, args: tuple[str, ...]) -> None:
    r = cli(*args, "--json")
    assert r.exit_code == 4
    doc = one_json(r.stdout)
    assert doc["ok"] is False and doc["error"]["type"] == "NotFound"
    assert r.stderr.startswith("error: ")


def test_rm_json(cli: Cli, demo: Path) -> None:
    cli("sandbox", "apply", "--profile", str(demo))
    doc = one_json(cli("sandbox", "rm", "agent-readonly", "--json").stdout)
    assert doc["ok"] is True
    assert doc["result"]["removed"] == "agent-readonly"
    assert re.fullmatch(r"[0-9a-f]{64}", doc["result"]["audit_hash"])


def test_subprocess_apply_and_audit_verify(demo: Path) -> None:
    r = run_linpodx("sandbox", "apply", "--profile", str(demo))
    assert r.returncode == 0, r.stderr
    audit_hash = r.stdout.splitlines()[1].split()[1]
    v = run_linpodx("audit", "verify")
    assert v.returncode == 0, v.stderr
    assert "chain:   OK" in v.stdout
    assert audit_hash[:12] in v.stdout


def test_two_applies_close_together_leave_the_containers_on_the_newer_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply A's push to running containers is slow (a guard taking its time); apply B of the
    same profile comes meanwhile. The push that ends last must carry the newer revision:
    before, A's push of revision 2 landed after B's of revision 3 and left the containers on
    the older allowlist."""
    import threading
    import time

    from linpodx.cli import sandbox
    from linpodx.egress import guard
    from linpodx.profile import store

    pushing = threading.Event()
    pushed: list[int] = []

    def slow_push(stored: Any, only_stale: bool = False) -> list[str]:
        pushing.set()
        if stored.revision == 2:
            time.sleep(0.5)
        pushed.append(int(stored.revision))
        return []

    monkeypatch.setattr(guard, "update_profile", slow_push)
    files = []
    for i, hosts in enumerate((["a.test"], ["a.test", "b.test"], ["c.test"])):
        f = tmp_path / f"p{i}.yml"
        f.write_text(f"version: 1\nname: race\nnetwork:\n  egress_dns_allowlist: {hosts}\n")
        files.append(f)
    assert store.apply(files[0]).revision == 1

    def apply(f: Path) -> None:
        sandbox._push_egress(store.apply(f).to_dict())

    first = threading.Thread(target=apply, args=(files[1],))
    first.start()
    assert pushing.wait(10)
    second = threading.Thread(target=apply, args=(files[2],))
    second.start()
    first.join(10)
    second.join(10)
    assert int(store.get("race").revision) == 3
    assert pushed[-1] == 3, pushed


@pytest.mark.parametrize(
    "command",
    [("sandbox", "list"), ("snapshot", "list"), ("audit", "verify"), ("audit", "show")],
)
def test_a_state_dir_that_is_a_file_is_an_error_not_an_empty_listing(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: tuple[str, ...]
) -> None:
    """LINPODX_STATE_DIR naming a regular file: listings must not read as "nothing there"
    (exit 0), since nothing can be stored there either."""
    state = tmp_path / "state-file"
    state.write_text("")
    monkeypatch.setenv("LINPODX_STATE_DIR", str(state))
    res = cli(*command)
    assert res.exit_code == 6, res.stdout + res.stderr
    assert res.stderr.startswith("error: cannot use linpodx's state dir: Not a directory")
    assert "hint:" in res.stderr and res.stdout == ""
    # With no state dir at all, the listings are simply empty.
    monkeypatch.setenv("LINPODX_STATE_DIR", str(tmp_path / "none-yet"))
    if command[1] == "list":
        res = cli(*command)
        assert res.exit_code == 0, res.stdout + res.stderr
        assert (res.stdout + res.stderr).startswith("no "), res.stdout + res.stderr


def test_show_escapes_bidi_and_zero_width_characters(cli: Cli, tmp_path: Path) -> None:
    # The loader refuses control characters, not these; shown raw they reorder or hide text.
    f = tmp_path / "bidi.yml"
    f.write_text('name: bidi\ndescription: "safe \\u202e gnp.exe caf\u00e9"\n'
                 'env: {X: "a\\u200bb"}\n', encoding="utf-8")
    assert cli("sandbox", "apply", "--profile", str(f)).exit_code == 0
    for args in (("sandbox", "show", "bidi"), ("sandbox", "show", "bidi", "--format", "json"),
                 ("sandbox", "show", "bidi", "--json")):
        r = cli(*args)
        assert r.exit_code == 0, r.stderr
        assert "\u202e" not in r.stdout and "\u200b" not in r.stdout, args
        doc = YAML(typ="safe", pure=True).load(r.stdout)  # JSON is YAML too
        profile = doc["result"]["profile"] if "--json" in args else doc
        assert profile["description"] == "safe \u202e gnp.exe caf\u00e9"
        assert profile["env"] == {"X": "a\u200bb"}
    plain = cli("sandbox", "show", "bidi", "--format", "json")
    assert "\\u202e" in plain.stdout


def test_show_keeps_ordinary_non_ascii_text_as_is(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "cafe.yml"
    f.write_text("name: cafe\ndescription: caf\u00e9\n", encoding="utf-8")
    assert cli("sandbox", "apply", "--profile", str(f)).exit_code == 0
    assert "caf\u00e9" in cli("sandbox", "show", "cafe").stdout


def test_a_symlinked_admin_log_gets_a_hint_about_the_link(
    cli: Cli, demo: Path, tmp_path: Path
) -> None:
    """linpodx opens the log with O_NOFOLLOW: the refusal used to read "Too many levels of
    symbolic links" with a hint about free disk space."""
    assert cli("sandbox", "apply", "--profile", str(demo)).exit_code == 0
    log = admin_chain().path
    real = tmp_path / "elsewhere.jsonl"
    log.rename(real)
    before = real.read_bytes()
    log.symlink_to(real)
    res = cli("sandbox", "rm", "agent-readonly")
    assert res.exit_code == 6, res.stderr
    assert "is a symbolic link" in res.stderr and "hint: replace the link" in res.stderr
    assert "df -h" not in res.stderr
    assert real.read_bytes() == before


def test_an_unchanged_apply_still_pushes_to_containers_left_behind(
    cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sandbox apply` of the same file again stores nothing, but finishes the push of an
    apply cut short: it asks the guards of containers not at the current revision."""
    from linpodx.egress import guard

    pushed: list[tuple[int, bool]] = []

    def push(stored: Any, only_stale: bool = False) -> list[str]:
        pushed.append((int(stored.revision), only_stale))
        return ["agent-1"] if only_stale else []

    monkeypatch.setattr(guard, "update_profile", push)
    f = tmp_path / "p.yml"
    f.write_text("version: 1\nname: net\nnetwork:\n  egress_dns_allowlist: [a.test]\n")
    assert cli("sandbox", "apply", "--profile", str(f)).exit_code == 0
    res = cli("sandbox", "apply", "--profile", str(f))
    assert res.exit_code == 0, res.stderr
    assert pushed == [(1, False), (1, True)]
    assert "egress_updated: agent-1" in res.stdout
    assert "unchanged (revision 1): nothing stored" in res.stderr


def test_the_same_thing_has_the_same_key_in_every_command(cli: Cli, demo: Path) -> None:
    """A profile's name is `name` in validate, apply and show (`profile` is show's whole
    profile); the audit log's path is `log` in verify, show and seal."""
    names = {}
    for args in (("sandbox", "validate", str(demo)), ("sandbox", "apply", "--profile", str(demo)),
                 ("sandbox", "show", "agent-readonly")):
        r = cli(*args, "--json")
        assert r.exit_code == 0, r.stderr
        names[args[1]] = one_json(r.stdout)["result"]["name"]
    assert set(names.values()) == {"agent-readonly"}
    logs = {}
    for args in (("audit", "verify"), ("audit", "show"), ("audit", "seal")):
        r = cli(*args, "--json")
        assert r.exit_code == 0, r.stderr
        result = one_json(r.stdout)["result"]
        assert "path" not in result
        logs[args[1]] = result["log"]
    assert len(set(logs.values())) == 1 and str(admin_chain().path) in logs.values()


@pytest.mark.parametrize(
    "argv", [("sandbox", "validate", ""), ("sandbox", "apply", "--profile", "")]
)
def test_an_empty_profile_path_is_a_usage_error_not_the_current_directory(
    cli: Cli, isolated_state: Path, argv: tuple[str, ...]
) -> None:
    """pathlib reads '' as '.': the error named `profile .` (a directory nobody gave)."""
    r = cli(*argv)
    assert r.exit_code == 2, r.stderr
    assert r.stderr.startswith("error: invalid value for ") and "hint: " in r.stderr
    assert " . " not in r.stderr and nothing_stored()
