"""Unit tests for the small core modules: canonical JSON, ids, output, errors, CLI entry."""

from __future__ import annotations

import io
import json
import os
import stat

import pytest

from linpodx import canonical, ids, output
from linpodx.canonical import CanonicalError, canonical_str, strict_loads
from linpodx.errors import EngineError, LinpodxError, NotFound, ProfileError
from linpodx.fsutil import atomic_write, create_exclusive


class TestCanonical:
    def test_sorted_compact(self) -> None:
        assert canonical_str({"b": 1, "a": [True, None, "x"]}) == '{"a":[true,null,"x"],"b":1}'

    def test_rfc8785_key_order_is_utf16(self) -> None:
        # U+1F600 (pair D83D DE00) sorts before U+FB01 in UTF-16, after it by code point.
        value = {"\ufb01": 1, "\U0001f600": 2}
        assert canonical_str(value) == '{"\U0001f600":2,"\ufb01":1}'

    def test_string_escapes_minimal(self) -> None:
        assert canonical_str('a\n\u001f"\\é') == '"a\\n\\u001f\\"\\\\é"'

    @pytest.mark.parametrize("bad", [1.5, 2**53, -(2**53), "\ud800", {"\udc00": 1}, b"x"])
    def test_refuses(self, bad: object) -> None:
        with pytest.raises(CanonicalError):
            canonical_str(bad)

    def test_depth_bound(self) -> None:
        deep: object = 1
        for _ in range(canonical.MAX_DEPTH + 2):
            deep = [deep]
        with pytest.raises(CanonicalError):
            canonical_str(deep)


class TestStrictLoads:
    @pytest.mark.parametrize(
        "text",
        [
            '{"a":1,"a":2}',
            '{"a":NaN}',
            '{"a":Infinity}',
            "[-Infinity]",
            '{"a":9007199254740992}',
            '"\\ud800"',
            '["ok", "\\uDC00"]',
            '{"\\ud83d":1}',
            '"\ud800"',
            "[" * 100 + "]" * 100,
            "{",
        ],
    )
    def test_refuses(self, text: str) -> None:
        with pytest.raises(CanonicalError):
            strict_loads(text)

    def test_invalid_utf8(self) -> None:
        with pytest.raises(CanonicalError, match="UTF-8"):
            strict_loads(b'{"a":"\xff"}')

    def test_floats_opt_in(self) -> None:
        with pytest.raises(CanonicalError):
            strict_loads("1.5")
        assert strict_loads("1.5", allow_floats=True) == 1.5
        with pytest.raises(CanonicalError, match="non-finite"):
            strict_loads("[1e999]", allow_floats=True)

    def test_surrogate_pairs_and_escaped_backslashes_pass(self) -> None:
        assert strict_loads('"\\ud83d\\ude00"') == "\U0001f600"
        assert strict_loads('"\\\\ud800"') == "\\ud800"  # a backslash, then text

    def test_escaped_names_decode(self) -> None:
        assert strict_loads('{"m":"tools\\u002fcall"}') == {"m": "tools/call"}

    def test_brackets_inside_strings_do_not_count_as_depth(self) -> None:
        assert strict_loads(json.dumps({"s": "[" * 200})) == {"s": "[" * 200}


class TestIds:
    def test_ulid_shape_and_order(self) -> None:
        a = ids.new_ulid(now_ms=1_000)
        b = ids.new_ulid(now_ms=2_000)
        assert ids.ULID_RE.match(a) and ids.ULID_RE.match(b)
        assert a < b

    def test_prefixed(self) -> None:
        value = ids.new_id("prof")
        assert ids.is_id(value, "prof")
        assert not ids.is_id(value, "sess")
        assert not ids.is_id("prof_short", "prof")


class TestOutput:
    def test_kv_alignment(self) -> None:
        assert output.kv_line("status", "ok") == "status:  ok"
        assert output.kv_line("mcp", "3 rules") == "mcp:     3 rules"
        assert output.kv_line("profile", "p") == "profile: p"
        assert output.kv_line("rolled_back", True) == "rolled_back: true"

    def test_safe_text_escapes_terminal_control(self) -> None:
        hostile = "ok\x1b[2J\x07\u2028\x9b[1m"
        shown = output.safe_text(hostile)
        assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown
        assert "\u2028" not in shown
        assert shown.startswith("ok\\x1b[2J")

    def test_safe_text_escapes_bidirectional_controls(self) -> None:
        """A right-to-left override could make a terminal show `write_file` reversed or
        reordered: every bidirectional control is escaped, other text (accents, CJK) is not."""
        for o in (0x061C, 0x200E, 0x200F, 0x202A, 0x202E, 0x2066, 0x2069):
            shown = output.safe_text(f"read{chr(o)}_file")
            assert shown == f"read\\u{o:04x}_file"
        assert output.safe_text("café 工具 \u200d") == "café 工具 \u200d"
        # Invisible: two strings that look the same must not print the same.
        for o in (0x200B, 0x2060, 0xFEFF):
            assert output.safe_text(f"read{chr(o)}_file") == f"read\\u{o:04x}_file"

    def test_safe_text_keeps_one_joiner_and_escapes_what_hides_data(self) -> None:
        family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one ZWJ at a time
        assert output.safe_text(family + " \u2764\ufe0f") == family + " \u2764\ufe0f"
        assert output.safe_text("a\u200c\u200db") == "a\\u200c\\u200db"
        assert output.safe_text("x\U000e0041") == "x\\U000e0041"
        assert output.safe_text("x\U000e0041", limit=5) == "x…(+10 chars)"
        assert output.hides_text({"k": "x\U000e0041"}) and not output.hides_text(family)

    def test_safe_text_caps(self) -> None:
        assert output.safe_text("x" * 50, limit=10).startswith("x" * 10 + "…(+40")

    def test_json_output_escapes_what_could_drive_a_terminal(self) -> None:
        """`--json` output shown on a terminal (`… --json | less`) must not carry DEL, C1
        controls, line separators or bidirectional controls raw; parsers see the same
        document."""
        value = "a\u202eb\u2066c\x85d\x9be\x7ff\u2028g café 工具 \x1b"
        for compact in (False, True):
            buf = io.StringIO()
            output.print_json({"v": value}, buf, compact=compact)
            text = buf.getvalue()
            assert json.loads(text) == {"v": value}
            assert all(ch not in text for ch in "\u202e\u2066\x85\x9b\x7f\u2028\x1b")
            assert "café 工具" in text  # other non-ASCII text stays readable
            assert "\\u202e" in text and "\\u009b" in text

    def test_safe_text_cap_never_cuts_an_escape(self) -> None:
        # "\x1b" is 4 characters: 5 leave room for one and a half; only the whole one stays.
        assert output.safe_text("\x1b" * 10, limit=5) == "\\x1b…(+36 chars)"
        assert output.safe_text("ab\u202e", limit=7) == "ab…(+6 chars)"
        assert output.safe_text("ab\u202e", limit=8) == "ab\\u202e"
        # Short strings: as before.
        assert output.safe_text("a\x1bb", limit=6) == "a\\x1bb"
        assert output.safe_text("a\x1bb", limit=5) == "a\\x1b…(+1 chars)"

    def test_safe_text_long_value_counts_what_was_cut(self) -> None:
        value = "y" * 1_000_000 + "\x1b" + "\u2066"
        assert output.safe_text(value, limit=3) == "yyy…(+" + str(999_997 + 4 + 6) + " chars)"

    def test_envelope_shapes(self) -> None:
        ok = output.envelope("sandbox validate", {"a": 1})
        assert ok == {
            "schema": "linpodx/v1",
            "command": "sandbox validate",
            "ok": True,
            "result": {"a": 1},
        }
        err = output.envelope("x", error=NotFound("profile not found: p", "apply it"))
        assert err["ok"] is False and err["error"]["exit_code"] == 4


class TestErrors:
    def test_diagnostics(self) -> None:
        assert LinpodxError("boom", "do this").diagnostics() == "error: boom\nhint: do this"

    def test_engine_error_shows_engine_words(self) -> None:
        err = EngineError(
            "podman create failed",
            "check the image",
            argv=["podman"],
            stderr="Error: no such image\n",
        )
        assert (
            err.diagnostics()
            == "error: podman create failed\n  Error: no such image\nhint: check the image"
        )

    def test_profile_error_lists_problems(self) -> None:
        err = ProfileError("profile is invalid", "fix it", problems=["f.yml:1:1: bad"])
        assert err.diagnostics().splitlines() == [
            "error: f.yml:1:1: bad",
            "error: profile is invalid",
            "hint: fix it",
        ]


class TestFiles:
    def test_atomic_write_private(self, tmp_path) -> None:  # type: ignore[no-untyped-def]
        target = tmp_path / "d" / "f.json"
        atomic_write(target, b"one")
        atomic_write(target, b"two")
        assert target.read_bytes() == b"two"
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
        assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
        assert [p.name for p in target.parent.iterdir()] == ["f.json"]

    def test_create_exclusive_first_wins(self, tmp_path) -> None:  # type: ignore[no-untyped-def]
        target = tmp_path / "answers" / "answer"
        assert create_exclusive(target, b"first") is True
        assert create_exclusive(target, b"second") is False
        assert target.read_bytes() == b"first"
        assert sorted(os.listdir(target.parent)) == ["answer"]


class TestCliEntry:
    def test_unknown_command_is_usage_error(self, cli) -> None:  # type: ignore[no-untyped-def]
        res = cli("no-such-command")
        assert res.exit_code == 2
        assert res.stderr.startswith("error: No such command")
        assert "hint: run `linpodx --help`" in res.stderr
        assert "Traceback" not in res.stderr

    def test_version(self, cli) -> None:  # type: ignore[no-untyped-def]
        res = cli("version")
        assert res.exit_code == 0 and res.stdout.startswith("linpodx ")


def test_ensure_dir_makes_every_missing_parent_private(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from linpodx.paths import ensure_dir

    target = tmp_path / "a" / "b" / "c"
    ensure_dir(target)
    for d in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_cli_loads_only_the_module_of_the_command() -> None:
    """`linpodx ps` must not pay for importing the MCP stack or the profile schema machinery."""
    import subprocess
    import sys

    mods = (
        "linpodx.cli.sandbox",
        "linpodx.cli.mcp",
        "linpodx.cli.approvals",
        "linpodx.cli.containers",
    )
    code = (
        "import sys; from linpodx.cli.main import build_app; build_app('ps'); "
        f"print(sorted(m for m in {mods} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['linpodx.cli.containers']"


def test_proc_lending_lets_children_inherit_a_lock_and_only_inside_the_block(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A program started while the fd is lent holds the flock even after this process let go
    of it (what keeps a stray `podman rename` of a killed rollback from racing recovery)."""
    import fcntl
    import os

    from linpodx import proc

    lock = tmp_path / "lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    outside = proc.run(["ls", "/proc/self/fd"]).stdout.split()
    with proc.lending(fd):
        inside = proc.run(["ls", "/proc/self/fd"]).stdout.split()
        # A program that outlives the call (as one outlives a killed linpodx): it holds the
        # lock after our own fd is closed, until it ends.
        proc.run(["sh", "-c", "sleep 2 </dev/null >/dev/null 2>&1 &"])
    after = proc.run(["ls", "/proc/self/fd"]).stdout.split()
    assert str(fd) in inside and str(fd) not in outside and str(fd) not in after
    os.close(fd)
    probe = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
        assert held
        import time

        deadline = time.monotonic() + 30
        while True:  # free once that program has ended
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        os.close(probe)


def test_validators_refuse_a_trailing_newline() -> None:
    """Python's `$` also matches before a final newline: every anchored validator uses `\\Z`."""
    from linpodx import ids
    from linpodx.podman import runline
    from linpodx.snapshot import names

    good = ids.new_ulid()
    assert ids.ULID_RE.match(good) and not ids.ULID_RE.match(good + "\n")
    assert not ids.is_id(f"sess_{good}\n", "sess")
    for bad in ("agent-1\n",):
        with __import__("pytest").raises(Exception, match="name"):
            runline.validate_name(bad)
        with __import__("pytest").raises(Exception, match="name"):
            names.check_container_name(bad)
    with __import__("pytest").raises(Exception, match="label"):
        names.check_label("before\n")


def test_stream_escaper_matches_line_escaping_across_any_split() -> None:
    """`linpodx logs` escapes piece by piece: split anywhere (inside a UTF-8 sequence, between
    the CR and LF of a CRLF), the output is what escaping whole lines gives."""
    from linpodx.output import StreamEscaper, safe_text

    data = "héllo\x1b[31m\r\nwo\trld\r\nü\u202e end\r".encode() + b"\xff\n"
    want = "\n".join(safe_text(line.rstrip("\r")) if i < 3 else safe_text(line)
                     for i, line in enumerate(data.decode("utf-8", "replace").split("\n")))
    for size in range(1, len(data) + 1):
        e = StreamEscaper()
        got = "".join(e.feed(data[i:i + size]) for i in range(0, len(data), size)) + e.end()
        assert got == want, size
    assert "\x1b" not in want and "\\x0d" in want
