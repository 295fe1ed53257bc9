"""One exit status per kind of error, the same from every command (issue 24 item 4).

Table-driven: each row makes one kind of failure happen in one command (with the fake engine
of test_cli_containers, no podman) and checks the status, the `error:` line, and that with
`--json` the envelope names the same status. The README's table is held to errors.EXIT_CODES.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from linpodx import errors
from linpodx.approvals import store
from linpodx.containers import runner
from linpodx.errors import (
    EXIT_CONFLICT,
    EXIT_ENGINE,
    EXIT_INVALID,
    EXIT_NOT_FOUND,
    EXIT_NOT_MANAGED,
    EXIT_USAGE,
    EngineError,
)
from linpodx.snapshot import container as snapshot_container
from tests.unit.test_cli_containers import FakeEngine

REPO = Path(__file__).resolve().parents[2]
BAD_PROFILE = "version: 1\nname: x\nnetwork: {allow: 7}\n"


@dataclass(frozen=True)
class Case:
    kind: int
    argv: tuple[str, ...]
    setup: Callable[[FakeEngine, pytest.MonkeyPatch, Path], None] = lambda f, m, p: None
    json: bool = True  # the command has --json: its envelope carries the same status


def _unmanaged(fake: FakeEngine, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    fake.labels = {}  # a container podman has, without linpodx's label
    fake.present.add("agent-1")


def _unmanaged_snapshot(fake: FakeEngine, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    mp.setattr(snapshot_container, "inspect_container", lambda name: {"Config": {"Labels": {}}})


def _unmanaged_for_attach(fake: FakeEngine, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    fake.labels = {}  # a running container podman has, without linpodx's label


def _taken(fake: FakeEngine, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    fake.fail["create"] = EngineError(
        "podman create failed", stderr='Error: the container name "agent-1" is already in use'
    )


def _podman_fails(what: str) -> Callable[[FakeEngine, pytest.MonkeyPatch, Path], None]:
    def setup(fake: FakeEngine, mp: pytest.MonkeyPatch, tmp: Path) -> None:
        fake.fail[what] = EngineError(f"podman {what} failed", stderr="Error: OCI runtime error")
        fake.present.add("agent-1")

    return setup


def _bad_profile(fake: FakeEngine, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    (tmp / "bad.yml").write_text(BAD_PROFILE)


_answered: list[str] = []


def _answered_approval(fake: FakeEngine, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    p = store.create("sess_x", "tools/call", "write_file", {"id": 1}, {"name": "w"}, 30)
    assert store.answer(p.approval_id, p.digest, store.APPROVE, "approved by a test", by={})
    _answered[:] = [p.approval_id]


ANSWERED = "{answered}"  # replaced by the id `_answered_approval` made

CASES = [
    # usage: the command line itself is wrong
    Case(EXIT_USAGE, ("ps", "--no-such-option")),
    Case(EXIT_USAGE, ("exec", "agent-1"), json=False),
    Case(EXIT_USAGE, ("run", "--image", "img", "--json", "--", "true")),
    Case(EXIT_USAGE, ("audit", "verify", "--all", "--session", "sess_x")),
    Case(EXIT_USAGE, ("snapshot", "list", "-q")),
    # invalid input
    Case(EXIT_INVALID, ("sandbox", "validate", "{tmp}/bad.yml"), _bad_profile),
    Case(EXIT_INVALID, ("sandbox", "apply", "--profile", "{tmp}/bad.yml"), _bad_profile),
    Case(EXIT_INVALID, ("run", "-d", "--image", "img", "--name", "bad name!")),
    Case(EXIT_INVALID, ("stop", "../x")),
    # not found
    Case(EXIT_NOT_FOUND, ("sandbox", "validate", "{tmp}/missing.yml")),
    Case(EXIT_NOT_FOUND, ("sandbox", "apply", "--profile", "{tmp}/missing.yml")),
    Case(EXIT_NOT_FOUND, ("sandbox", "show", "nothere")),
    Case(EXIT_NOT_FOUND, ("run", "-d", "--profile", "nothere", "--image", "img")),
    Case(EXIT_NOT_FOUND, ("snapshot", "rollback", "agent-1", "--to", "nope")),
    Case(EXIT_NOT_FOUND, ("approvals", "show", "apr_01M8TAH0NGNB4ZQERGFRRY7KQZ")),
    Case(EXIT_NOT_FOUND, ("snapshot", "job-status", "snap-01M8VF8HYVY5HEK8J8124M3AAH")),
    Case(EXIT_NOT_FOUND, ("audit", "verify", "--session", "sess_nope")),
    # not managed by linpodx
    Case(EXIT_NOT_MANAGED, ("rm", "agent-1"), _unmanaged),
    Case(EXIT_NOT_MANAGED, ("stop", "agent-1"), _unmanaged),
    Case(EXIT_NOT_MANAGED, ("exec", "agent-1", "--", "true"), _unmanaged, json=False),
    Case(EXIT_NOT_MANAGED, ("start", "agent-1"), _unmanaged),
    Case(EXIT_NOT_MANAGED, ("logs", "agent-1"), _unmanaged, json=False),
    Case(EXIT_NOT_MANAGED, ("attach", "agent-1"), _unmanaged, json=False),
    Case(
        EXIT_NOT_MANAGED, ("snapshot", "create", "agent-1", "--label", "l1"), _unmanaged_snapshot
    ),
    Case(
        EXIT_NOT_MANAGED,
        ("mcp", "attach", "--container", "agent-1", "--", "srv"),
        _unmanaged_for_attach,
        json=False,
    ),
    # conflict: taken already
    Case(EXIT_CONFLICT, ("run", "-d", "--image", "img", "--name", "agent-1"), _taken),
    Case(EXIT_CONFLICT, ("deny", "--non-interactive", ANSWERED), _answered_approval),
    Case(EXIT_CONFLICT, ("approve", "--non-interactive", ANSWERED), _answered_approval),
    # podman failed
    Case(EXIT_ENGINE, ("run", "-d", "--image", "img", "--name", "a1"), _podman_fails("create")),
    Case(EXIT_ENGINE, ("stop", "agent-1"), _podman_fails("stop")),
    Case(EXIT_ENGINE, ("rm", "--force", "agent-1"), _podman_fails("rm")),
]


@pytest.fixture
def fake() -> Iterator[FakeEngine]:
    f = FakeEngine()
    with runner.use(f):
        yield f


def _argv(case: Case, tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)).replace(ANSWERED, "".join(_answered)) for a in case.argv]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.kind}-{'-'.join(c.argv[:2])}")
def test_each_kind_of_error_has_its_own_status(
    case: Case, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli: Any
) -> None:
    case.setup(fake, monkeypatch, tmp_path)
    argv = _argv(case, tmp_path)
    res = cli(*argv)
    assert res.exit_code == case.kind, (argv, res.stderr)
    assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr, res.stderr
    if not case.json:
        assert res.stdout == ""
        return
    if "--json" not in argv:
        argv = [*argv[: argv.index("--")], "--json", *argv[argv.index("--") :]] if "--" in argv \
            else [*argv, "--json"]  # fmt: skip
    case.setup(fake, monkeypatch, tmp_path)
    res = cli(*argv)
    assert res.exit_code == case.kind, (argv, res.stderr)
    doc = json.loads(res.stdout)  # the whole of stdout: one envelope
    assert doc["ok"] is False and doc["error"]["exit_code"] == case.kind, doc


def test_every_kind_is_triggered_from_two_commands_at_least() -> None:
    """What the table above covers: every kind a command can end with, each from several
    commands (denied has no command that ends with it yet: MCP denials are answers to the
    agent, not exit statuses)."""
    commands: dict[int, set[str]] = {}
    for c in CASES:
        commands.setdefault(c.kind, set()).add(" ".join(c.argv[:2]))
    for code, kind, _ in errors.EXIT_CODES:
        if kind in ("ok", "failure", "audit", "tampered", "denied", "internal", "interrupted"):
            continue  # covered where they happen (test_cli_main, test_audit_*, test_doctor_*)
        assert len(commands.get(code, ())) >= 2, kind


def test_the_readme_lists_every_exit_status() -> None:
    readme = (REPO / "README.md").read_text()
    listed = dict(re.findall(r"^\| `(\d+)` \| ([^|]+?) \|", readme, re.M))
    assert listed == {str(code): kind for code, kind, _ in errors.EXIT_CODES}


def test_the_exit_statuses_are_distinct() -> None:
    codes = [code for code, _, _ in errors.EXIT_CODES]
    assert len(set(codes)) == len(codes)
    kinds = [
        errors.UsageError, errors.InvalidInput, errors.NotFound, errors.EngineError,
        errors.AuditError, errors.ChainBroken, errors.NotManaged, errors.Conflict, errors.Denied,
    ]  # fmt: skip
    assert len({k.exit_code for k in kinds}) == len(kinds)
    assert {k.exit_code for k in kinds} <= set(codes)
