"""`linpodx doctor`: tell a person exactly why linpodx would or would not work on this machine.

Each check is ok / warn / fail with a one-line fix. Checks that would only repeat a failure
above them (a container cannot run without podman) say so instead of failing twice.
"""

from __future__ import annotations

import os
import pwd
import resource
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from linpodx import proc
from linpodx.errors import EXIT_FAILURE, EXIT_OK, EngineError, LinpodxError
from linpodx.paths import ensure_dir, runtime_dir, state_dir
from linpodx.podman import probe, trial
from linpodx.podman.hints import podman_json
from linpodx.profile.model import Resources

OK, WARN, FAIL = "ok", "warn", "fail"
SUBID_MIN = 65536
"""Sub-ids a rootless user needs (a full 16-bit range, what `useradd` allocates)."""


@dataclass(frozen=True)
class Check:
    """One line of the report."""

    name: str
    status: str
    """ok, warn or fail."""
    detail: str
    fix: str | None = None
    """What to do about a warn/fail."""


@dataclass
class Report:
    """All checks, in order."""

    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str, fix: str | None = None) -> None:
        """Append a check."""
        self.checks.append(Check(name, status, detail, fix))

    def exit_code(self) -> int:
        """Non-zero if any check failed."""
        return EXIT_FAILURE if any(c.status == FAIL for c in self.checks) else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        counts = {s: sum(c.status == s for c in self.checks) for s in (OK, WARN, FAIL)}
        return {"checks": [asdict(c) for c in self.checks], "summary": counts}

    def lines(self) -> list[str]:
        """Human form: `[ok]   name: detail` plus `fix:` lines."""
        out = []
        for c in self.checks:
            out.append(f"{'[' + c.status + ']':<7}{c.name}: {c.detail}")
            if c.fix and c.status != OK:
                out.append(f"{'':<7}fix: {c.fix}")
        counts = self.to_dict()["summary"]
        out.append(f"summary: {counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail")
        return out


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def check_podman(r: Report) -> str | None:
    """podman present and new enough; returns its path (None if unusable)."""
    path = proc.which("podman")
    if path is None:
        r.add(
            "podman",
            FAIL,
            "not found",
            "install podman 4.3 or newer (Debian: apt-get install podman)",
        )
        return None
    try:
        res = proc.run(trial.version_argv(path), timeout=60, what="podman --version")
    except LinpodxError as err:
        r.add("podman", FAIL, f"{path} does not run: {err.message}", "reinstall podman")
        return None
    ver = probe.parse_version(res.stdout)
    if ver is None:
        r.add("podman", WARN, f"cannot parse version from {res.stdout.strip()!r}", None)
        return path
    text = ".".join(map(str, ver))
    if ver[:2] < probe.MIN_PODMAN:
        r.add(
            "podman",
            FAIL,
            f"{text} at {path}; linpodx is tested with 4.3 or newer",
            "upgrade podman",
        )
        return path
    extra = (
        "pasta networking available (podman ≥ 5)"
        if ver[:2] >= probe.PASTA_PODMAN
        else "podman < 5: rootless networking through slirp4netns; pasta as the default needs ≥ 5"
    )
    r.add("podman", OK, f"{text} at {path} (tested floor 4.3); {extra}")
    return path


def check_mode(r: Report) -> None:
    """Root or rootless."""
    if probe.rootless():
        r.add(
            "mode", OK, f"rootless as {_user()} (uid {os.getuid()}); --userns=keep-id maps you in"
        )
    else:
        r.add("mode", OK, "root (rootful podman); containers still drop every capability")


def _info(podman: str) -> dict[str, Any] | None:
    res = proc.run(trial.info_argv(podman), check=False, timeout=90, what="podman info")
    if res.returncode != 0:
        return None
    try:
        doc = podman_json(res.stdout, "podman info")
    except EngineError:  # (not JSON, or nested past the stack)
        return None
    return doc if isinstance(doc, dict) else None


def check_runtime(r: Report, podman: str) -> dict[str, Any] | None:
    """OCI runtime and cgroup setup as podman sees them; returns `podman info` (None if it
    failed) for the checks that read it too."""
    info = _info(podman)
    if info is None:
        r.add("runtime", FAIL, "`podman info` failed", "run `podman info` to see why")
        return None
    host = info.get("host", {})
    rt = host.get("ociRuntime", {}).get("name", "?")
    cgv = host.get("cgroupVersion", "?")
    mgr = host.get("cgroupManager", "?")
    detail = f"OCI runtime {rt}, cgroups {cgv} ({mgr})"
    if rt == "crun" and probe.cgroup_version() == 1 and os.path.isdir("/sys/fs/cgroup/unified"):
        r.add(
            "runtime",
            WARN,
            detail + "; crun fails on hybrid cgroups (`cgroups in hybrid mode not supported`)",
            'set runtime = "runc" under [engine] in containers.conf (install runc)',
        )
    else:
        r.add("runtime", OK, detail)
    return info


NFT_NETAVARK = (1, 12)
"""The first netavark with a firewall driver that uses nftables instead of the iptables tools."""
CONTAINERS_CONFS = (
    "/usr/share/containers/containers.conf",
    "/etc/containers/containers.conf",
)
CONTAINERS_CONF_D = "/etc/containers/containers.conf.d"


def _firewall_driver_setting() -> str | None:
    """`firewall_driver` under [network] in the system containers.conf files (the last one
    wins, as in podman), or None when none sets it. Rootful only: root reads these files."""
    files = list(CONTAINERS_CONFS)
    try:
        files += sorted(
            os.path.join(CONTAINERS_CONF_D, n)
            for n in os.listdir(CONTAINERS_CONF_D)
            if n.endswith(".conf")
        )
    except OSError:
        pass
    found: str | None = None
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        table = ""
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if line.startswith("["):
                table = line.strip("[] ")
            elif table == "network" and line.replace(" ", "").startswith("firewall_driver="):
                found = line.split("=", 1)[1].strip().strip("\"'")
    return found


def check_network(
    r: Report,
    info: dict[str, Any],
    which: Callable[[str], str | None] = proc.which,
    firewall_driver: Callable[[], str | None] = _firewall_driver_setting,
) -> None:
    """Rootful podman's default network works: netavark sets up its NAT and forwarding rules
    with the iptables tools (or, from netavark 1.12 when configured, nftables). linpodx's own
    containers use --network=none and do not need it; the demo image build and any plain
    `podman run` as root do, and fail with `netavark: No such file or directory` without it."""
    if probe.rootless():
        r.add(
            "network",
            OK,
            "rootless: podman's default network is slirp4netns/pasta (no firewall tools needed)",
        )
        return
    host = info.get("host", {})
    backend_info = host.get("networkBackendInfo") or {}
    backend = host.get("networkBackend") or backend_info.get("backend") or "?"
    if backend != "netavark":
        r.add("network", OK, f"network backend {backend}")
        return
    ver = probe.parse_version(str(backend_info.get("version", "")))
    shown = "netavark" + (" " + ".".join(map(str, ver)) if ver else "")
    nft_capable = ver is not None and ver[:2] >= NFT_NETAVARK
    driver = firewall_driver()
    if nft_capable and driver == "nftables":
        r.add("network", OK, f"{shown}, firewall driver nftables (containers.conf)")
        return
    iptables = which("iptables")
    if iptables:
        r.add("network", OK, f"{shown}, firewall tools {iptables}")
        return
    fix = "install iptables (Debian: apt-get install iptables)"
    if nft_capable:
        fix += ', or set firewall_driver = "nftables" under [network] in containers.conf'
    r.add(
        "network",
        WARN,
        f"{shown} without iptables: rootful containers on podman's default network (and "
        "`podman build` RUN steps) fail with `netavark: No such file or directory`; linpodx's "
        "own containers use --network=none and still run",
        fix,
    )


def _small_image(podman: str) -> str | None:
    wanted = os.environ.get("LINPODX_DOCTOR_IMAGE")
    if wanted:
        return wanted
    res = proc.run(trial.images_argv(podman), check=False, timeout=60, what="podman images")
    names = [n for n in res.stdout.split() if "<none>" not in n]
    for n in names:
        if "busybox" in n:
            return n
    return None


def check_container(r: Report, podman: str) -> None:
    """A tiny container really runs as `linpodx run` starts one (`linpodx.podman.trial`)."""
    from linpodx.podman import seccomp

    image = _small_image(podman)
    if image is None:
        r.add(
            "container",
            WARN,
            "no busybox image in this user's store, so no test container was run",
            "import one: tar a busybox-static tree and "
            "`podman import FILE localhost/busybox:latest`, or set LINPODX_DOCTOR_IMAGE=IMAGE",
        )
        return
    try:
        argv = trial.run_argv(podman, image, ["true"], seccomp.ensure())
    except LinpodxError as exc:
        r.add("container", FAIL, f"no test container: {exc.message}", exc.hint)
        return
    res = proc.run(argv, check=False, timeout=120, what="podman run")
    if res.returncode == 0:
        r.add("container", OK, f"a test container ran with linpodx's flags ({image})")
        return
    said = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
    from linpodx.podman.hints import classify_hint

    r.add(
        "container",
        FAIL,
        f"a test container failed: {said}",
        classify_hint(res.stderr, "run it by hand"),
    )


def check_privileged_files(r: Report, podman: str) -> None:
    """What stops a container from leaving a setuid/setgid file, a device node or a file
    capability on the host (`linpodx.podman.seccomp`), built and tried for real: a test
    container with linpodx's seccomp profile must be refused `chmod 4755`."""
    from linpodx.podman import seccomp

    name = "privileged files"
    try:
        where = seccomp.ensure()
    except LinpodxError as exc:
        r.add(name, FAIL, exc.message, exc.hint)
        return
    image = _small_image(podman)
    if image is None:
        r.add(name, WARN, f"{seccomp.MECHANISM} (not tried: no busybox image)",
              "import a busybox image (see the container check)")
        return
    try:
        argv = trial.run_argv(
            podman, image, ["sh", "-c", "touch /tmp/f && chmod 755 /tmp/f && chmod 4755 /tmp/f"],
            where,
        )  # fmt: skip
    except LinpodxError as exc:
        r.add(name, FAIL, f"no test container: {exc.message}", exc.hint)
        return
    res = proc.run(argv, check=False, timeout=120, what="podman run")
    if res.returncode != 0 and "Operation not permitted" in res.stderr:
        r.add(name, OK, f"{seccomp.MECHANISM}; a test container's chmod 4755 was refused")
    elif res.returncode == 0:
        r.add(name, FAIL, "a test container with linpodx's seccomp profile made a setuid file",
              "report this as a bug in linpodx: its seccomp profile does not hold here")
    else:
        said = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "no output"
        r.add(name, FAIL, f"the seccomp test container failed: {said}",
              "see the container check; run it by hand")


def check_ulimits(r: Report) -> None:
    """linpodx's default limits fit under this process's hard limits."""
    res_ = Resources()
    nofile_h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc_h = resource.getrlimit(resource.RLIMIT_NPROC)[1]

    def show(v: int) -> str:
        return "unlimited" if v == resource.RLIM_INFINITY else str(v)

    detail = (
        f"hard nofile {show(nofile_h)}, nproc {show(nproc_h)}; "
        f"linpodx sets nofile={res_.nofile} nproc={res_.nproc} by default "
        "(podman's own defaults may exceed the hard limit, so linpodx always passes --ulimit)"
    )
    low = [
        n
        for n, want, hard in (("nofile", res_.nofile, nofile_h), ("nproc", res_.nproc, nproc_h))
        if hard != resource.RLIM_INFINITY and want > hard
    ]
    if low:
        r.add(
            "ulimits", WARN, detail + f"; {', '.join(low)} will be clamped", "raise the hard limits"
        )
    else:
        r.add("ulimits", OK, detail)


def _subid(path: str, user: str, uid: int) -> int:
    total = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[0] in (user, str(uid)) and parts[2].isdigit():
                    total += int(parts[2])
    except OSError:
        return -1
    return total


def check_subids(r: Report) -> None:
    """Rootless needs /etc/subuid and /etc/subgid ranges."""
    if not probe.rootless():
        r.add("subuid", OK, "not needed as root")
        return
    user = _user()
    for path in ("/etc/subuid", "/etc/subgid"):
        n = _subid(path, user, os.getuid())
        name = os.path.basename(path)
        if n >= SUBID_MIN:
            r.add(name, OK, f"{n} ids for {user}")
        else:
            r.add(
                name,
                FAIL,
                f"{'unreadable' if n < 0 else f'{n} ids'} for {user} in {path}",
                f"as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}",
            )


def check_tun(r: Report) -> None:
    """/dev/net/tun usable (slirp4netns/pasta need it rootless)."""
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR)
        os.close(fd)
        r.add("tun", OK, "/dev/net/tun opens read-write")
    except OSError as exc:
        status = FAIL if probe.rootless() else WARN
        r.add(
            "tun",
            status,
            f"/dev/net/tun: {exc.strerror}",
            "as root: modprobe tun && chmod 666 /dev/net/tun (filtered egress needs it)",
        )


def check_tools(r: Report) -> None:
    """nft, slirp4netns, pasta, catatonit."""
    nft = proc.which("nft")
    if nft:
        r.add("nft", OK, nft)
    else:
        r.add("nft", FAIL, "not found", "install nftables (filtered egress needs nft)")
    for tool, pkg in (("slirp4netns", "slirp4netns"), ("pasta", "passt")):
        found = proc.which(tool)
        if found:
            r.add(tool, OK, found)
        else:
            r.add(tool, WARN, "not found", f"install {pkg} (a network helper for filtered egress)")
    init = probe.init_binary()
    if init:
        r.add("init", OK, f"{init} (--init reaps zombies and forwards signals)")
    else:
        r.add(
            "init", WARN, "catatonit not found; containers run without --init", "install catatonit"
        )


def check_cgroups(r: Report) -> None:
    """Which limits apply."""
    v = probe.cgroup_version()
    if probe.rootless() and v == 1:
        r.add(
            "cgroups",
            WARN,
            "cgroup v1, rootless: pids/memory/cpus limits cannot be applied; a profile that "
            "sets them is refused unless it says resources.enforcement: best_effort; "
            "processes are bounded by RLIMIT_NPROC only",
            "use a cgroup v2 host with controllers delegated to users for memory/cpu limits",
        )
        return
    if probe.rootless():
        missing = probe.LIMIT_CONTROLLERS - probe.user_controllers(os.getuid())
        if missing:
            r.add(
                "cgroups",
                WARN,
                f"cgroup v2, controllers not delegated to you: {', '.join(sorted(missing))}; "
                "a profile that sets memory/cpus/pids_limit is refused unless it says "
                "resources.enforcement: best_effort",
                "enable systemd cgroup delegation (Delegate=yes for user@.service)",
            )
            return
    r.add("cgroups", OK, f"cgroup v{v}: pids, memory and cpu limits apply")


def check_state(r: Report) -> None:
    """State and runtime dirs ours (`paths.check_root`) and writable."""
    for label, get in (("state dir", state_dir), ("runtime dir", runtime_dir)):
        try:
            d = ensure_dir(get())
            with tempfile.NamedTemporaryFile(dir=d, prefix=".doctor-"):
                pass
            r.add(label, OK, f"{d} writable")
        except LinpodxError as exc:  # not the running user's: refused by every command
            r.add(label, FAIL, exc.message, exc.hint)
        except OSError as exc:
            r.add(
                label,
                FAIL,
                f"{get()}: {exc.strerror}",
                "fix its ownership/permissions or set LINPODX_STATE_DIR",
            )


def check_bounds(r: Report) -> None:
    """The bounds on what an agent can drive through linpodx, as they hold on this host (the
    profile's defaults; a profile sets its own in `resources`)."""
    from linpodx.audit.chain import RESERVE_BYTES, RESERVE_FILE
    from linpodx.paths import audit_dir
    from linpodx.snapshot import freeze
    from linpodx.snapshot.precheck import fmt_bytes

    d = Resources()
    r.add("bound: container log", OK,
          f"{d.log_max_size} per container by default (resources.log_max_size; k8s-file "
          "driver, emptied at the bound); `linpodx logs` streams in 64 KiB pieces")
    free = []
    for label, path in (("state dir", str(state_dir())), ("podman storage", _graph_root())):
        try:
            st = os.statvfs(path) if path else None
        except OSError:
            st = None
        if st is not None:
            free.append(f"{fmt_bytes(st.f_bavail * st.f_frsize)} free in the {label} ({path})")
    r.add("bound: snapshot size", OK,
          f"{d.snapshot_max_size} by default (resources.snapshot_max_size: the container's "
          "changes at their apparent size plus the workspace archives), and the free disk"
          + (f": {'; '.join(free)}" if free else ""))
    if freeze.can_freeze():
        r.add("bound: snapshot freeze", OK,
              "the cgroup freezer holds a running container (`podman pause`)")
    else:
        r.add("bound: snapshot freeze", WARN,
              "no cgroup freezer (rootless on cgroup v1): `snapshot create` of a running "
              "container is refused unless given --consistency stop or best-effort",
              "use a cgroup v2 host (the freezer is delegated there), or pass "
              "--consistency stop")
    _check_helper_bound(r)
    reserve = audit_dir() / RESERVE_FILE
    r.add("bound: full state dir", OK,
          f"{fmt_bytes(RESERVE_BYTES)} kept for the records of stop and rm "
          + ("(in place)" if reserve.exists() else "(made with the next record)")
          + "; run, start and exec are refused when the state dir is full")


def _check_helper_bound(r: Report) -> None:
    """The egress connection bounds and the network helper's own limits, and whether this host
    lets them be applied (tried on a child, as the guard does on the helper)."""
    import subprocess

    from linpodx.egress import netns
    from linpodx.profile.model import Network

    n = Network()
    r.add("bound: egress connections", OK,
          f"{n.max_connections} open and {n.max_new_connections_per_second} new per second "
          "per container by default (network.max_connections, "
          "network.max_new_connections_per_second)")  # fmt: skip
    limits = netns.HelperLimits(n.helper_max_files, n.helper_max_memory_mib)
    what = (f"{limits.files} file descriptors and {limits.memory_mib} MiB of address space for "
            "each container's slirp4netns/pasta by default (network.helper_max_files, "
            "network.helper_max_memory_mib; it runs outside the container's cgroup)")
    try:
        # popen: a child to try the limits on, killed right after.
        child = proc.popen(["sleep", "10"], stdin=subprocess.DEVNULL)
    except OSError as exc:
        r.add("bound: network helper", WARN, f"{what}; not tried: {exc}")
        return
    try:
        netns.limit_helper(child.pid, limits)
    except LinpodxError as exc:
        r.add("bound: network helper", FAIL, f"{what}; cannot be applied here: {exc.message}",
              "filtered egress will refuse to start")
    else:
        r.add("bound: network helper", OK, what)
    finally:
        child.kill()
        child.wait()


def _graph_root() -> str:
    """podman's storage dir, "" if podman cannot say (its own check above says why)."""
    try:
        res = proc.run(trial.info_argv(proc.which("podman") or "podman", "{{.Store.GraphRoot}}"),
                       check=False, what="podman info")
    except LinpodxError:
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def run_checks() -> Report:
    """Run every check, in order."""
    r = Report()
    podman = check_podman(r)
    check_mode(r)
    if podman:
        info = check_runtime(r, podman)
        if info is not None:
            check_network(r, info)
        else:
            r.add("network", FAIL, "skipped: `podman info` failed", "run `podman info` first")
        check_container(r, podman)
        check_privileged_files(r, podman)
    else:
        for name in ("runtime", "network", "container", "privileged files"):
            r.add(name, FAIL, "skipped: podman is missing", "install podman first")
    steps: list[Callable[[Report], None]] = [
        check_ulimits, check_subids, check_tun, check_tools, check_cgroups, check_state,
        check_bounds,
    ]  # fmt: skip
    for step in steps:
        step(r)
    return r
