"""Run plans: a stored copy of the podman flags one profile revision gives on this host.

Building a container's argv needs the validated profile, and loading that means the profile
model, its loader and the argv builder: ~40 ms of imports before podman could start, on a
command (`linpodx run --rm … true`) that podman itself runs in ~0.3 s. So whenever linpodx
builds those flags (`sandbox apply`, a full `run`), it also writes them here, and the fast path
(`linpodx.fastpath.run`) uses them instead, if and only if everything they were made from is the
same now:

- the profile's current revision (the pointer names it) is the plan's, and the revision file
  holds exactly the bytes it held (sha256); the pointer and that revision pass the store's own
  checks (`linpodx.profile.pointer`: the same reads and the same rule as `store.get`, so a
  pointer the full path refuses is never run here), and the plan's revision number and audit
  hash are the revision file's;
- linpodx's code that makes the flags is byte for byte the same (`code_digest`: the argv
  builder, the profile model, loader and schema, and this module);
- the host facts the flags depend on are the same (`probe.host_facts`: root or rootless, hard
  rlimits, cgroup limits, podman's init binary);
- for a profile with an egress allowlist, the policy its guard is given is stored too (it is
  part of the revision, so the same checks cover it); so are the profile's mounts (source,
  destination), whose sources `linpodx.fastpath.run` checks and pins on the host again before
  every run, as the full path does.

- and the plan's flags, mounts and guard policy are exactly what that revision file gives on
  this host, built again from it by the full path's own builder (`linpodx.podman.flags`): a
  plan is a cache, not a source of truth. Someone who edits a plan (adds `--privileged`, drops
  `--cap-drop=all`, widens the allowlist) only makes the next run take the full path.

Anything else, and any doubt (a missing, damaged or foreign file), means "no plan": the full
path runs, decides everything afresh and writes a new plan. What a run gets is decided by the
revision file alone, on both paths; an edited revision is what `audit verify` compares with
its `profile.apply` record.

On the fast path: it loads only the kernel (`linpodx.fastpath.KERNEL`). `linpodx.containers`
writes plans with `save` and records runs with `run_record`, so this module sits below the
container service (tests/unit/test_layers.py), unlike the rest of `linpodx.fastpath`.
"""

from __future__ import annotations

import json
import os

from linpodx import paths
from linpodx.digest import sha256
from linpodx.errors import LinpodxError
from linpodx.ids import is_id
from linpodx.podman import flags, probe, seccomp
from linpodx.podman.flags import unenforced
from linpodx.profile import pointer

TYPE_CHECKING = False  # the fast path's budget: linpodx/fastpath/__init__.py
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

FORMAT = 3
MAX_PLAN_BYTES = 1 << 20
# Files whose code decides the flags a revision gives (relative to the linpodx package).
_CODE = (
    "fastpath/plan.py",
    "podman/argv.py",
    "podman/flags.py",
    "podman/runline.py",
    "podman/probe.py",
    "podman/seccomp.py",
    "profile/__init__.py",
    "profile/model.py",
    "profile/loader/__init__.py",
    "profile/loader/problems.py",
    "profile/loader/read.py",
    "profile/loader/yaml.py",
    "profile/loader/schemapass.py",
    "profile/loader/semantics.py",
    "profile/loader/build.py",
    "profile/egressentry.py",
    "profile/schema.json",
    "egress/guard.py",
    "egress/launch.py",
)
# A filter, not the rule: names with other characters are not looked up here (the full path
# applies the schema's rule and says what is wrong).
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")

_code_digest: str | None = None


def code_digest() -> str:
    """sha256 over the source of the modules that turn a revision into flags."""
    global _code_digest
    if _code_digest is None:
        base = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # linpodx/
        h = sha256()
        for rel in _CODE:
            with open(os.path.join(base, rel), "rb") as f:
                data = f.read()
            h.update(f"{rel}\0{len(data)}\0".encode())
            h.update(data)
        _code_digest = h.hexdigest()
    return _code_digest


def revision_file(profile_id: str) -> str:
    """Where the profile store keeps a revision (`linpodx.profile.store`)."""
    return os.path.join(paths.profiles_root(), "revisions", f"{profile_id}.json")


def plan_file(profile_id: str) -> str:
    return os.path.join(paths.profiles_root(), "plans", f"{profile_id}.json")


def _read(path: str, limit: int) -> bytes | None:
    """The regular file at `path` if it holds at most `limit` bytes, else None. Read as the
    store reads its files (`pointer.read_regular`): a FIFO must not hang a run, a link is not
    a file linpodx wrote."""
    try:
        data = pointer.read_regular(path, limit)
    except (OSError, pointer.NotRegularFile):
        return None
    return data if data is not None and len(data) <= limit else None


def _current(name: str) -> tuple[str, bytes, dict[str, Any]] | None:
    """(id, bytes, document) of the current revision of NAME, if the store's own read of its pointer
    (`store.get`) would give it; None if that read would refuse it or there is any doubt (the
    full path then runs and says what is wrong). The same rule (`pointer.problem`) and the
    same reads, so the two cannot drift apart."""
    doc = pointer.parse_object(
        _read(os.path.join(paths.profiles_root(), "names", f"{name}.json"), pointer.MAX_BYTES)
        or b""
    )
    if doc is None or "removing" in doc:
        return None  # (a `removing` mark: an interrupted `sandbox rm`; `store.get` refuses it)
    current = doc.get("current")
    if not isinstance(current, str) or not is_id(current, "prof"):
        return None
    raw = _read(revision_file(current), pointer.MAX_BYTES)
    revision = pointer.parse_object(raw or b"")

    def load_revision(profile_id: str) -> dict[str, Any] | None:
        return revision if profile_id == current else None

    if raw is None or revision is None or pointer.problem(name, doc, load_revision) is not None:
        return None
    return current, raw, revision


def run_record(
    *,
    name: str,
    image: str,
    profile: str,
    profile_id: str,
    revision: int,
    audit_hash: str,
    command: tuple[str, ...],
    interactive: bool,
    tty: bool,
    rm: bool,
    limits_not_applied: Sequence[str] = (),
) -> dict[str, Any]:
    """The `container.run` audit record of a new container (the full and the fast path);
    `limits_not_applied`: the profile's cgroup limits this host cannot apply, which a
    `resources.enforcement: best_effort` run goes without (named only when there are some)."""
    record = {
        "name": name,
        "image": image,
        "profile": profile,
        "profile_id": profile_id,
        "revision": revision,
        "audit_hash": audit_hash,
        "command": list(command),
        "interactive": interactive,
        "tty": tty,
        "rm": rm,
    }
    if limits_not_applied:
        record["limits_not_applied"] = list(limits_not_applied)
    return record


def save(
    *,
    profile: str,
    profile_id: str,
    revision: int,
    audit_hash: str,
    guarded: bool,
    flags: list[str],
    mounts: list[list[str]],
    egress_policy: dict[str, Any] | None = None,
) -> None:
    """Store the flags of a revision as built on this host just now (best effort: a plan that
    cannot be written only means the next run takes the full path)."""
    raw = _read(revision_file(profile_id), pointer.MAX_BYTES)
    if raw is None:
        return
    doc = {
        "format": FORMAT,
        "profile": profile,
        "profile_id": profile_id,
        "revision": revision,
        "audit_hash": audit_hash,
        "revision_sha256": sha256(raw).hexdigest(),
        "code": code_digest(),
        "host": list(probe.host_facts()),
        "guarded": guarded,
        "egress_policy": egress_policy if guarded else None,
        "flags": flags,
        "mounts": mounts,
    }
    data = json.dumps(doc, sort_keys=True).encode()
    if len(data) > MAX_PLAN_BYTES:
        return
    where = plan_file(profile_id)
    tmp = f"{where}.{os.getpid()}.tmp"
    try:
        paths.ensure_dir_str(os.path.dirname(where))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, paths.FILE_MODE)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        # Not fsynced: after a crash a plan is either whole or fails to parse (then: no plan).
        os.replace(tmp, where)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


class Plan:
    """A stored plan `load` found right for a profile's current revision on this host now:
    typed, and not changed once made (a slotted class: dataclasses are beyond the fast path's
    budget, linpodx/fastpath/__init__.py)."""

    __slots__ = (
        "audit_hash", "egress_policy", "flags", "guarded", "limits_not_applied", "mounts",
        "profile", "profile_id", "revision",
    )  # fmt: skip

    profile: str
    profile_id: str
    revision: int
    audit_hash: str
    flags: tuple[str, ...]
    """podman's flags for the profile (between `runline.head` and `runline.tail`)."""
    mounts: tuple[tuple[str, str], ...]
    """(host source, container target) of each mount, checked and pinned again per run."""
    guarded: bool
    egress_policy: dict[str, Any] | None
    """The egress guard's policy document, when `guarded`."""
    limits_not_applied: tuple[str, ...]
    """The revision's cgroup limits this host cannot apply (from the revision, not the plan)."""

    def __init__(self, doc: dict[str, Any], limits_not_applied: Sequence[str]) -> None:
        """From a plan document `load` has checked."""
        for field, value in (
            ("profile", doc["profile"]), ("profile_id", doc["profile_id"]),
            ("revision", doc["revision"]), ("audit_hash", doc["audit_hash"]),
            ("flags", tuple(doc["flags"])), ("mounts", tuple((s, t) for s, t in doc["mounts"])),
            ("guarded", doc["guarded"]),
            ("egress_policy", doc["egress_policy"] if doc["guarded"] else None),
            ("limits_not_applied", tuple(limits_not_applied)),
        ):  # fmt: skip
            object.__setattr__(self, field, value)

    def __setattr__(self, field: str, value: object) -> None:
        raise AttributeError(f"Plan is frozen: {field} cannot be set")


def load(name: str) -> Plan | None:
    """The plan for the current revision of the profile NAME, or None if there is no plan that
    is certainly right for it on this host now (see the module docstring)."""
    if not name or len(name) > 63 or name[0] in "._-" or not _NAME_CHARS.issuperset(name):
        return None
    try:
        found = _current(name)
        if found is None:
            return None
        current, raw, revision_doc = found
        host = probe.host_facts()
        plan = json.loads(_read(plan_file(current), MAX_PLAN_BYTES) or b"")
        if (
            type(plan) is not dict
            or plan.get("format") != FORMAT
            or plan.get("profile") != name
            or plan.get("profile_id") != current
            or type(plan.get("guarded")) is not bool
            or (plan["guarded"] and type(plan.get("egress_policy")) is not dict)
            or plan.get("revision_sha256") != sha256(raw).hexdigest()
            or plan.get("code") != code_digest()
            or plan.get("host") != list(host)
        ):
            return None
        flags, revision, audit_hash = plan["flags"], plan["revision"], plan["audit_hash"]
        doc_revision, doc_audit_hash = revision_doc["revision"], revision_doc["audit_hash"]
        mounts = plan["mounts"]
        if (
            type(flags) is not list
            or not all(type(f) is str and f.startswith("--") for f in flags)
            or type(mounts) is not list
            or not all(
                type(m) is list and len(m) == 2 and all(type(p) is str for p in m)
                for m in mounts
            )
            or type(revision) is not int
            or type(audit_hash) is not str
            # What the container.run record will say: the revision file's own values.
            or revision != doc_revision
            or audit_hash != doc_audit_hash
        ):
            return None
        if not _made_from(plan, revision_doc, host):
            return None
        # Not from the plan file: what the revision and this host give now (as `_made_from`).
        return Plan(plan, unenforced(revision_doc["profile"]["resources"], host[3]))
    except (ValueError, TypeError, KeyError, OSError, LinpodxError):
        return None


def _made_from(plan: dict[str, Any], revision_doc: dict[str, Any], host: probe.HostFacts) -> bool:
    """Whether the plan's flags, mounts and egress policy are exactly what the revision file
    gives on this host now, built again from it by the same code as on the full path
    (`flags.profile_flags`, `flags.egress_policy`). A plan is a cache: nothing in it is
    trusted, so an edited plan only means the full path runs."""
    profile = revision_doc["profile"]
    name, profile_id = plan["profile"], plan["profile_id"]
    revision, audit_hash = plan["revision"], plan["audit_hash"]
    rootless, nofile_hard, nproc_hard, cgroup_limits, init = host
    # The seccomp profile this host gives now, and only if its file holds exactly that (else
    # the full path writes it).
    profile_path = seccomp.current()
    if profile_path is None:
        return False
    expected = flags.profile_flags(
        profile,
        labels=flags.labels(name, profile_id, revision, audit_hash),
        rootless=rootless,
        nofile_hard=nofile_hard,
        nproc_hard=nproc_hard,
        cgroup_limits=cgroup_limits,
        init=init,
        seccomp=profile_path,
    )
    mounts = [[m["source"], m["target"]] for m in profile["mounts"]]
    network = profile["network"]
    guarded = bool(network["egress_dns_allowlist"])
    policy = flags.egress_policy(name, profile_id, revision, network) if guarded else None
    return bool(
        plan["flags"] == expected
        and plan["mounts"] == mounts
        and plan["guarded"] is guarded
        and plan["egress_policy"] == policy
    )
