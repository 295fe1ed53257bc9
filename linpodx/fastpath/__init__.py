"""The fast `linpodx run --rm` path, and the import budget it keeps.

`linpodx run --rm IMAGE true` should cost little more than `podman run --rm IMAGE true`
(bench/bench_run.py: at most 1.25x). Python needs ~20 ms to start; what a full run imports
(typer, the profile model and loader, the argv builder, dataclasses, pathlib, subprocess, …)
costs ~100 ms more. So the plain forms of `run` take this package instead:

- `argv`: the parser of `run`'s plain forms (typer's parser for everything else);
- `plan`: the stored podman flags of a profile revision on this host, used only when
  everything they were made from is unchanged (the container service writes them);
- `run`: the run itself: the plan, the lock, the audit record, podman started, and only then
  the full modules, while podman works.

Before podman starts the fast path loads nothing but this package and the modules KERNEL
names, plus the standard library's cheapest modules (STDLIB). tests/unit/test_fastrun.py holds
the fast path to these two lists: an import outside them fails it. Adding a module to KERNEL
means it, and everything it imports at the top, stays within this budget.

Inside the kernel (and this package) a few habits pay for the budget, written down here once:

- `TYPE_CHECKING = False` instead of `from typing import TYPE_CHECKING`: importing typing costs
  ~4 ms. mypy is told to treat the name as true (`always_true` in pyproject.toml). Code outside
  the kernel imports typing's.
- Heavy imports inside the functions that need them (pathlib, threading, hashlib, the container
  service), never at a kernel module's top.
- `linpodx.paths` keeps string forms of its paths (`ensure_dir_str`, `check_dir_str`, the
  `*_root` functions) beside the Path ones: the fast path never imports pathlib before podman
  starts.
- `linpodx.digest` uses CPython's own C sha256 (`_sha2`, `_sha256` before 3.12) while nothing
  has imported hashlib, whose import loads OpenSSL (~5 ms); hashlib once anything has.
- `linpodx.namelock` takes the thread id from `_thread`, which threading wraps, so that taking
  a lock does not import threading.
- After podman has started, the full modules are imported at a lower CPU priority
  (`linpodx.yielding`), so they do not slow podman down.

Outside the kernel and this package, code is ordinary: typing's TYPE_CHECKING, public modules.
"""

from __future__ import annotations

KERNEL = (
    # Ground modules.
    "linpodx", "linpodx.errors", "linpodx.paths", "linpodx.output", "linpodx.proc",
    "linpodx.fsutil", "linpodx.namelock", "linpodx.canonical", "linpodx.ids", "linpodx.digest",
    "linpodx.yielding",
    # The audit record's append.
    "linpodx.audit", "linpodx.audit.core", "linpodx.audit.writer",
    # The profile store's read of a pointer and its mount sources' host check.
    "linpodx.profile", "linpodx.profile.pointer", "linpodx.profile.hostpaths",
    # podman: the run line, the flags the plan is checked against, host facts, the seccomp
    # file, mount pins, signal holding.
    "linpodx.podman", "linpodx.podman.runline", "linpodx.podman.flags", "linpodx.podman.probe",
    "linpodx.podman.seccomp", "linpodx.podman.mountpin", "linpodx.podman.spawn",
    # A guarded run: the guard's files and its launch, before podman starts.
    "linpodx.egress", "linpodx.egress.launch",
)  # fmt: skip
"""linpodx's modules outside this package the fast path may load before podman starts (besides
the command's entry, `linpodx.cli.main`, which runs it and keeps to this budget too)."""

STDLIB = (
    # What `site` loads at every start-up (counted here: the check runs Python with -S).
    "os", "os.path", "posixpath", "genericpath", "stat", "_stat", "_collections_abc",
    # Files, locks, the user's rlimits and ids, signals.
    "errno", "fcntl", "pwd", "resource", "signal", "math", "encodings.ascii",
    # The plan and the audit record: JSON, sha256 (CPython's own; see above).
    "json", "json.decoder", "json.encoder", "json.scanner", "_json", "_sha2", "_sha256",
    # `from __future__ import annotations`; contextlib and importlib (`cli.main`, `paths`).
    "__future__", "contextlib", "importlib", "importlib._bootstrap",
    "importlib._bootstrap_external", "warnings", "collections", "collections.abc", "_collections",
    "functools", "_functools", "itertools", "keyword", "operator", "_operator", "reprlib",
    "types", "copyreg",
    # `re` (json.decoder's and the flag builder's patterns), and the enum it is built on.
    "re", "re._casefix", "re._compiler", "re._constants", "re._parser", "_sre", "enum",
    # A guarded run: the guard's ready socket (`linpodx.egress.launch`).
    "socket", "_socket", "select", "selectors", "array",
)  # fmt: skip
"""Standard library modules the fast path may load before podman starts, beyond those the
interpreter has loaded before linpodx is imported."""
