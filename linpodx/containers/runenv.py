"""A run's own environment: `run -e KEY[=VALUE]`, `--env-file FILE` and `--secret NAME[,…]`.

This is how a person gives an agent its API key, so the values are kept out of everything that
lasts or that others can read:

- not in the profile revision, the run spec, the run plan, the audit log or the events: those
  get the variables' names only (`RunEnv.keys`) and the secrets' names (`RunEnv.secrets`);
- not on podman's argv, which every user of the machine can read in /proc/PID/cmdline: podman
  is given `--env-file=/dev/fd/N`, where N is an anonymous memory file (memfd) that holds the
  `KEY=VALUE` lines, lent to that one `podman create` (`proc.lending`) and closed right after.
  Nothing is written to disk, so nothing is left behind by a crash or a full disk. The other
  way podman offers, `--env KEY` with the value in podman's own environment, was not taken:
  podman reads its own environment too (`HOME`, `TMPDIR`, `CONTAINERS_*`, `XDG_*`), so a run's
  variable of such a name would change where podman keeps its storage.
- podman secrets (`podman secret create`) are passed by name; podman itself puts the value in
  the container (a file under /run/secrets, or with `type=env` a variable).

Podman keeps a container's environment in its own database: `podman inspect` (by the same user)
shows those values, as it shows the profile's. A variable a run sets that the profile also sets
(or `HOME`) is refused rather than silently overridden, either way.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from linpodx.errors import InvalidInput, NotFound

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# podman's own rule for secret names, and what a mount target may be (no comma: podman splits
# `--secret` on commas, so a comma in a part would be read as another option).
_SECRET_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}\Z")
_MOUNT_TARGET_RE = re.compile(r"^[A-Za-z0-9_./-]+\Z")
MAX_ENV_FILE_BYTES = 1 << 20
"""An env file is a few lines; anything near this is not one."""


@dataclass(frozen=True)
class RunEnv:
    """The resolved `-e`/`--env-file`/`--secret` of one run."""

    keys: tuple[str, ...] = ()
    """The variables' names, in the order podman gets them."""
    content: bytes = field(default=b"", repr=False)
    """`KEY=VALUE` lines for podman's `--env-file` (the values: never stored, never printed)."""
    secrets: tuple[str, ...] = ()
    """podman `--secret` values: `NAME[,type=…][,target=…]`, names only."""

    def secret_names(self) -> tuple[str, ...]:
        """The secrets' names (what the audit records)."""
        return tuple(s.split(",", 1)[0] for s in self.secrets)


def valid_key(key: object) -> bool:
    """Whether `key` is a variable name a run may set (`KEY_RE`)."""
    return isinstance(key, str) and _KEY_RE.match(key) is not None


def _value_problem(value: str) -> str | None:
    # podman reads an env file line by line (and drops a line's trailing CR).
    if any(c in value for c in "\n\r\x00"):
        return "a newline, carriage return or NUL"
    return None


def _check_key(key: str, where: str) -> str:
    if not _KEY_RE.match(key):
        raise InvalidInput(
            f"invalid environment variable name in {where}: {key[:64]!r}",
            "use a name like API_KEY: letters, digits and '_', not starting with a digit",
        )
    return key


def _from_here(key: str, where: str, environ: Mapping[str, str]) -> str:
    """`KEY` without a value: linpodx's own environment's, as podman does; refused when unset
    (podman would skip it, and an agent would start without its key, saying nothing)."""
    if key not in environ:
        raise InvalidInput(
            f"{where}: {key} is not set in this environment",
            f"export {key} first, or give {where.split()[0]} {key}=VALUE",
        )
    return environ[key]


def _read_env_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_ENV_FILE_BYTES + 1)
    except FileNotFoundError:
        raise NotFound(
            f"env file not found: {path}", "give the path of a file of KEY=VALUE lines"
        ) from None
    except OSError as exc:
        raise InvalidInput(
            f"cannot read env file {path}: {exc.strerror or exc}",
            "check the path and its permissions",
        ) from None
    if len(data) > MAX_ENV_FILE_BYTES:
        raise InvalidInput(
            f"env file {path} is larger than {MAX_ENV_FILE_BYTES} bytes",
            "an env file holds KEY=VALUE lines",
        )
    return data


def parse_env_file(data: bytes, path: str, environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The `(KEY, VALUE)` pairs of an env file in podman's format: `KEY=VALUE` lines, `KEY`
    alone for this environment's value, `#` comments and blank lines skipped, leading blanks of
    a line ignored, the value taken as it is (no quotes removed)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInput(
            f"env file {path} is not UTF-8 text", "an env file holds KEY=VALUE lines"
        ) from None
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r").lstrip(" \t")
        if not line or line.startswith("#"):
            continue
        where = f"--env-file {path} line {number}"
        key, eq, value = line.partition("=")
        # Nothing of the line is shown: the line of a value pasted on several lines (a PEM
        # key's) reads as a name, or as none, and an error would print the key's material.
        if not _KEY_RE.match(key):
            raise InvalidInput(
                f"{where} is not a KEY=VALUE line with a valid variable name (not shown: it "
                "may be part of a value)",
                "one variable a line, its name of letters, digits and '_'; a value cannot "
                "span lines",
            )
        if not eq and key not in environ:
            raise InvalidInput(
                f"{where} names a variable that is not set in this environment (not shown: "
                "it may be part of a value)",
                "export it first, or write KEY=VALUE on one line",
            )
        pairs.append((key, value if eq else environ[key]))
    return pairs


def parse_secret(arg: str) -> str:
    """podman's `--secret` value for `NAME[,type=mount|env][,target=T]`, rebuilt from its checked
    parts (so nothing else reaches podman's option parser)."""
    name, *options = arg.split(",")
    if not _SECRET_NAME_RE.match(name):
        raise InvalidInput(
            f"invalid secret name in --secret: {name[:64]!r}",
            "give the name of a podman secret (`podman secret ls`), like api-key",
        )
    opts: dict[str, str] = {}
    for option in options:
        key, eq, value = option.partition("=")
        if key not in ("type", "target") or not eq or not value or key in opts:
            raise InvalidInput(
                f"invalid --secret option: {option[:64]!r}",
                "use --secret NAME, --secret NAME,target=PATH or --secret NAME,type=env,target=VAR",
            )
        opts[key] = value
    kind = opts.get("type", "mount")
    if kind not in ("mount", "env"):
        raise InvalidInput(
            f"invalid --secret type: {kind[:32]!r}", "use type=mount (the default) or type=env"
        )
    target = opts.get("target")
    if target is not None:
        if kind == "env":
            _check_key(target, "--secret target")
        elif not _MOUNT_TARGET_RE.match(target) or ".." in target.split("/"):
            raise InvalidInput(
                f"invalid --secret target: {target[:64]!r}",
                "use a file name or an absolute path of letters, digits, '_', '.', '-', '/'",
            )
    parts = [name] + [f"{k}={opts[k]}" for k in ("type", "target") if k in opts]
    return ",".join(parts)


def resolve(
    env: Sequence[str],
    env_files: Sequence[str],
    secrets: Sequence[str],
    *,
    reserved: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
) -> RunEnv:
    """The run's environment: env files first, then `-e`, a later value of a name replacing an
    earlier one (as podman does). `reserved` names the variables that are not the run's to set
    (the profile's `env` and `HOME`), each with who sets it. InvalidInput (NotFound for a
    missing env file) before anything runs, without any value in the message."""
    here = os.environ if environ is None else environ
    values: dict[str, str] = {}
    for path in env_files:
        for key, value in parse_env_file(_read_env_file(path), path, here):
            values.pop(key, None)
            values[key] = value
    for arg in env:
        key, eq, value = arg.partition("=")
        _check_key(key, "-e")
        values.pop(key, None)
        values[key] = value if eq else _from_here(key, f"-e {key}", here)
    for key, value in values.items():
        if key in reserved:
            raise InvalidInput(
                f"{key} is set by {reserved[key]}; a run cannot set it too",
                "use another name, or change the profile's env and apply it again",
            )
        problem = _value_problem(value)
        if problem is not None:
            raise InvalidInput(
                f"the value of {key} has {problem}, which podman cannot be given",
                "give a value on one line",
            )
    parsed = tuple(parse_secret(s) for s in secrets)
    names = [s.split(",", 1)[0] for s in parsed]
    if len(set(names)) != len(names):
        raise InvalidInput("a secret is named twice in --secret", "name each secret once")
    for s in parsed:
        if ",type=env" in s:
            target = s.rsplit("target=", 1)[1] if "target=" in s else s.split(",", 1)[0]
            if target in reserved or target in values:
                raise InvalidInput(
                    f"--secret {s.split(',', 1)[0]} sets {target}, which is set already",
                    "give the secret another target",
                )
    content = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
    return RunEnv(keys=tuple(values), content=content, secrets=parsed)


@contextlib.contextmanager
def env_fd(run_env: RunEnv) -> Iterator[int | None]:
    """A memory file holding `run_env`'s `KEY=VALUE` lines, open while the block runs (None
    when the run sets no variable). Its descriptor is close-on-exec: the caller lends it to the
    one podman that reads it (`proc.lending`), so no other child inherits it."""
    if not run_env.content:
        yield None
        return
    fd = os.memfd_create("linpodx-env", os.MFD_CLOEXEC)
    try:
        view = memoryview(run_env.content)
        while view:
            view = view[os.write(fd, view) :]
        yield fd
    finally:
        os.close(fd)
