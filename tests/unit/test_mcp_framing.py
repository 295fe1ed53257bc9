"""Framing: split on the byte \\n only, bounded memory under hostile lines."""

from __future__ import annotations

import os
import threading
import tracemalloc

from linpodx.mcp.framing import FrameReader, Line, LineSplitter, Oversize


def test_splits_on_newline_byte_only() -> None:
    s = LineSplitter(1024)
    # U+2028, U+2029 and U+0085 encoded in UTF-8 are not line breaks for the transport.
    text = '{"a":"x\u2028y\u0085z\u2029"}'.encode()
    frames = s.feed(text + b"\n" + b'{"b":1}\n')
    assert frames == [Line(text), Line(b'{"b":1}')]


def test_partial_lines_across_chunks() -> None:
    s = LineSplitter(1024)
    assert s.feed(b'{"a":') == []
    assert s.feed(b"1}\n{") == [Line(b'{"a":1}')]
    assert s.finish() == [Line(b"{")]


def test_line_exactly_at_bound_passes_one_over_is_dropped() -> None:
    s = LineSplitter(8)
    assert s.feed(b"12345678\n") == [Line(b"12345678")]
    frames = s.feed(b"123456789\nok\n")
    assert isinstance(frames[0], Oversize) and frames[0].size == 9
    assert frames[1] == Line(b"ok")


def test_oversize_line_is_never_accumulated() -> None:
    s = LineSplitter(1000)
    chunk = b"x" * 4096
    for _ in range(100):
        assert s.feed(chunk) == []
        assert s.buffered == 0  # discarding: nothing kept
    frames = s.feed(b'tail\n{"jsonrpc":"2.0"}\n')
    assert isinstance(frames[0], Oversize)
    assert frames[0].size == 100 * 4096 + 4
    assert frames[0].head == b"x" * 256
    assert frames[1] == Line(b'{"jsonrpc":"2.0"}')


def test_64mib_line_memory_stays_near_the_bound() -> None:
    """A hostile 64 MiB line through a real pipe: peak allocation stays near the bound."""
    bound = 1024 * 1024
    r, w = os.pipe()
    total = 64 * 1024 * 1024
    block = b"A" * (1024 * 1024)

    def writer() -> None:
        for _ in range(total // len(block)):
            os.write(w, block)
        os.write(w, b'\n{"jsonrpc":"2.0","method":"ping","id":1}\n')
        os.close(w)

    t = threading.Thread(target=writer)
    tracemalloc.start()
    t.start()
    reader = FrameReader(r, bound)
    first = reader.read_frame()
    second = reader.read_frame()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t.join()
    os.close(r)
    assert isinstance(first, Oversize) and first.size == total
    assert second == Line(b'{"jsonrpc":"2.0","method":"ping","id":1}')
    # The bound plus a few read chunks, far below the 64 MiB that was sent.
    assert peak < 4 * bound, peak
