"""The package's layers, read from its source: imports run one way, programs start in one place.

Read with `ast` (nothing of linpodx is imported): every import, also those inside functions,
and every string that names one of linpodx's modules (what `importlib` or `import_yielding` is
handed), counts as an arrow. Three rules:

- an arrow never runs up the LAYERS table (an arrow within one layer is fine);
- linpodx never imports its own modules by a string passed to `importlib`/`__import__` (outside
  the few LOADERS that take a table of names on purpose), nor under `except ImportError` (a
  missing part of linpodx is a broken install, not a mode to run in);
- a program is started only in SPAWN_POINT;
- no import circle, within one layer too (each module of a circle could only be understood
  with the others; a circle inside `linpodx.cli` passed the first rule). Code under
  `if __name__ == "__main__":` is left out of this rule: it runs only when the file is the
  program, which is then `__main__`, not the module others import.

KNOWN lists violations allowed for now (none since issue 22's step); the test also fails for
an entry that no longer occurs, so the list can only shrink.

Private modules (`_thread`, `re._parser`, `typer._click`: a name part that starts with `_`) are
for the fast path's kernel only, and there exactly the ones KERNEL_PRIVATE names
(linpodx/fastpath/__init__.py says why each pays); the rest of linpodx uses public modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import linpodx

PACKAGE = Path(linpodx.__file__).parent
ROOT = PACKAGE.parent

LAYERS: tuple[tuple[str, ...], ...] = (
    # From the top down. A module belongs to the longest prefix that names it.
    ("linpodx.__main__",),
    ("linpodx.cli",),
    # The fast `run --rm` path (its plan store sits lower, below).
    ("linpodx.fastpath",),
    ("linpodx.mcp", "linpodx.doctor"),
    ("linpodx.snapshot",),
    ("linpodx.containers",),
    # The snapshot package's files on disk (rollback journal, jobs, names, workspace archives,
    # the egress policy kept with a snapshot): the container service reads the journal to
    # refuse acting on a container a rollback holds, so these sit below it; the services that
    # recreate containers through it (service, rollback, worker, lifecycle) sit above.
    (
        "linpodx.snapshot.journal", "linpodx.snapshot.jobs", "linpodx.snapshot.names",
        "linpodx.snapshot.workspace", "linpodx.snapshot.egresskeep",
    ),
    # fastpath.plan: the fast path's plan, which containers writes and fastpath.run reads;
    # integrity: cross-checks of the audit log against the profile store, above both.
    ("linpodx.fastpath.plan", "linpodx.integrity"),
    ("linpodx.egress", "linpodx.approvals"),
    # podman's argv builder takes a Profile, so podman sits above profile; profile's store
    # records into the audit chain, so profile sits above audit.
    ("linpodx.podman",),
    ("linpodx.profile",),
    # The event stream: its reader takes lines with the audit chain's bounded reader.
    ("linpodx.events",),
    ("linpodx.audit",),
    # The ground: generic helpers that know nothing of containers. They may use each other.
    (
        "linpodx.errors", "linpodx.paths", "linpodx.output", "linpodx.proc", "linpodx.fsutil",
        "linpodx.namelock", "linpodx.canonical", "linpodx.ids",
        "linpodx.digest", "linpodx.yielding", "linpodx",
    ),
)  # fmt: skip

LOADERS = frozenset(
    {
        # (file, function) allowed to call importlib with a name that is not a literal: each
        # loads names written as literals elsewhere, which count as arrows of their own.
        ("linpodx/cli/main.py", "build_app"),  # the sub-app table, loaded per command
        ("linpodx/yielding.py", "import_yielding.work"),  # imports at a lower CPU priority
        ("linpodx/egress/runner.py", "_import_quietly"),  # dnspython, warmed up unasked
    }
)

SPAWN_POINT = "linpodx/proc.py"
"""The one module that starts programs: `run` (to completion), `popen` (a long-lived child),
`Child` (the fast path's, without `subprocess`), `spawn_detached` (a helper that outlives
the command that starts it) and `fork_worker` (a copy of this process computing one result)."""

SPAWNS = frozenset(
    {
        *(f"subprocess.{n}" for n in ("Popen", "run", "call", "check_call", "check_output")),
        *(f"subprocess.{n}" for n in ("getoutput", "getstatusoutput")),
        *(f"os.{n}" for n in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system")),
        *(f"os.{n}" for n in ("popen", "execv", "execve", "execl", "execle", "execlp")),
        *(f"os.{n}" for n in ("execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl")),
        *(f"os.{n}" for n in ("spawnle", "spawnlp", "spawnlpe", "spawnvp", "spawnvpe")),
        "pty.fork", "pty.spawn", "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell", "multiprocessing.Process",
    }
)  # fmt: skip

KNOWN: frozenset[tuple[str, str, str]] = frozenset()
"""Violations allowed for now: none (the ones found when the rules were written are fixed).
Keep it empty: fix the code instead of listing what breaks a rule."""


@dataclass(frozen=True)
class Module:
    name: str
    """Dotted name, e.g. linpodx.egress.guard."""
    file: str
    """Path from the repository's root, e.g. linpodx/egress/guard.py."""
    tree: ast.Module


def _modules() -> list[Module]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append(Module(".".join(parts), rel.as_posix(), ast.parse(path.read_bytes())))
    return found


MODULES = _modules()
NAMES = frozenset(m.name for m in MODULES)


def layer_of(name: str) -> int:
    """The layer of module `name`, 0 for the lowest; KeyError if no entry of LAYERS names it."""
    best: tuple[int, int] | None = None
    for depth, entries in enumerate(reversed(LAYERS)):
        for prefix in entries:
            if name == prefix or name.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), depth)
    if best is None:
        raise KeyError(name)
    return best[1]


def _target(name: str) -> str:
    """The module an imported name is in: `linpodx.podman.spawn.which` → linpodx.podman.spawn."""
    while name not in NAMES:
        name = name.rpartition(".")[0]
    return name


def _package(mod: Module) -> str:
    return mod.name if mod.file.endswith("/__init__.py") else mod.name.rpartition(".")[0]


def _own(name: str | None) -> bool:
    return name is not None and (name == "linpodx" or name.startswith("linpodx."))


def _imported(mod: Module, node: ast.stmt) -> list[str]:
    """The linpodx modules an import statement names."""
    if isinstance(node, ast.Import):
        return [_target(a.name) for a in node.names if _own(a.name)]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = _package(mod).split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        if not _own(source):
            return []
        return sorted({_target(f"{source}.{a.name}") for a in node.names})
    return []


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string nodes that are docstrings (prose naming modules is no arrow)."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    ids.add(id(stmt.value))
    return ids


def _named(tree: ast.Module) -> Iterator[str]:
    """Strings that are exactly the name of one of linpodx's modules."""
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in NAMES
            and id(node) not in skip
        ):
            yield node.value


def _is_import_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr == "import_module" or f.attr == "__import__"
    return isinstance(f, ast.Name) and f.id in ("import_module", "__import__")


def _functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name of the enclosing function or "<module>", node) for every node."""

    def walk(node: ast.AST, where: str) -> Iterator[tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name if where == "<module>" else f"{where}.{child.name}"
            yield inner, child
            yield from walk(child, inner)

    return walk(tree, "<module>")


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type
    names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
    return any(
        isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names
    )


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name → dotted origin for imports of the standard library."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    names[a.asname] = a.name
                else:
                    top = a.name.partition(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _annotations(tree: ast.Module) -> set[int]:
    """ids of every node inside a type annotation (`subprocess.Popen[bytes]` starts nothing)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns:
            roots.append(node.returns)
    return {id(n) for root in roots for n in ast.walk(root)}


def arrows(mod: Module) -> set[str]:
    """Every linpodx module `mod` imports or names, itself excluded."""
    found = {t for node in ast.walk(mod.tree) if isinstance(node, ast.stmt)
             for t in _imported(mod, node)}  # fmt: skip
    found.update(_named(mod.tree))
    found.discard(mod.name)
    return found


def _is_main_block(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`"""
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def imported_by_others(mod: Module) -> set[str]:
    """The linpodx modules `mod`'s import statements name, those of its
    `if __name__ == "__main__":` block left out. Strings naming a module are not counted here:
    most name a program started in a process of its own (`python -m linpodx.egress.guardproc`),
    which is no import."""
    body = [stmt for stmt in mod.tree.body if not _is_main_block(stmt)]
    tree = ast.Module(body=body, type_ignores=[])
    found = {t for node in ast.walk(tree) if isinstance(node, ast.stmt)
             for t in _imported(mod, node)}  # fmt: skip
    found.discard(mod.name)
    return found


def circles(mods: list[Module]) -> list[list[str]]:
    """The import circles among `mods` (strongly connected parts of more than one module,
    each sorted), found with Tarjan's algorithm."""
    graph = {m.name: imported_by_others(m) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph.get(name, ())):
            if target not in graph:
                continue
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == name:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def violations(mods: list[Module]) -> set[tuple[str, str, str]]:
    found: set[tuple[str, str, str]] = set()
    for mod in mods:
        here = layer_of(mod.name)
        for target in arrows(mod):
            if layer_of(target) > here:
                found.add(("upward", mod.file, target))
        for where, node in _functions(mod.tree):
            if _is_import_call(node):
                assert isinstance(node, ast.Call)
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if _own(arg.value):
                        found.add(("string-import", mod.file, arg.value))
                elif (mod.file, where) not in LOADERS:
                    found.add(("dynamic-import", mod.file, where))
            if isinstance(node, ast.Try) and any(map(_catches_import_error, node.handlers)):
                for inner in (n for stmt in node.body for n in ast.walk(stmt)):
                    names = _imported(mod, inner) if isinstance(inner, ast.stmt) else []
                    if _is_import_call(inner):
                        assert isinstance(inner, ast.Call)
                        arg = inner.args[0] if inner.args else None
                        if isinstance(arg, ast.Constant) and _own(arg.value):
                            names = [str(arg.value)]
                    found.update(("guarded-import", mod.file, n) for n in names)
        aliases = _aliases(mod.tree)
        typing_only = _annotations(mod.tree)
        if mod.file != SPAWN_POINT:
            for node in ast.walk(mod.tree):
                if id(node) not in typing_only and isinstance(node, (ast.Name, ast.Attribute)):
                    name = _dotted(node, aliases)
                    if name in SPAWNS:
                        found.add(("spawn", mod.file, name))
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for name in sorted(NAMES):
        try:
            layer_of(name)
        except KeyError:
            unplaced.append(name)
    assert unplaced == [], "add these modules to LAYERS in tests/unit/test_layers.py"


def test_the_layers_hold_and_known_only_shrinks() -> None:
    found = violations(MODULES)
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    assert new == [], f"new violations of the layers (fix the code, do not list them): {new}"
    assert gone == [], f"fixed: remove these from KNOWN in tests/unit/test_layers.py: {gone}"


def test_no_import_circle() -> None:
    found = circles(MODULES)
    assert found == [], f"import circles (make the imports run one way): {found}"


def test_circles_are_found() -> None:
    def mod(name: str, source: str) -> Module:
        return Module(name, name.replace(".", "/") + ".py", ast.parse(source))

    ring = [  # (real names: an import resolves to a module that exists)
        mod("linpodx.cli.main", "def f():\n    from linpodx.cli import surface\n"),
        mod("linpodx.cli.surface", "from linpodx.cli.common import x\n"),
        mod("linpodx.cli.common", "import linpodx.cli.main\n"),
        mod("linpodx.cli.runcmd", "from linpodx.cli import main\n"),
    ]
    assert circles(ring) == [["linpodx.cli.common", "linpodx.cli.main", "linpodx.cli.surface"]]
    named = mod("linpodx.cli.surface", "ARGV = ('python', '-m', 'linpodx.cli.main')\n")
    assert circles([ring[0], named]) == []
    program = "import sys\nif __name__ == '__main__':\n    from linpodx.cli import main\n"
    assert circles([ring[0], mod("linpodx.cli.surface", program)]) == []


def _probe(source: str, file: str = "linpodx/proc.py") -> set[tuple[str, str, str]]:
    name = file.removesuffix(".py").replace("/", ".")
    return violations([Module(name, file, ast.parse(source))])


def test_the_rules_catch_what_they_are_for() -> None:
    # Each rule against a line that breaks it: a check that cannot fail would prove nothing.
    assert _probe("def f():\n    from linpodx.containers import builtin_ref\n") == {
        ("upward", "linpodx/proc.py", "linpodx.containers")
    }
    assert _probe("from .podman import spawn\n") == {
        ("upward", "linpodx/proc.py", "linpodx.podman.spawn")
    }
    assert _probe("MODS = ('linpodx.egress.guard',)\n") == {
        ("upward", "linpodx/proc.py", "linpodx.egress.guard")
    }
    assert _probe("import importlib\nm = importlib.import_module('linpodx.errors')\n") == {
        ("string-import", "linpodx/proc.py", "linpodx.errors")
    }
    assert _probe("import importlib\ndef g(n):\n    return importlib.import_module(n)\n") == {
        ("dynamic-import", "linpodx/proc.py", "g")
    }
    guarded = "try:\n    import linpodx.errors\nexcept (OSError, ImportError):\n    pass\n"
    assert _probe(guarded) == {("guarded-import", "linpodx/proc.py", "linpodx.errors")}
    spawned = "import subprocess as sp\nfrom os import execv as ex\nsp.Popen(['x'])\nex('x', [])\n"
    assert _probe(spawned, "linpodx/egress/netns.py") == {
        ("spawn", "linpodx/egress/netns.py", "subprocess.Popen"),
        ("spawn", "linpodx/egress/netns.py", "os.execv"),
    }
    assert _probe(spawned) == set()  # the spawn point itself
    typed = "import subprocess\ndef f(p: subprocess.Popen[bytes]) -> None:\n    pass\n"
    assert _probe(typed, "linpodx/egress/netns.py") == set()


def _podman_lines(tree: ast.AST) -> list[int]:
    """Lines of list/tuple displays that write a podman command: a first item that finds
    podman (the word "podman", `podman_bin()`, a name like `podman`), followed by a word of
    podman's own written here (`"exec"`). `(podman_bin(), *pull_argv(image))` writes none."""

    def finds_podman(node: ast.expr) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and sub.value == "podman":
                return True
            name = sub.attr if isinstance(sub, ast.Attribute) else getattr(sub, "id", "")
            if "podman" in name.lower():
                return True
        return False

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts
        and not isinstance(node.elts[0], ast.Starred) and finds_podman(node.elts[0])
        and any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts[1:])
    ]  # fmt: skip


def test_podman_command_lines_are_written_only_in_the_podman_package() -> None:
    """One place knows podman's words (`linpodx.podman`); elsewhere a podman command comes
    from a function there. (doctor, `mcp attach` and the guard's launch wrote their own.)"""
    found = {
        m.file: lines
        for m in MODULES
        if not m.name.startswith("linpodx.podman") and (lines := _podman_lines(m.tree))
    }
    assert found == {}


def test_a_podman_command_line_is_seen() -> None:
    probe = ast.parse(
        'a = ["podman", "exec", name]\nb = (engine.podman_bin(), "ps")\n'
        'c = [proc.which("podman") or "podman", "unshare"]\nd = [podman, "info"]\n'
        'e = ["ls", "podman"]\nf = (podman_bin(), *pull_argv(image))\n'
    )
    assert _podman_lines(probe) == [1, 2, 3, 4]


# ---- private modules: the fast path's kernel only -----------------------------------------

KERNEL_PRIVATE = frozenset(
    {
        # CPython's own C sha256 while nothing has imported hashlib (and its OpenSSL).
        ("linpodx/digest.py", "_sha2"),
        ("linpodx/digest.py", "_sha256"),  # its name before 3.12
        # The thread id without importing threading.
        ("linpodx/namelock.py", "_thread"),
    }
)
"""(file, private module) the kernel imports on purpose: a new one is a decision written here."""

KNOWN_PRIVATE: frozenset[tuple[str, str]] = frozenset(
    {
        # typer's completion script and click's exceptions as the running typer raises them;
        # `typer.completion` offers the first two publicly. Only shrinks.
        ("linpodx/cli/surface.py", "typer._click"),
        ("linpodx/cli/surface.py", "typer._completion_classes"),
        ("linpodx/cli/surface.py", "typer._completion_shared"),
    }
)
"""Private modules outside the kernel allowed for now; the test fails for one that is gone."""


def _kernel() -> frozenset[str]:
    """linpodx.fastpath's KERNEL, read from its source."""
    (fastpath,) = [m for m in MODULES if m.name == "linpodx.fastpath"]
    for node in fastpath.tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "KERNEL":
            assert isinstance(node, ast.Assign)
            return frozenset(ast.literal_eval(node.value))
    raise AssertionError("linpodx.fastpath defines no KERNEL")


KERNEL = _kernel()


def _in_kernel(mod: Module) -> bool:
    """Whether `mod` is the fast path's package or a module of its kernel."""
    return mod.name in KERNEL or mod.name == "linpodx.fastpath" or (
        mod.name.startswith("linpodx.fastpath.")
    )


def _private_part(name: str) -> str | None:
    """`re._parser` for `re._parser.parse`, `_thread` for `_thread`; None for a public name
    (dunders such as `__future__` are public)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[: i + 1])
    return None


def private_imports(mod: Module) -> set[str]:
    """The private modules of others (the standard library's, typer's) that `mod` imports, at
    the top, inside functions, or by a string handed to `importlib`."""
    names: list[str] = []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names += [f"{node.module}.{a.name}" for a in node.names]
        elif _is_import_call(node):
            assert isinstance(node, ast.Call)
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                names.append(arg.value)
    return {part for n in names if not _own(n) and (part := _private_part(n))}


def test_no_private_module_outside_the_fast_paths_kernel() -> None:
    found = {(m.file, p) for m in MODULES if not _in_kernel(m) for p in private_imports(m)}
    new = sorted(found - KNOWN_PRIVATE)
    gone = sorted(KNOWN_PRIVATE - found)
    assert new == [], f"private modules outside the fast path's kernel (use public ones): {new}"
    assert gone == [], f"fixed: remove these from KNOWN_PRIVATE: {gone}"


def test_the_kernel_imports_only_the_private_modules_it_names() -> None:
    found = {(m.file, p) for m in MODULES if _in_kernel(m) for p in private_imports(m)}
    assert found == KERNEL_PRIVATE, "a new private module in the kernel: name it in KERNEL_PRIVATE"


def test_private_imports_are_seen() -> None:
    def imports(source: str) -> set[str]:
        return private_imports(Module("linpodx.x", "linpodx/x.py", ast.parse(source)))

    assert imports("from re import _parser\n") == {"re._parser"}
    assert imports("def f():\n    import _thread\n") == {"_thread"}
    assert imports("from _sha2 import sha256\nimport importlib.x\n") == {"_sha2"}
    assert imports("import importlib\nm = importlib.import_module('_json')\n") == {"_json"}
    assert imports("from typer._click import exceptions\n") == {"typer._click"}
    public = (
        "from __future__ import annotations\nimport os.path\nfrom re import compile\n"
        "from linpodx.paths import _root\nfrom ._shared import x\nfrom . import _y\n"
    )
    assert imports(public) == set()
