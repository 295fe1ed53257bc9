"""Stage 1: the bounded read. A regular file of at most 1 MiB, valid UTF-8, checked before any
parsing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from linpodx.errors import NotFound, ProfileError
from linpodx.profile.loader.problems import Collector, Problem

MAX_BYTES = 1024 * 1024
"""Largest profile file accepted (checked before parsing)."""


def read_profile_text(path: Path, display: str | None = None) -> str:
    """The file's text: a regular file of at most 1 MiB, valid UTF-8 (a BOM is dropped)."""
    name = display or str(path)
    col = Collector(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        # A missing file is "not found" like a missing profile or container (exit 4).
        raise NotFound(
            f"profile file not found: {name}", "check the path (relative paths are from here)"
        ) from None
    except OSError as exc:
        raise ProfileError(
            f"cannot read profile {name}: {exc.strerror}", "check the file's permissions"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProfileError(
                f"profile {name} is not a regular file", "give the path of a YAML file"
            )
        chunks = []
        remaining = MAX_BYTES + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise ProfileError(f"cannot read profile {name}: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_BYTES:
        raise ProfileError(
            f"{name}: file is larger than {MAX_BYTES} bytes (1 MiB); refused before parsing",
            "a sandbox profile is a few kilobytes; check that this is the right file",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before) - (before.rfind(b"\n") + 1) + 1
        col.problems.append(
            Problem(f"invalid UTF-8 (byte offset {exc.start})", "", line, column,
                    "save the file as UTF-8")
        )
        raise col.error(f"profile {name} is not valid UTF-8") from None
    return text.removeprefix("\ufeff")
