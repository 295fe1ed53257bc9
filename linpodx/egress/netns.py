"""Kernel plumbing for the egress guard: joining a container's network namespace, loading nft
rules into it, and starting the user-mode network helper (slirp4netns or pasta).

Rootless, the guard process itself runs under `podman unshare` (uid 0 of the rootless user
namespace, which owns or is the parent of the container's namespaces), so the same code works
for root and rootless: setns(2) and nft both need CAP_SYS_ADMIN/CAP_NET_ADMIN over the
namespace's owning user namespace, which the guard then has and the container never does.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from linpodx import proc
from linpodx.egress.launch import RESOLVER_ADDR
from linpodx.errors import EngineError

_T = TypeVar("_T")

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
RESOLVER_PORT = 53
TAP = "tap0"
HELPER_MAX_FILES_DEFAULT = 4096
HELPER_MAX_MEMORY_MIB_DEFAULT = 1024
"""The network helper's limits when the policy file names none (`HelperLimits`)."""

_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int, nstype: int) -> None:
    """setns(2) for the calling thread only (raises OSError)."""
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def bind_netns_privately(pid: int, target: str) -> None:
    """Give the calling process a mount namespace of its own and bind the netns of `pid` onto
    `target` (an existing file) in it, so that it and its children can open the netns by that
    path while nobody else sees the mount. It goes away with the last process in that mount
    namespace; nothing is left to unmount. Call it single-threaded (raises OSError).
    """
    if _libc.unshare(CLONE_NEWNS) != 0:
        _raise_errno("unshare")
    # Mount events must not travel back to the host's namespace: private, recursively.
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        _raise_errno("mount --make-rprivate /")
    if _libc.mount(netns_path(pid).encode(), target.encode(), None, MS_BIND, None) != 0:
        _raise_errno("mount --bind")


def _raise_errno(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def netns_path(pid: int) -> str:
    """The network namespace file of process `pid`."""
    return f"/proc/{pid}/ns/net"


def _made_in_netns(pid: int, make: Callable[[list[socket.socket]], _T], what: str) -> _T:
    """`make(opened)` run in a short-lived thread that joined the netns of `pid`.

    A socket belongs to the netns it was created in, forever. setns(2) of a netns moves only
    the calling thread, so a short-lived thread joins the container's netns, creates and binds
    the sockets, and ends there. It never switches back: rootless, going back to the host's
    netns would need a capability over the initial user namespace that the guard lacks.
    `make` appends each socket it opens to `opened`, so a failure closes them all.
    """
    result: dict[str, object] = {}

    def work() -> None:
        opened: list[socket.socket] = []
        try:
            fd = os.open(netns_path(pid), os.O_RDONLY)
            try:
                setns(fd, CLONE_NEWNET)
            finally:
                os.close(fd)
            result["made"] = make(opened)
        except BaseException as exc:
            for s in opened:
                s.close()
            result["error"] = exc

    t = threading.Thread(target=work, name="netns-bind")
    t.start()
    t.join()
    if "error" in result:
        raise EngineError(
            f"could not open {what} in the container's network namespace: {result['error']}",
            "see `linpodx doctor`",
        )
    return result["made"]  # type: ignore[return-value]


def bind_resolver_sockets(pid: int) -> tuple[socket.socket, socket.socket]:
    """UDP and TCP sockets on 127.0.0.1:53 INSIDE the netns of `pid` (`_made_in_netns`)."""

    def make(opened: list[socket.socket]) -> tuple[socket.socket, socket.socket]:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        opened.append(udp)
        udp.bind((RESOLVER_ADDR, RESOLVER_PORT))
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        opened.append(tcp)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        tcp.bind((RESOLVER_ADDR, RESOLVER_PORT))
        tcp.listen(16)
        return udp, tcp

    return _made_in_netns(pid, make, "the policy resolver")


def bind_checker_socket(pid: int, port: int) -> socket.socket:
    """The connection checker's listening TCP socket on 127.0.0.1:`port` INSIDE the netns of
    `pid` (`_made_in_netns`)."""

    def make(opened: list[socket.socket]) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        opened.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((RESOLVER_ADDR, port))
        sock.listen(1024)
        return sock

    return _made_in_netns(pid, make, "the connection checker")


def nft_argv(pid: int) -> list[str]:
    """`nsenter --net=/proc/PID/ns/net nft -f -` with full paths (a user's PATH lacks sbin)."""
    nsenter = proc.which("nsenter") or "nsenter"
    nft = proc.which("nft") or "nft"
    return [nsenter, f"--net={netns_path(pid)}", nft, "-f", "-"]


def nft_apply(pid: int, text: str) -> None:
    """Load `text` into the netns of `pid` as one nft transaction; raises EngineError."""
    if not text:
        return
    proc.run(
        nft_argv(pid),
        input=text,
        timeout=15,
        what="nft (egress filter)",
        hint="check that nftables is installed and usable (`linpodx doctor`)",
    )


@dataclass
class Helper:
    """A running network helper: our child (slirp4netns, pasta rootful) or, for rootless
    pasta, a process the CLI started outside the user namespace (known by its pid file)."""

    kind: str
    process: subprocess.Popen[bytes] | None
    exit_w: int | None = None
    """Write end of slirp4netns' --exit-fd pipe: closing it (or our death) stops slirp4netns."""
    ext_pid: int | None = None

    @property
    def pid(self) -> int:
        if self.process is not None:
            return self.process.pid
        return int(self.ext_pid or 0)

    def alive(self) -> bool:
        """Is the helper still running?"""
        if self.process is not None:
            return self.process.poll() is None
        return self.ext_pid is not None and _pid_alive(self.ext_pid)

    def stop(self) -> None:
        """Stop the helper and reap it."""
        if self.exit_w is not None:
            os.close(self.exit_w)
            self.exit_w = None
        if self.process is None:
            if self.ext_pid is not None and _pid_alive(self.ext_pid):
                with contextlib.suppress(OSError):
                    os.kill(self.ext_pid, signal.SIGTERM)
            return
        if self.kind != "slirp4netns":
            self.process.terminate()
        try:
            self.process.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=3)


@dataclass(frozen=True)
class HelperLimits:
    """The network helper's own bounds (`network.helper_max_files`, `.helper_max_memory_mib`).

    The helper runs outside the container's cgroup (in the CLI's, rootless), and each
    connection it holds to the outside costs it a socket and memory (~270 kB in slirp4netns),
    so without limits of its own one container could take the host's file descriptors and
    gigabytes of memory however the container itself is bounded."""

    files: int
    memory_mib: int

    def pairs(self) -> tuple[tuple[int, int], ...]:
        """(resource, value) for prlimit: soft = hard, so the helper cannot raise them."""
        import resource

        return (
            (resource.RLIMIT_NOFILE, self.files),
            (resource.RLIMIT_AS, self.memory_mib << 20),
        )


def limit_helper(pid: int, limits: HelperLimits) -> None:
    """Apply `limits` to the helper process `pid` and read them back; EngineError if either
    cannot be applied (fail closed: the container is not started with an unbounded helper).

    Applied after the helper started and before the guard reports `ready`: no process of the
    container runs before that, so no connection reaches the helper unbounded."""
    import resource

    for res, value in limits.pairs():
        what = "RLIMIT_NOFILE" if res == resource.RLIMIT_NOFILE else "RLIMIT_AS"
        try:
            resource.prlimit(pid, res, (value, value))
            got = resource.prlimit(pid, res)
        except (OSError, ValueError) as exc:
            raise EngineError(
                f"could not limit the network helper (pid {pid}): {what}={value}: {exc}",
                "the container was not started; see `linpodx doctor`",
            ) from None
        if got != (value, value):
            raise EngineError(
                f"the network helper's {what} is {got}, not {value}",
                "the container was not started; see `linpodx doctor`",
            )


def helper_process(helper: Helper, pidfile: Path, timeout: float = 15.0) -> int:
    """The pid of the helper itself: slirp4netns is our child; rootful pasta runs under its
    keeper, which writes pasta's pid to `pidfile`; rootless pasta is adopted by that pid."""
    import time

    if helper.kind != "pasta" or helper.process is None:
        return helper.pid
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(pidfile.read_text().strip())
        except (OSError, ValueError):
            if time.monotonic() > deadline or not helper.alive():
                raise EngineError(
                    "pasta's keeper did not say pasta's pid", "see the helper log"
                ) from None
            time.sleep(0.02)


def _pid_alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st.rsplit(")", 1)[-1].split()[0] != "Z"


def in_user_namespace() -> bool:
    """True when this process runs in a user namespace (rootless, under `podman unshare`)."""
    try:
        fields = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return False
    return fields[:3] != ["0", "0", "4294967295"]


def wait_external_pasta(pid: int, pidfile: Path, timeout: float = 15.0) -> Helper:
    """Rootless pasta is started by the CLI outside the user namespace (pasta refuses to run
    as uid 0 and cannot open the namespace from inside it); wait for it and adopt it."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ext = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        helper = Helper("pasta", None, None, ext)
        _wait_iface(pid, helper, timeout, ["pasta"])
        return helper
    raise EngineError("pasta was not started in time", "see the guard log")


def external_pasta_argv(
    pid: int, pidfile: Path, userns_pid: int, limits: HelperLimits
) -> list[str]:
    """Rootless pasta, run by the CLI as the plain user under the pasta keeper (which stops it
    when the guard or the container ends and writes its pid to `pidfile`).

    pasta joins the rootless user namespace (the guard's, `userns_pid`), not the container's:
    with `--userns keep-id` the container has a nested user namespace that a process outside
    the rootless one may not join, while the rootless namespace's root may enter every netns
    below it.
    """
    binary = proc.which("pasta") or "pasta"
    argv = pasta_argv(binary, pid)
    pasta = [argv[0], "-f", "--userns", f"/proc/{userns_pid}/ns/user", *argv[1:]]
    return keeper_argv(userns_pid, pid, pidfile, pasta, limits)


def keeper_argv(
    guard_pid: int,
    pid: int,
    pidfile: Path,
    pasta: list[str],
    limits: HelperLimits,
    bind_netns: Path | None = None,
) -> list[str]:
    """`python -m linpodx.egress.pastakeeper …` running `pasta` until the guard (`guard_pid`) or
    the container's init process (`pid`) ends, under `limits` from its start; see that
    module."""
    bind = ["--bind-netns", str(bind_netns)] if bind_netns is not None else []
    bind += ["--max-files", str(limits.files), "--max-memory-mib", str(limits.memory_mib)]
    return [
        sys.executable, "-m", "linpodx.egress.pastakeeper",
        "--guard-pid", str(guard_pid), "--container-pid", str(pid), "--pidfile", str(pidfile),
        *bind, "--", *pasta,
    ]  # fmt: skip


def choose_helper(preferred: str | None = None) -> str:
    """`slirp4netns` when installed (podman 4.x's helper), else `pasta` (podman >= 5's, from
    Debian's passt); `preferred` (LINPODX_EGRESS_HELPER) picks one. EngineError if none fits."""
    order = [preferred] if preferred else ["slirp4netns", "pasta"]
    for kind in order:
        if kind and proc.which(kind):
            return kind
    raise EngineError(
        "no user-mode network helper found (slirp4netns or pasta)",
        "install slirp4netns (or passt for pasta); see `linpodx doctor`",
    )


def slirp_argv(binary: str, pid: int, exit_fd: int, ready_fd: int) -> list[str]:
    """slirp4netns attached to the netns of `pid` by path (works for root and rootless)."""
    return [
        binary,
        "--configure",
        "--mtu=65520",
        # 10.0.2.2 would otherwise reach the host's 127.0.0.1.
        "--disable-host-loopback",
        # 10.0.2.3 would answer any name: our resolver is the only one (nft blocks it too).
        "--disable-dns",
        "--enable-sandbox",
        "--enable-seccomp",
        f"--exit-fd={exit_fd}",
        f"--ready-fd={ready_fd}",
        "--netns-type=path",
        netns_path(pid),
        TAP,
    ]


def pasta_argv(binary: str, pid: int, netns: str | None = None) -> list[str]:
    """pasta attached to the netns of `pid` (opened by the path `netns`, if given): no port
    forwarding, gateway not mapped to host."""
    return [
        binary,
        "--config-net",
        "--netns",
        netns or netns_path(pid),
        # pasta copies the host's address into the namespace by default; then the host's
        # own address would be the container's (and unreachable). Use slirp4netns' layout.
        "--address",
        "10.0.2.100",
        "--netmask",
        "24",
        "--gateway",
        "10.0.2.2",
        # The gateway address must not be a way to the host's loopback.
        "--no-map-gw",
        "-t",
        "none",
        "-u",
        "none",
        "-T",
        "none",
        "-U",
        "none",
        "--no-dhcp",
        "--no-dhcpv6",
        "--no-ndp",
        "--no-ra",
        "-4",
        "--quiet",
    ]


def start_helper(
    kind: str,
    pid: int,
    log: Path,
    limits: HelperLimits,
    timeout: float = 15.0,
    *,
    pasta_files: tuple[Path, Path] | None = None,
) -> Helper:
    """Start the network helper for the netns of `pid`; returns once the interface is up.
    pasta gets `limits` from its start (its keeper sets them on itself); slirp4netns opens
    a handful of descriptors before its own are set (`limit_helper`, by the caller).

    `pasta_files`: (pid file, netns file) for rootful pasta (see `_start_rootful_pasta`).
    """
    binary = proc.which(kind)
    if binary is None:
        raise EngineError(f"{kind} not found", "install it or see `linpodx doctor`")
    if kind == "slirp4netns":
        exit_r, exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        argv = slirp_argv(binary, pid, exit_r, ready_w)
        logf = open(log, "ab")  # handed to the child, closed right after
        try:
            # popen, not run: slirp4netns lives as long as the container (this module
            # owns it and stops it through its exit fd).
            p = proc.popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                pass_fds=(exit_r, ready_w),
            )
        finally:
            logf.close()
            os.close(exit_r)
            os.close(ready_w)
        helper = Helper(kind, p, exit_w)
        try:
            _wait_ready(ready_r, p, timeout, argv)
        except BaseException:
            helper.stop()
            raise
        finally:
            os.close(ready_r)
        return helper
    return _start_rootful_pasta(binary, pid, log, pasta_files, timeout, limits)


def _start_rootful_pasta(
    binary: str,
    pid: int,
    log: Path,
    files: tuple[Path, Path] | None,
    timeout: float,
    limits: HelperLimits,
) -> Helper:
    """pasta for a rootful container, under the pasta keeper (as rootless pasta runs), which
    stops it when this guard or the container's init process ends, even after a kill -9.

    Two things differ from rootless. Started as root, pasta drops to `nobody` and then may not
    enter the container's netns: `--runas 0:0` keeps it root (it still sandboxes itself:
    seccomp, no capabilities beyond what it needs, an empty filesystem). And runc's init
    process is not dumpable, so /proc/PID/ns/net is closed to pasta once it has dropped
    CAP_SYS_PTRACE; the keeper therefore binds the netns onto a file in a mount namespace of
    its own (podman >= 5 also hands pasta a bind-mounted netns file) and pasta opens that.
    """
    if files is None:
        raise EngineError("pasta needs its pid and netns files", "this is a bug in linpodx")
    pidfile, netns_file = files
    netns_file.touch(exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    argv = pasta_argv(binary, pid, str(netns_file))
    pasta = [argv[0], "-f", "--runas", "0:0", *argv[1:]]
    keeper = keeper_argv(os.getpid(), pid, pidfile, pasta, limits, bind_netns=netns_file)
    logf = open(log, "ab")  # handed to the child, closed right after
    try:
        # popen: the keeper (and pasta under it) lives as long as the container.
        p = proc.popen(keeper, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf)
    finally:
        logf.close()
    helper = Helper("pasta", p, None)
    try:
        _wait_iface(pid, helper, timeout, pasta)
    except BaseException:
        helper.stop()
        raise
    return helper


def _wait_ready(fd: int, p: subprocess.Popen[bytes], timeout: float, argv: list[str]) -> None:
    import select

    r, _, _ = select.select([fd], [], [], timeout)
    data = os.read(fd, 1) if r else b""
    if data != b"1":
        rc = p.poll()
        raise EngineError(
            "slirp4netns did not bring up the container's network",
            "see the guard log; check /dev/net/tun permissions (`linpodx doctor`)",
            argv=argv,
            returncode=rc,
        )


def _wait_iface(pid: int, helper: Helper, timeout: float, argv: list[str]) -> None:
    """Wait until a non-loopback interface in the netns has an IPv4 address (pasta)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not helper.alive():
            raise EngineError("pasta exited early", "see the helper log", argv=argv)
        res = proc.run(
            [
                proc.which("nsenter") or "nsenter",
                f"--net={netns_path(pid)}",
                proc.which("ip") or "ip",
                "-4",
                "-o",
                "addr",
                "show",
                "scope",
                "global",
            ],
            check=False,
            timeout=5,
        )
        if res.returncode == 0 and "inet " in res.stdout:
            return
        time.sleep(0.1)
    raise EngineError("pasta did not configure the container's network in time", argv=argv)


def host_addresses() -> list[str]:
    """Every address on this host's interfaces (for refusing answers that point back here)."""
    res = proc.run([proc.which("ip") or "ip", "-o", "addr", "show"], check=False, timeout=10)
    out: list[str] = []
    for line in res.stdout.splitlines():
        parts = line.split()
        for i, tok in enumerate(parts):
            if tok in ("inet", "inet6") and i + 1 < len(parts):
                out.append(parts[i + 1].split("/", 1)[0])
    return out


def load_ruleset(pid: int, text: str) -> None:
    """Load `text` into the netns of `pid` as one nft transaction; raises EngineError.

    Through libnftables in a short-lived thread that joined the netns (a few ms); where the
    library cannot be loaded, through `nsenter … nft -f -` (two program starts, ~30 ms).
    """
    try:
        lib = _libnftables()
    except OSError:
        nft_apply(pid, text)
        return
    result: dict[str, str] = {}

    def work() -> None:
        try:
            fd = os.open(netns_path(pid), os.O_RDONLY)
            try:
                setns(fd, CLONE_NEWNET)
            finally:
                os.close(fd)
            ctx = lib.nft_ctx_new(0)
            if not ctx:
                raise OSError("nft_ctx_new failed")
            try:
                lib.nft_ctx_buffer_output(ctx)
                lib.nft_ctx_buffer_error(ctx)
                if lib.nft_run_cmd_from_buffer(ctx, text.encode()) != 0:
                    msg = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode("utf-8", "replace")
                    result["error"] = msg.strip() or "nft refused the ruleset"
            finally:
                lib.nft_ctx_free(ctx)
        except Exception as exc:
            result["error"] = str(exc)

    t = threading.Thread(target=work, name="nft-netns")
    t.start()
    t.join()
    if "error" in result:
        raise EngineError("nft (egress filter) refused the ruleset", stderr=result["error"])


def preload_nftables() -> None:
    """Load libnftables now if it is installed (see `_libnftables`); never fails."""
    with contextlib.suppress(OSError):
        _libnftables()


@functools.lru_cache(maxsize=1)
def _libnftables() -> Any:
    """libnftables through ctypes, its functions typed (OSError when it is not installed).

    Loaded once per process; the guard loads it while it waits for its container's pid
    (`preload_nftables`), so loading the library is not part of a container's start-up.
    """
    lib = ctypes.CDLL("libnftables.so.1", use_errno=True)
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    return lib
