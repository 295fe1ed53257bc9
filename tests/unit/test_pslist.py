"""`linpodx ps` starts podman before the rest of the listing loads (`linpodx.podman.pslist`),
and reads podman's two pipes as `proc.run` would: all of both, podman's words on a failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from linpodx import proc
from linpodx.errors import EngineError
from linpodx.podman import pslist


def _stand_in(tmp_path: Path, body: str) -> dict[str, str]:
    """PATH with a `podman` that runs the shell `body`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman").write_text("#!/bin/sh\n" + body + "\n")
    (bindir / "podman").chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}


def test_collect_reads_both_pipes_whole_while_they_fill() -> None:
    # 1 MiB on each: a reader that waited on one pipe first would hang on the other.
    both = "head -c 1048576 /dev/zero >&2; head -c 1048576 /dev/zero"
    child = proc.Child(["/bin/sh", "-c", both])
    rc, out, err = child.collect(timeout=60)
    assert (rc, len(out), len(err)) == (0, 1 << 20, 1 << 20)


def test_collect_kills_a_child_past_its_timeout() -> None:
    child = proc.Child(["/bin/sleep", "30"])
    with pytest.raises(TimeoutError):
        child.collect(timeout=0.2)
    assert child.returncode == -9  # killed (not waited for to the end), and reaped


def test_rows_are_podmans_dicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = _stand_in(tmp_path, """echo "$@" > "$0.args"; echo '[{"Names": ["a"]}, 3]'""")
    monkeypatch.setenv("PATH", env["PATH"])
    assert pslist.start(True).rows() == [{"Names": ["a"]}]
    args = (tmp_path / "bin" / "podman.args").read_text().split()
    assert args == ["ps", "--format=json", "--filter=label=linpodx.managed=1", "--all"]


def test_a_failure_carries_podmans_words_and_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _stand_in(tmp_path, "echo 'Error: no such container' >&2; exit 125")
    monkeypatch.setenv("PATH", env["PATH"])
    with pytest.raises(EngineError) as caught:
        pslist.start(False).rows()
    err = caught.value
    assert (err.message, err.returncode) == ("podman ps failed (exit 125)", 125)
    assert "no such container" in err.stderr and "linpodx ps --all" in (err.hint or "")


def test_output_that_is_not_json_is_an_engine_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", _stand_in(tmp_path, "echo '[{'")["PATH"])
    with pytest.raises(EngineError, match="not JSON"):
        pslist.start(False).rows()


def test_no_podman_is_said_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(proc, "SBIN_DIRS", ())
    with pytest.raises(EngineError, match="podman not found"):
        pslist.start(False)


def test_ps_starts_podman_before_the_listing_loads(tmp_path: Path) -> None:
    """podman lists while `linpodx ps` loads the rest (bench/bench_cli.py: <= 2x podman ps)."""
    env = _stand_in(tmp_path, "echo '[]'")
    code = (
        "import sys\n"
        "from linpodx import proc\n"
        "seen = []\n"
        "start = proc.Child.__init__\n"
        "def spy(self, argv):\n"
        "    seen.append((argv[1], 'linpodx.containers.listing' in sys.modules))\n"
        "    start(self, argv)\n"
        "proc.Child.__init__ = spy\n"
        "from linpodx.cli.main import main\n"
        "rc = main(['ps', '--json'])\n"
        "print(rc, seen, file=sys.stderr)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.stderr.strip().splitlines()[-1] == "0 [('ps', False)]", res.stderr
    assert json.loads(res.stdout)["result"] == {"containers": []}


def test_a_reader_that_went_away_ends_ps_quietly(tmp_path: Path) -> None:
    """`linpodx ps --json | head -1`: no traceback, no "internal error", status 1 (as a
    failure's own report meets a closed pipe, `linpodx.cli.main._report`)."""
    env = _stand_in(tmp_path, """echo '[{"Names": ["agent-1"], "State": "running"}]'""")
    env["LINPODX_STATE_DIR"] = str(tmp_path / "state")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before linpodx writes
    try:
        res = subprocess.run(
            [sys.executable, "-m", "linpodx", "ps", "--json"],
            env=env, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert (res.returncode, res.stderr) == (1, "")


def test_collect_kills_a_child_that_closed_its_pipes_and_runs_on() -> None:
    # Its pipes end before the timeout; the wait for its exit is what runs out.
    child = proc.Child(["/bin/sh", "-c", "exec >&- 2>&-; exec sleep 30"])
    with pytest.raises(TimeoutError):
        child.collect(timeout=0.5)
    assert child.returncode is not None and child.returncode < 0  # killed, and reaped


def test_output_nested_past_the_stack_is_an_engine_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was an internal error (RecursionError)."""
    deep = "python3 -c 'print(\"[\" * 100000)'"
    monkeypatch.setenv("PATH", _stand_in(tmp_path, deep)["PATH"])
    with pytest.raises(EngineError, match="not JSON"):
        pslist.start(False).rows()


@pytest.mark.parametrize("call", ["inspect", "other_containers_info"])
def test_inspect_output_nested_past_the_stack_is_an_engine_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """`podman inspect` printing JSON nested past Python's stack was an internal error
    (RecursionError), as `linpodx ps` was; both go through `hints.podman_json` now."""
    from linpodx.podman import engine

    # `ps` lists one id; `inspect` (all at once, then one by one) prints the deep document.
    body = 'case "$1" in ps) echo c1 ;; *) python3 -c \'print("[" * 100000)\' ;; esac'
    monkeypatch.setenv("PATH", _stand_in(tmp_path, body)["PATH"])
    with pytest.raises(EngineError, match="not JSON"):
        if call == "inspect":
            engine.inspect("c1")
        else:
            engine.other_containers_info("own")


def test_a_row_whose_labels_are_no_object_has_no_labels() -> None:
    """`Labels` that is not an object ended `linpodx ps` in an internal error (AttributeError)."""
    from linpodx.containers import listing

    rows = listing.ps(True, lambda: [{"Names": ["r5-x"], "Labels": [1], "State": "exited"}])
    assert [(r["name"], r["profile"], r["revision"]) for r in rows] == [("r5-x", "", None)]


def test_a_wait_with_a_timeout_waits_on_the_child_not_in_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`wait(timeout)` slept in 10 ms steps between looks: every `linpodx ps` paid up to one
    step after podman had ended. It waits on the child's pidfd instead."""
    child = proc.Child(["/bin/sh", "-c", "sleep 0.2"])

    def no_steps(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s between looks")

    monkeypatch.setattr(proc.time, "sleep", no_steps)
    assert child.wait(timeout=30) == 0
