"""The durable append's tail proof by the line this process wrote last (`writer._written_tail`).

The saved parse is used only while the file's last line is still exactly the bytes written:
every change made behind the process's back (another writer, an edit in place, a truncation,
a replaced file, a swapped directory) must still be seen, as the parser saw it before.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from linpodx.audit import core, writer
from linpodx.audit.chain import Chain, verify_file
from linpodx.canonical import SAFE_INT, canonical_bytes
from linpodx.errors import AuditError

_CHARS = ["a", "z", '"', "\\", "\x00", "\x1f", "é", "\u2028", "\uffff", "\U0001f600", "{", "["]
_INTS = [0, -1, 10**15, SAFE_INT, -SAFE_INT]


def _value(rng: random.Random, depth: int) -> Any:
    pick = rng.randrange(7 if depth < 40 else 4)
    if pick == 0:
        return "".join(rng.choice(_CHARS) for _ in range(rng.randrange(0, 5)))
    if pick == 1:
        return rng.choice(_INTS)
    if pick == 2:
        return rng.choice([True, False, None])
    if pick == 3:
        # A float or an int out of range has no canonical form: the entry fails alone.
        return 1.5 if rng.random() < 0.05 else SAFE_INT + 1 if rng.random() < 0.05 else "x"
    if pick == 4 and depth == 1 and rng.random() < 0.1:
        return _nest(core.MAX_DEPTH - 2)
    if pick in (4, 5):
        return {rng.choice(_CHARS): _value(rng, depth + 1) for _ in range(rng.randrange(0, 3))}
    return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 3))]


def _nest(depth: int) -> Any:
    """A list nested `depth` deep: as data's value, with its braces and the record's, at the
    nesting bound."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _typed(fields: tuple[Any, ...]) -> list[Any]:
    """Fields compared with their types (True == 1 otherwise), data by its canonical bytes."""
    return [(type(f), canonical_bytes(f) if isinstance(f, dict) else f) for f in fields]


@pytest.mark.parametrize("seed", range(4))
def test_a_remembered_line_is_what_the_fast_parser_returns(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible fuzz, not a secret
    path = tmp_path / "a.jsonl"
    chain = Chain(path)
    kept = dropped = 0
    for _ in range(150):
        data = {rng.choice(_CHARS): _value(rng, 1) for _ in range(rng.randrange(0, 4))}
        try:
            chain.append("a.b", data)
        except AuditError:
            continue
        line = path.read_bytes().splitlines()[-1]
        assert writer._WRITTEN[str(path)][0] == line
        mine = writer._written_tail(str(path), line)
        if mine is None:
            dropped += 1
            continue
        kept += 1
        fast = core.fast_fields(line)
        assert fast is not None, line
        assert _typed(mine) == _typed(fast) == _typed(core.parse_strict(line)), line
    assert kept > 30 and dropped > 3, (kept, dropped)  # both kinds met, not a trivial pass
    assert verify_file(path).ok


def _warm(path: Path) -> Chain:
    """A chain of two records appended by this process, whose last line it remembers."""
    chain = Chain(path)
    chain.append("a.first", {"k": "v"})
    chain.append("a.second", {"k": "wwww"})
    assert writer._written_tail(str(path), path.read_bytes().splitlines()[-1]) is not None
    return chain


def _seqs_and_links(path: Path) -> list[tuple[int, bool]]:
    recs = [json.loads(line) for line in path.read_bytes().splitlines()]
    return [(r["seq"], r["prev"] == (recs[i - 1]["hash"] if i else r["prev"]))
            for i, r in enumerate(recs)]


def test_a_record_another_process_appended_is_chained_onto(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    chain = _warm(path)
    pid = os.fork()
    if pid == 0:  # another writer of the same file, with its own copy of the memory
        try:
            Chain(path).append("a.other", {"k": "v"})
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    chain.append("a.third", {"k": "v"})
    assert _seqs_and_links(path) == [(0, True), (1, True), (2, True), (3, True)]
    assert verify_file(path).ok


def test_the_last_record_edited_in_place_is_still_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    chain = _warm(path)
    raw = path.read_bytes()
    edited = raw.replace(b'"wwww"', b'"xxxx"')  # same size, same inode, hash now wrong
    assert len(edited) == len(raw) and edited != raw
    with open(path, "r+b") as f:
        f.write(edited)
    with pytest.raises(AuditError, match="last record is damaged"):
        chain.append("a.third", {"k": "v"})
    assert path.read_bytes() == edited


def test_a_truncated_log_is_chained_onto_its_new_last_record(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    chain = _warm(path)
    first = path.read_bytes().splitlines(keepends=True)[0]
    os.truncate(path, len(first))
    got = chain.append("a.third", {"k": "v"})
    assert got.seq == 1 and got.prev == json.loads(first)["hash"]
    assert verify_file(path).ok


def test_a_replaced_log_is_chained_onto_its_own_last_record(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    chain = _warm(path)
    other = Chain(tmp_path / "b.jsonl")
    only = other.append("b.only", {"k": "v"})
    os.replace(other.path, path)
    got = chain.append("a.third", {"k": "v"})
    assert got.seq == 1 and got.prev == only.hash
    assert verify_file(path).ok


def test_a_swapped_log_dir_is_chained_onto_the_new_files_record(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    path = logs / "a.jsonl"
    chain = _warm(path)
    new = tmp_path / "new"
    new.mkdir(mode=0o700)
    only = Chain(new / "a.jsonl").append("b.only", {"k": "v"})
    logs.rename(tmp_path / "old")
    new.rename(logs)
    got = chain.append("a.third", {"k": "v"})
    assert got.seq == 1 and got.prev == only.hash
    assert verify_file(path).ok
    assert len((tmp_path / "old" / "a.jsonl").read_bytes().splitlines()) == 2
