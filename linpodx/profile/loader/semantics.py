"""Stage 4: semantic checks the schema cannot express (mount paths, host names, resolvers,
capabilities, sizes), normalizing values in place."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from linpodx.output import safe_text
from linpodx.profile import HOME_DIR
from linpodx.profile.hostpaths import (
    FORBIDDEN_TEXT,
    PATH_FORBIDDEN,
    check_mount_source,
    has_dotdot,
    inside,
    show,
)
from linpodx.profile.loader.problems import Collector, KeyPath
from linpodx.profile.loader.schemapass import PATTERN_HINTS
from linpodx.profile.loader.yaml import bad_char
from linpodx.profile.mcprule import parse_matcher, parse_rate

ALL_CAPS = frozenset(
    """CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
    LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
    SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
    SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
    MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
    CHECKPOINT_RESTORE""".split()
)
"""Every capability the Linux kernel knows (linux/capability.h)."""

DANGEROUS_CAPS = frozenset(
    """SYS_ADMIN NET_ADMIN NET_RAW SYS_MODULE SYS_RAWIO SYS_PTRACE SYS_BOOT DAC_READ_SEARCH
    MAC_ADMIN MAC_OVERRIDE BPF PERFMON SYSLOG SYS_TIME LINUX_IMMUTABLE AUDIT_CONTROL SETFCAP
    SYS_RESOURCE SYS_PACCT CHECKPOINT_RESTORE MKNOD FSETID""".split()
)
"""Capabilities that let a container escape, undo the egress firewall or hide its tracks, or
leave a privileged file on the host (MKNOD: a device node in a writable mount is the host's
device for any host user the node's mode lets in; SETFCAP: file capabilities; FSETID: a write
to a setuid file already in a writable mount keeps its bit, so the agent could turn a host
setuid-root program into its own code)."""

# Targets linpodx (or podman) manages itself, or that would hand the container the kernel.
# `/run` and `/run/linpodx` would hold the mount gate (linpodx.podman.mountpin): runc would
# make its mount point inside the person's directory. `$HOME` (`/home/agent`) is linpodx's: a
# tmpfs for `--rm` containers (a second mount there is a duplicate destination, every run
# fails), made by `podman cp` (which chowns) for the others; over `/home` the tmpfs's mount
# point, or the copied `$HOME`, would land in the person's directory. Paths inside `$HOME` are
# fine: they are mounted over it.
_TARGET_TREES = ("/proc", "/sys", "/dev", "/run/linpodx")
_TARGET_EXACT = (
    "/", "/etc/resolv.conf", "/etc/hosts", "/etc/hostname", "/run", "/run/.containerenv",
    posixpath.dirname(HOME_DIR), HOME_DIR,
)  # fmt: skip

_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")


def check_mount_target(target: str) -> tuple[str | None, str | None]:
    """(problem, hint) for a container path, or (None, None)."""
    if PATH_FORBIDDEN.search(target):
        return f"mount target must not contain {FORBIDDEN_TEXT}", (
            "podman's mount syntax uses these characters; choose another container path"
        )
    if not target.startswith("/"):
        return f"mount target {show(target)} must be an absolute path", "e.g. `/workspace`"
    if has_dotdot(target):
        return f"mount target {show(target)} must not contain `..`", None
    norm = posixpath.normpath(target)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    if norm != target:
        return f"mount target {show(target)} is not normalized", f"write `{norm}`"
    if target in _TARGET_EXACT:
        return f"mount target {target} is not allowed (linpodx manages it)", (
            "choose a directory such as `/workspace`"
        )
    for tree in _TARGET_TREES:
        if inside(target, tree):
            return f"mount target {show(target)} is over {tree}, which is not allowed", (
                "choose a directory such as `/workspace`"
            )
    return None, None


def normalize_hostname(raw: str) -> tuple[str | None, str | None]:
    """(normalized, problem) for an allowlist entry."""
    import ipaddress

    if not raw.isascii():
        # Before lower-casing: str.lower maps some non-ASCII letters to ASCII (the Kelvin sign
        # U+212A becomes `k`), which would allow a name other than the one written.
        first = next(ch for ch in raw if not ch.isascii())
        # The code point too: U+212A looks just like `K`.
        return None, (
            f"{show(raw)} is not ASCII (U+{ord(first):04X}); write the name in its `xn--` "
            "(IDNA) form"
        )
    name = raw.lower()
    if name.endswith(".") and not name.endswith(".."):
        name = name[:-1]
    if not name:
        return None, "empty host name"
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        pass
    else:
        return None, f"{show(raw)} is an IP address; only DNS names can be allowed"
    wildcard = name.startswith("*.")
    body = name[2:] if wildcard else name
    if "*" in body:
        return None, (
            f"{show(raw)}: a wildcard is only allowed as a leading `*.` followed by a domain "
            "of at least two labels (`*.example.com`)"
        )
    if len(body) > 253:
        return None, f"{show(raw)} is longer than 253 characters"
    labels = body.split(".")
    if len(labels) < 2:
        what = "a wildcard needs a domain of at least two labels" if wildcard else (
            "a host name needs at least two labels"
        )
        return None, f"{show(raw)}: {what} (`*.example.com`, `crates.io`)"
    for label in labels:
        if not label:
            return None, f"{show(raw)} has an empty label"
        if len(label) > 63:
            return None, f"{show(raw)} has a label longer than 63 characters"
        if not _HOST_LABEL.match(label):
            return None, (
                f"{show(raw)}: label {show(label)} may only hold letters, digits and inner "
                "hyphens"
            )
    if labels[-1].isdigit():
        return None, f"{show(raw)} looks like an IP address; only DNS names can be allowed"
    return name, None


def normalize_entry(raw: str) -> tuple[str | None, str | None]:
    """(canonical entry, problem) for an allowlist entry `NAME[:PORT[/KIND]]` (KIND: `http`,
    `tcp`; none means TLS; a bare NAME is TLS on 443)."""
    from linpodx.profile.egressentry import Rule, split_entry

    try:
        written, port, kind = split_entry(raw)
    except ValueError as exc:
        # `[::1]`, `1.2.3.4:x`: say what the name part is wrong about, if it is.
        _, name_problem = normalize_hostname(raw)
        if name_problem and "IP address" in name_problem:
            return None, name_problem
        return None, f"{show(raw)}: {exc}"
    name, problem = normalize_hostname(written)
    if problem or name is None:
        return None, problem
    return Rule(name, port, kind).text(), None


def normalize_resolver(raw: str) -> tuple[str | None, str | None]:
    """(normalized `IP` / `IP:PORT` / `[V6]:PORT`, problem)."""
    import ipaddress

    if "%" in raw:
        # ipaddress takes `fe80::1%eth0` (and `%` followed by anything, spaces too): an
        # interface name is host-specific, and the resolver's address form has no place for it.
        return None, (
            f"{show(raw)}: IPv6 zone ids (`%eth0`) are not allowed; give an address reachable "
            "without one"
        )
    host, port = raw, None
    m = re.fullmatch(r"\[([^\]]+)\](?::([0-9]{1,5}))?", raw)
    if m:
        host, port = m.group(1), m.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None, f"{show(raw)}: not an IPv6 address in brackets"
    elif raw.count(":") == 1:
        host, port = raw.split(":")
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None, f"{show(raw)} is not `IP`, `IP:PORT` or `[IPV6]:PORT`"
    if port is not None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            return None, f"{show(raw)}: port must be 1-65535"
        if addr.version == 6:
            return f"[{addr.compressed}]:{int(port)}", None
        return f"{addr.compressed}:{int(port)}", None
    return addr.compressed, None


def size_bytes(value: str) -> int | None:
    """Bytes of a `512m` form, None for anything else (the schema refuses it first, except for
    a stored revision, whose schema pass may be skipped)."""
    if not re.fullmatch(r"[1-9][0-9]{0,9}[kmgKMG]", value):
        return None
    return int(value[:-1]) * {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[value[-1].lower()]


def _cpus(value: Any) -> tuple[str | None, str | None]:
    from decimal import Decimal, InvalidOperation

    if isinstance(value, bool):
        return None, "expected a number"
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        return None, f"{show(value)} is not a number"
    if not d.is_finite() or d <= 0 or d > 1024:
        return None, f"{show(value)} is out of range: must be greater than 0 and at most 1024"
    if d != d.quantize(Decimal("0.001")):
        return None, f"{show(value)} has more than 3 decimals"
    text = format(d.normalize(), "f")
    return text, None


class _Semantics:
    def __init__(self, col: Collector):
        self.col = col

    def ok(self, path: KeyPath) -> bool:
        return path not in self.col.bad_paths

    def run(self, data: dict[str, Any]) -> None:
        self.mounts(data.get("mounts"))
        self.network(data.get("network"))
        self.mcp_policy(data.get("mcp_policy"))
        self.caps(data.get("cap_add"))
        self.resources(data.get("resources"))
        wd = data.get("workdir")
        if isinstance(wd, str) and self.ok(("workdir",)):
            norm = posixpath.normpath(wd) if wd.startswith("/") else ""
            # Tab and newline pass the loader's character check (text may hold them), not a
            # working directory: `"/w\n"` made every run start somewhere else.
            if (
                not wd.startswith("/")
                or has_dotdot(wd)
                or norm != wd
                or bad_char(wd)
                or "\n" in wd
                or "\t" in wd
            ):
                self.col.add(
                    ("workdir",),
                    f"workdir {show(wd)} must be an absolute, normalized path without `..` "
                    "or control characters",
                    "e.g. `/workspace`",
                )

    def mounts(self, mounts: Any) -> None:
        if not isinstance(mounts, list):
            return
        targets: dict[str, int] = {}
        for i, m in enumerate(mounts):
            if not isinstance(m, dict):
                continue
            src, tgt = m.get("source"), m.get("target")
            if isinstance(src, str) and self.ok(("mounts", i, "source")):
                resolved, problem, hint = check_mount_source(src)
                if problem:
                    self.col.add(("mounts", i, "source"), problem, hint)
                else:
                    m["source"] = resolved
            if isinstance(tgt, str) and self.ok(("mounts", i, "target")):
                problem, hint = check_mount_target(tgt)
                if problem:
                    self.col.add(("mounts", i, "target"), problem, hint)
                elif tgt in targets:
                    self.col.add(
                        ("mounts", i, "target"),
                        f"mount target {tgt} is already used by mounts[{targets[tgt]}]",
                        "each container path can be mounted once",
                    )
                else:
                    targets[tgt] = i

    def network(self, net: Any) -> None:
        if not isinstance(net, dict):
            return
        hosts = net.get("egress_dns_allowlist")
        if isinstance(hosts, list):
            seen: dict[str, int] = {}
            for i, h in enumerate(hosts):
                path: KeyPath = ("network", "egress_dns_allowlist", i)
                if not isinstance(h, str) or not self.ok(path):
                    continue
                norm, problem = normalize_entry(h)
                if problem or norm is None:
                    self.col.add(path, problem or "invalid host name",
                                 "write entries like `crates.io`, `*.example.com`, "
                                 "`example.com:8443`, `example.com:80/http` or "
                                 "`example.com:22/tcp`")
                elif norm in seen:
                    self.col.add(
                        path,
                        f"{show(norm)} is listed twice (also at index {seen[norm]})",
                        "remove the duplicate entry",
                    )
                else:
                    seen[norm] = i
                    hosts[i] = norm
        resolvers = net.get("upstream_dns")
        if isinstance(resolvers, list):
            for i, r in enumerate(resolvers):
                path = ("network", "upstream_dns", i)
                if isinstance(r, str) and self.ok(path):
                    norm, problem = normalize_resolver(r)
                    if problem:
                        self.col.add(path, problem, "e.g. `192.0.2.53`, `192.0.2.53:5353`, "
                                     "`[2001:db8::53]:53`")
                    else:
                        resolvers[i] = norm

    def mcp_policy(self, rules: Any) -> None:
        if not isinstance(rules, list):
            return
        for i, r in enumerate(rules):
            if not isinstance(r, dict):
                continue
            tool = r.get("tool_name")
            method = r.get("method")
            if tool is not None and isinstance(method, str) and method not in ("tools/call", "*"):
                self.col.add(
                    ("mcp_policy", i, "tool_name"),
                    f"tool_name only applies to method tools/call (or `*`), not {show(method)}",
                    "remove tool_name or set `method: tools/call`",
                )
            if tool == "*":
                r["tool_name"] = None
            self.mcp_rule_extras(i, r, method)

    def mcp_rule_extras(self, i: int, r: dict[str, Any], method: Any) -> None:
        """A rule's `arguments` (each matcher parsed as the gate will run it) and `rate`."""
        args = r.get("arguments")
        if isinstance(args, dict) and self.ok(("mcp_policy", i, "arguments")):
            if isinstance(method, str) and method != "tools/call":
                self.col.add(
                    ("mcp_policy", i, "arguments"),
                    f"arguments only applies to method tools/call, not {show(method)}",
                    "set `method: tools/call` (and `tool_name`), or remove arguments",
                )
            for name, spec in args.items():
                path: KeyPath = ("mcp_policy", i, "arguments", name)
                if not isinstance(spec, dict) or len(spec) != 1 or not self.ok(path):
                    continue
                kind = next(iter(spec))
                if not self.ok((*path, kind)):
                    continue
                _m, problem, hint = parse_matcher(spec)
                if problem:
                    self.col.add((*path, kind), problem, hint)
        rate = r.get("rate")
        if rate is not None and self.ok(("mcp_policy", i, "rate")):
            decision = r.get("decision")
            if isinstance(decision, str) and decision != "auto_allow":
                self.col.add(
                    ("mcp_policy", i, "rate"),
                    f"rate only applies to decision auto_allow, not {show(decision)}",
                    "past its rate an auto_allow rule turns into prompt; a prompt or deny rule "
                    "has nothing to turn into, so remove rate",
                )
            elif isinstance(rate, str) and parse_rate(rate) is None:
                self.col.add(("mcp_policy", i, "rate"), f"{show(rate)} is not a rate",
                             "write N/s, N/min or N/h with N from 1 to 10000, e.g. `30/min`")

    def caps(self, caps: Any) -> None:
        if not isinstance(caps, list):
            return
        seen: set[str] = set()
        for i, c in enumerate(caps):
            path: KeyPath = ("cap_add", i)
            if not isinstance(c, str) or not self.ok(path):
                continue
            name = c.upper().removeprefix("CAP_")
            if name not in ALL_CAPS:
                self.col.add(path, f"unknown capability {show(c)}",
                             "use a Linux capability name such as CHOWN or NET_BIND_SERVICE")
            elif name in DANGEROUS_CAPS:
                self.col.add(
                    path,
                    f"capability {name} is refused: it would let the container escape or undo "
                    "the sandbox",
                    "drop it; if the agent needs it, it does not belong in this sandbox",
                )
            elif name in seen:
                self.col.add(path, f"capability {name} is listed twice", "remove the duplicate")
            else:
                seen.add(name)
                caps[i] = name

    def resources(self, res: Any) -> None:
        if not isinstance(res, dict):
            return
        mem = res.get("memory")
        if isinstance(mem, str) and self.ok(("resources", "memory")):
            n = size_bytes(mem)
            if n is None:
                self.col.add(("resources", "memory"), f"{show(mem)} is not a memory size",
                             PATTERN_HINTS["memory"])
            elif not (6 << 20) <= n <= (1024 << 30):
                self.col.add(("resources", "memory"), f"{show(mem)} is out of range: must be "
                             "between 6m and 1024g")
            else:
                res["memory"] = mem.lower()
        for key, low, high, span in (("log_max_size", 1 << 20, 1 << 40, "1m and 1024g"),
                                     ("snapshot_max_size", 1 << 20, 1 << 50, "1m and 1048576g")):
            size = res.get(key)
            if isinstance(size, str) and self.ok(("resources", key)):
                n = size_bytes(size)
                if n is None:
                    self.col.add(("resources", key), f"{show(size)} is not a size",
                                 PATTERN_HINTS["memory"])
                elif not low <= n <= high:
                    self.col.add(("resources", key), f"{show(size)} is out of range: must be "
                                 f"between {span}")
                else:
                    res[key] = size.lower()
        if res.get("cpus") is not None and self.ok(("resources", "cpus")):
            # A YAML float is judged as written (`0.1000001` has too many decimals even where
            # the float rounds it away).
            written = self.col.float_texts.get(("resources", "cpus"))
            raw = written.replace("_", "") if isinstance(res["cpus"], float) and written else None
            norm, problem = _cpus(raw if raw is not None else res["cpus"])
            if problem:
                self.col.add(("resources", "cpus"), problem, PATTERN_HINTS["cpus"])
            else:
                res["cpus"] = norm


def check(data: dict[str, Any], col: Collector, *, check_paths: bool) -> None:
    """Run the semantic checks on `data` (without the host-path ones unless `check_paths`)."""
    sem = _Semantics(col)
    if check_paths:
        sem.run(data)
    else:
        # Stored profiles: same normalization, but host paths are not re-checked here (the
        # source may be gone by now; `linpodx run` checks them again: linpodx.profile.hostpaths).
        sem.network(data.get("network"))
        sem.mcp_policy(data.get("mcp_policy"))
        sem.caps(data.get("cap_add"))
        sem.resources(data.get("resources"))


def refuse_floats(value: Any, path: KeyPath, col: Collector) -> None:
    """Refuse every floating-point number left after normalization: the store hashes the
    profile's canonical JSON, which has no floats (`cpus` is normalized to a decimal string)."""
    if isinstance(value, float):
        written = safe_text(col.float_texts.get(path, repr(value)), 60)
        col.add(path, f"the floating-point number `{written}` is not allowed here",
                "write a whole number as digits only")
    elif isinstance(value, dict):
        for k, v in value.items():
            refuse_floats(v, (*path, k), col)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            refuse_floats(v, (*path, i), col)
