"""stdout is data, one JSON envelope (issue 24 items 1 and 4), with the fake engine of
test_cli_containers: lists under a plural key, numbers as numbers, the same key for the same
thing, `--format json` as `--json`, `-q` printing names, `run -d` printing the bare id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from linpodx.cli.main import format_as_json
from linpodx.containers import runner
from linpodx.errors import EXIT_USAGE
from tests.unit.test_cli_containers import FakeEngine

CONTAINER_KEYS = {"name", "container_id", "state", "profile", "revision", "image"}
"""What `run -d --json` says about a container; `ps --json` says the same, plus `egress`."""


@pytest.fixture
def fake() -> Iterator[FakeEngine]:
    f = FakeEngine()
    with runner.use(f):
        yield f


def result(res: Any) -> Any:
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)  # the whole of stdout: one document
    assert doc["schema"] == "linpodx/v1" and doc["ok"] is True
    return doc["result"]


def test_run_detached_prints_the_bare_id_and_its_status_on_stderr(
    fake: FakeEngine, cli: Any
) -> None:
    res = cli("run", "-d", "--image", "localhost/img:1", "--name", "agent-1", "--", "sleep", "9")
    assert res.exit_code == 0, res.stderr
    assert res.stdout == "c0ffee\n"  # as `podman run -d`: `id=$(linpodx run -d …)` works
    assert res.stderr.splitlines() == ["name:    agent-1", "state:   running"]


def test_run_detached_json_describes_the_container_as_ps_does(fake: FakeEngine, cli: Any) -> None:
    ran = result(cli("run", "-d", "--json", "--image", "localhost/img:1", "--name", "agent-1"))
    assert set(ran) == CONTAINER_KEYS
    assert isinstance(ran["revision"], int)
    fake.list_managed = lambda all_states: [  # type: ignore[method-assign]
        {
            "Names": ["agent-1"], "Id": "c0ffee", "State": "running", "Image": "localhost/img:1",
            "Labels": {"linpodx.profile": ran["profile"], "linpodx.revision": "0"},
        }
    ]  # fmt: skip
    listed = result(cli("ps", "--json"))
    assert set(listed) == {"containers"}
    [row] = listed["containers"]
    assert set(row) == CONTAINER_KEYS | {"egress"}
    assert {k: row[k] for k in CONTAINER_KEYS} == ran


def test_ps_revision_is_a_number_or_null(
    fake: FakeEngine, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        {"Names": [n], "Id": n, "State": "running", "Image": "i",
         "Labels": {"linpodx.profile": "p", "linpodx.revision": rev}}
        for n, rev in (("a-1", "12"), ("a-2", "x1"), ("a-3", "-1"))
    ]  # fmt: skip
    monkeypatch.setattr(fake, "list_managed", lambda all_states: rows)
    got = {r["name"]: r["revision"] for r in result(cli("ps", "--json"))["containers"]}
    assert got == {"a-1": 12, "a-2": None, "a-3": None}  # a label anyone can set: never trusted
    table = cli("ps").stdout.splitlines()
    assert [line.split()[2] for line in table[1:]] == ["12", "-", "-"]


def test_ps_quiet_prints_the_names(fake: FakeEngine, cli: Any) -> None:
    res = cli("ps", "-q")
    assert res.exit_code == 0 and res.stdout == "agent-1\n" and res.stderr == ""
    assert cli("ps", "--quiet", "--all").stdout == "agent-1\n"


@pytest.mark.parametrize("spelling", [["--format", "json"], ["--format=json"]])
def test_format_json_is_json(fake: FakeEngine, cli: Any, spelling: list[str]) -> None:
    assert result(cli("ps", *spelling)) == result(cli("ps", "--json"))
    res = cli("ps", "--format", "json", "-q")
    assert json.loads(res.stdout)["result"]["containers"][0]["name"] == "agent-1"


def test_format_as_json_leaves_the_command_and_sandbox_show_alone() -> None:
    assert format_as_json(["ps", "--format", "json"]) == ["ps", "--json"]
    assert format_as_json(["run", "--image", "i", "--", "jq", "--format", "json"]) == [
        "run", "--image", "i", "--", "jq", "--format", "json"
    ]  # fmt: skip
    assert format_as_json(["sandbox", "show", "p", "--format", "json"]) == [
        "sandbox", "show", "p", "--format", "json"
    ]  # fmt: skip
    assert format_as_json(["ps", "--format"]) == ["ps", "--format"]  # said below


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["ps", "--format", "table"], "--format takes only json here (got 'table')"),
        (["ps", "--format={{.Names}}"], "--format takes only json here (got '{{.Names}}')"),
        (["snapshot", "list", "--format"], "--format needs a value: json"),
    ],
)
def test_a_format_other_than_json_is_said_as_such(
    fake: FakeEngine, cli: Any, argv: list[str], said: str
) -> None:
    # click called the option unknown ("No such option: --format"), though help names it.
    res = cli(*argv)
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.startswith(f"error: {said}\nhint: use `--format json`")
    assert cli("sandbox", "show", "x", "--format", "toml").exit_code == 2  # its own option
    res = cli(*argv, "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["error"]["message"] == said


def _apply(cli: Any, tmp_path: Path, name: str) -> dict[str, Any]:
    f = tmp_path / f"{name}.yml"
    f.write_text(f"version: 1\nname: {name}\n")
    applied: dict[str, Any] = result(cli("sandbox", "apply", "--profile", str(f), "--json"))
    return applied


def test_sandbox_list_shapes(cli: Any, tmp_path: Path) -> None:
    _apply(cli, tmp_path, "beta")
    applied = _apply(cli, tmp_path, "alpha")
    assert isinstance(applied["revision"], int)
    listed = result(cli("sandbox", "list", "--format", "json"))
    assert set(listed) == {"profiles"}
    assert [p["name"] for p in listed["profiles"]] == ["alpha", "beta"]
    assert all(isinstance(p["revision"], int) for p in listed["profiles"])
    res = cli("sandbox", "list", "-q")
    assert res.exit_code == 0 and res.stdout == "alpha\nbeta\n"
    # `sandbox show --format json` keeps its own meaning: the normalized profile itself.
    shown = cli("sandbox", "show", "alpha", "--format", "json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["name"] == "alpha"


def test_snapshot_list_shapes(cli: Any) -> None:
    assert result(cli("snapshot", "list", "--json")) == {"snapshots": []}
    empty = cli("snapshot", "list")
    assert empty.exit_code == 0 and empty.stdout == ""  # "no snapshots" is for people: stderr
    assert cli("snapshot", "list", "agent-1", "-q").stdout == ""
    res = cli("snapshot", "list", "-q")
    assert res.exit_code == EXIT_USAGE and "needs a container NAME" in res.stderr
