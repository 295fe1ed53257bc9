"""Did-you-mean for profile, container and snapshot names, and `run --profile FILE` (which is
told to apply the file first, with the exact command). The engine is a small fake here."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from linpodx import containers
from linpodx.containers import runner
from linpodx.errors import NotFound
from linpodx.snapshot import manifest
from linpodx.suggest import add_to_hint, close_to, did_you_mean
from tests.conftest import CliResult


def test_close_names_are_offered_best_first_and_far_ones_never() -> None:
    known = ["agent-readonly", "agent-rw", "builder", "agent-readonly"]
    assert close_to("agent-readonyl", known) == ["agent-readonly", "agent-rw"]
    assert close_to("zzz", known) == []
    assert close_to("builder", known) == []  # the word itself is not a suggestion
    assert did_you_mean("buidler", known) == "did you mean `builder`?"
    assert did_you_mean("zzz", known) == ""
    assert add_to_hint("see `x`", "buidler", known) == "did you mean `builder`? see `x`"
    assert add_to_hint("see `x`", "zzz", known) == "see `x`"
    assert add_to_hint(None, "buidler", known) == "did you mean `builder`?"


@pytest.fixture
def applied(tmp_path: Path) -> Path:
    from linpodx.profile import store

    f = tmp_path / "agent.yml"
    f.write_text("name: agent-readonly\n")
    store.apply(f)
    return f


def test_run_profile_with_a_typo_suggests_the_applied_name(applied: Path, cli: Any) -> None:
    res: CliResult = cli("run", "--profile", "agent-readonyl", "--image", "img", "--", "true")
    assert res.exit_code == 4
    assert "error: profile not found: agent-readonyl" in res.stderr
    assert "hint: did you mean `agent-readonly`?" in res.stderr


@pytest.mark.parametrize("command", ["show", "rm"])
def test_sandbox_show_and_rm_with_a_typo_suggest_the_applied_name(
    applied: Path, cli: Any, command: str
) -> None:
    res: CliResult = cli("sandbox", command, "agent-readonyl")
    assert res.exit_code == 4 and res.stdout == ""
    assert "error: profile not found: agent-readonyl" in res.stderr
    assert "hint: did you mean `agent-readonly`?" in res.stderr
    assert cli("sandbox", "show", "agent-readonly").exit_code == 0  # nothing was removed


@pytest.mark.parametrize("how", ["relative", "absolute", "bare-yml-missing"])
def test_run_profile_given_a_file_says_apply_it_first(
    applied: Path, cli: Any, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(applied.parent)
    arg = {"relative": "./agent.yml", "absolute": str(applied), "bare-yml-missing": "x.yaml"}[how]
    res: CliResult = cli("run", "--profile", arg, "--image", "img", "--", "true")
    assert res.exit_code == 2, res.stderr
    assert f"error: --profile takes the name of an applied profile, not a file: {arg}" in (
        res.stderr
    )
    # The exact command, and the name the file gives (when there is a file to read it from).
    name = "NAME" if how == "bare-yml-missing" else "agent-readonly"
    assert (
        f"hint: apply it first with `linpodx sandbox apply --profile {arg}`, then run it by "
        f"name: `linpodx run --profile {name} …`"
    ) in res.stderr
    assert res.stdout == ""


def test_a_file_path_is_quoted_for_the_shell(tmp_path: Path, cli: Any) -> None:
    f = tmp_path / "my profile.yml"
    f.write_text("name: spaced\n")
    res: CliResult = cli("run", "--profile", str(f), "--image", "img", "--", "true")
    assert res.exit_code == 2
    assert f"`linpodx sandbox apply --profile '{f}'`" in res.stderr
    assert "`linpodx run --profile spaced …`" in res.stderr


class Listing:
    """The part of the engine a did-you-mean for containers uses: inspect (nothing there) and
    the list of linpodx containers."""

    def inspect(self, name: str) -> dict[str, Any]:
        raise NotFound(f"container not found: {name}", "list linpodx containers with `ps`")

    def exists(self, name: str) -> bool:
        return False

    def list_managed(self, all_states: bool) -> list[dict[str, Any]]:
        return [{"Names": ["agent-1"]}, {"Names": ["builder"]}]


@pytest.fixture
def listing() -> Iterator[Listing]:
    fake = Listing()
    with runner.use(fake):  # type: ignore[arg-type]  # only what these calls use
        yield fake


def test_a_typo_d_container_name_gets_a_did_you_mean(listing: Listing) -> None:
    with pytest.raises(NotFound) as ei:
        containers.managed_info("agent-2")
    assert ei.value.hint == "did you mean `agent-1`? list linpodx containers with `ps`"
    with pytest.raises(NotFound) as ei:
        containers.managed_info("zzz")
    assert ei.value.hint == "list linpodx containers with `ps`"
    with pytest.raises(NotFound) as ei:
        containers.remove("buidler")
    assert ei.value.hint is not None and ei.value.hint.startswith("did you mean `builder`?")


def test_a_typo_d_snapshot_label_or_container_gets_a_did_you_mean() -> None:
    from linpodx.snapshot.names import snapshot_dir

    for label in ("before-refactor", "nightly"):
        os.makedirs(snapshot_dir("agent-1", label))
    err = manifest.not_found("agent-1", "before-refactr")
    assert err.hint is not None and err.hint.startswith("did you mean `before-refactor`? ")
    err = manifest.not_found("agent-2", "nightly")  # no snapshots of agent-2: the container
    assert err.hint is not None and err.hint.startswith("did you mean `agent-1`? ")
    err = manifest.not_found("zzz", "nightly")
    assert err.hint == "list the snapshots of zzz with `linpodx snapshot list zzz`"


def test_snapshot_list_of_a_typo_d_container_says_whose_snapshots_there_are(cli: Any) -> None:
    from linpodx.snapshot.names import snapshot_dir

    os.makedirs(snapshot_dir("agent-1", "nightly"))
    res: CliResult = cli("snapshot", "list", "agent-2")
    assert res.exit_code == 0 and res.stdout == ""
    assert res.stderr == "no snapshots of agent-2; did you mean `agent-1`?\n"
    assert cli("snapshot", "list", "zzz").stderr == "no snapshots\n"


def test_mcp_attach_to_a_typo_d_container_gets_a_did_you_mean(listing: Listing) -> None:
    from linpodx.mcp import attach

    with pytest.raises(NotFound) as ei:
        attach.find_container("agent-2")
    assert ei.value.hint == "did you mean `agent-1`? list linpodx containers with `ps`"
