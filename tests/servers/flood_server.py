"""A hostile MCP "server" that floods the bridge (issue 25 #1), then exits.

`python3 flood_server.py MODES SECONDS`: MODES is a comma-separated subset of `garbage` (`x\\n`
lines on stdout: invalid JSON), `ids` (answers to an id nobody asked for) and `stderr` (lines on
stderr), written as fast as the pipes take them for SECONDS seconds.
"""

from __future__ import annotations

import os
import sys
import time

modes = set(sys.argv[1].split(","))
end = time.monotonic() + float(sys.argv[2])
chunks = []
if "garbage" in modes:
    chunks.append((1, b"x\n" * 4096))
if "ids" in modes:
    chunks.append((1, b'{"jsonrpc":"2.0","id":424242,"result":{"content":[]}}\n' * 256))
if "stderr" in modes:
    chunks.append((2, (b"E" * 99 + b"\n") * 128))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


while time.monotonic() < end:
    for fd, data in chunks:
        write_all(fd, data)
