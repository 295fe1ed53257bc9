"""podman calls, all through `linpodx.proc` (the one subprocess chokepoint).

Each function runs one podman command and turns its failure into an `EngineError` that carries
podman's own words plus a hint for the common causes (missing image, name taken, missing podman).
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from linpodx import proc
from linpodx.errors import EngineError, NotFound
from linpodx.podman import pslist, spawn
from linpodx.podman.hints import PODMAN_HINT, classify_hint, podman_json
from linpodx.podman.hints import podman_bin as podman_bin  # a member of the Podman protocol
from linpodx.proc import Child
from linpodx.profile import HOME_DIR


def podman(
    *args: str,
    what: str,
    hint: str | None = None,
    check: bool = True,
    timeout: float | None = proc.DEFAULT_TIMEOUT,
    input: bytes | None = None,
) -> proc.Result:
    """Run `podman ARGS…`; on failure raise EngineError with podman's words and a hint."""
    argv = (podman_bin(), *args)
    try:
        return proc.run(argv, check=check, timeout=timeout, input=input, what=what, hint=hint)
    except EngineError as err:
        if err.hint is None:
            err.hint = classify_hint(
                err.stderr, "see podman's message above; `linpodx doctor` checks the host"
            )
        raise


def create(create_argv: Sequence[str]) -> str:
    """`podman create …` (argv from `argv.build_create_argv`); returns the container id."""
    res = podman(*create_argv, what="podman create")
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""


def home_tar() -> bytes:
    """A tar holding just the `$HOME` directory entry (0700). `podman cp` (archive mode) chowns
    what it copies to the container's main user, so the agent owns its home."""
    import tarfile  # only for containers that keep their $HOME; not on every run

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(HOME_DIR.lstrip("/"))
        info.type = tarfile.DIRTYPE
        info.mode = 0o700
        info.mtime = int(time.time())
        tar.addfile(info)
    return buf.getvalue()


def create_home(name: str) -> None:
    """Create `$HOME` in the container's own rootfs before its first start (kept by restarts
    and by `podman commit`)."""
    podman("cp", "-", f"{name}:/", input=home_tar(), what="podman cp (create $HOME)")


def init(name: str, global_flags: Sequence[str] = ()) -> None:
    """`podman init`: namespaces exist and the container has a PID, its command not yet run.
    `global_flags` go before the command (`--hooks-dir=…`: the mounts are made here)."""
    podman(*global_flags, "init", name, what="podman init")


def start(name: str, global_flags: Sequence[str] = ()) -> None:
    """`podman start NAME` (detached), after `global_flags`."""
    podman(*global_flags, "start", name, what="podman start")


def start_attach_argv(
    name: str, interactive: bool, global_flags: Sequence[str] = ()
) -> tuple[str, ...]:
    """argv that starts NAME attached to this terminal (the CLI runs it with inherited stdio)."""
    argv = [podman_bin(), *global_flags, "start", "--attach"]
    if interactive:
        argv.append("--interactive")
    argv.append(name)
    return tuple(argv)


def attach_argv(
    name: str, *, detach_keys: str | None, no_stdin: bool, sig_proxy: bool
) -> tuple[str, ...]:
    """argv of `podman attach` to NAME (the CLI runs it with inherited stdio)."""
    argv = [podman_bin(), "attach"]
    if detach_keys is not None:
        argv.append(f"--detach-keys={detach_keys}")
    if no_stdin:
        argv.append("--no-stdin")
    argv += [f"--sig-proxy={'true' if sig_proxy else 'false'}", name]
    return tuple(argv)


def stop(name: str, timeout: int = 10) -> None:
    """`podman stop -t TIMEOUT NAME`."""
    podman("stop", f"--time={timeout}", name, what="podman stop", timeout=timeout + 60)


def remove(name: str, force: bool = False, *, check: bool = True) -> proc.Result:
    """`podman rm [-f] NAME` (NAME: a name or an id); with `force` the container goes at once,
    whatever runs in it. With `check=False` a failure is returned, not raised."""
    args = ["rm"]
    if force:
        args += ["--force", "--time=0"]
    return podman(*args, name, what="podman rm", check=check)


def remove_quietly(name: str) -> str | None:
    """Best-effort `podman rm -f` during cleanup; returns podman's words if it failed."""
    try:
        podman("rm", "--force", "--time=0", "--ignore", name, what="podman rm (cleanup)")
    except EngineError as err:
        return err.stderr.strip() or err.message
    return None


def inspect(name: str) -> dict[str, Any]:
    """`podman container inspect NAME` as a dict; NotFound if there is no such container."""
    res = podman("container", "inspect", name, what="podman inspect", check=False)
    if res.returncode != 0:
        if "no such container" in res.stderr.lower():
            raise NotFound(
                f"container not found: {name}", "list linpodx containers with `linpodx ps --all`"
            )
        raise EngineError(
            "podman inspect failed",
            classify_hint(res.stderr),
            argv=res.argv,
            returncode=res.returncode,
            stderr=res.stderr,
        )
    data = podman_json(res.stdout, "podman inspect", res.argv)
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise EngineError("podman inspect printed an unexpected document", argv=res.argv)
    return data[0]


def exists(name: str) -> bool:
    """True if a container called NAME exists (any state)."""
    res = podman("container", "exists", name, what="podman container exists", check=False)
    if res.returncode in (0, 1):
        return res.returncode == 0
    raise EngineError(
        "podman container exists failed",
        argv=res.argv,
        returncode=res.returncode,
        stderr=res.stderr,
    )


def container_pid(name: str) -> int:
    """PID of the container's init process (after `podman init` or while running)."""
    pid = inspect(name).get("State", {}).get("Pid", 0)
    if not isinstance(pid, int) or pid <= 0:
        raise EngineError(f"container {name} has no process", "it is not initialised or running")
    return pid


def state(info: dict[str, Any]) -> str:
    """`running`, `exited`, `created`, … from an inspect document."""
    st = info.get("State", {})
    return str(st.get("Status", "unknown")) if isinstance(st, dict) else "unknown"


def labels_of(info: dict[str, Any]) -> dict[str, str]:
    """The container's labels from an inspect document."""
    labels = info.get("Config", {}).get("Labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def list_managed(all_states: bool) -> list[dict[str, Any]]:
    """`podman ps` rows of linpodx containers only (label linpodx.managed=1)."""
    return pslist.start(all_states).rows()


def image_exists(image: str) -> bool:
    """True if IMAGE is in this user's store."""
    res = podman("image", "exists", image, what="podman image exists", check=False)
    return res.returncode == 0


def logs_argv(name: str, follow: bool) -> tuple[str, ...]:
    """argv of `podman logs [--follow] NAME`."""
    argv = [podman_bin(), "logs"]
    if follow:
        argv.append("--follow")
    argv.append(name)
    return tuple(argv)


def exec_argv(
    name: str, command: Sequence[str], interactive: bool, tty: bool, env: Sequence[str] = ()
) -> tuple[str, ...]:
    """argv of `podman exec [-i] [-t] [--env KEY=VALUE…] NAME CMD…`."""
    argv = [podman_bin(), "exec"]
    if interactive:
        argv.append("--interactive")
    if tty:
        argv.append("--tty")
    argv.extend(f"--env={e}" for e in env)
    argv.append(name)
    argv.extend(command)
    return tuple(argv)


def version() -> str:
    """podman's version string (`4.3.1`)."""
    res = podman("version", "--format={{.Client.Version}}", what="podman version", timeout=60)
    return res.stdout.strip()


STOP_TIMEOUT_SECONDS = 5
"""`stop_quietly`: seconds between podman's SIGTERM to the container and its SIGKILL."""


def stop_quietly(name_or_id: str) -> None:
    """`stop` that reports nothing: for a run whose container would not end after a signal
    was passed on to it (`spawn.hold_signals`)."""
    with contextlib.suppress(EngineError):
        stop(name_or_id, timeout=STOP_TIMEOUT_SECONDS)


def run_inherited(argv: Sequence[str], stop: Callable[[], None] | None = None) -> int:
    """Run podman with this process's stdin/stdout/stderr and wait; returns its exit status.

    This is the one place that does not capture output: `podman start --attach`, `podman exec`
    and `podman logs --follow` hand the person's terminal to the container (podman puts the TTY
    in raw mode and proxies signals itself). It is a Popen with inherited stdio rather than
    os.execvp so linpodx gets control back and can clean up a container that never started.
    While waiting, SIGINT is ignored here: in a TTY session Ctrl-C is a byte for the container,
    and otherwise podman (--sig-proxy) forwards it to the container; SIGTERM and SIGHUP are
    passed on to podman (`spawn.hold_signals`), and `stop` (if given, quiet) ends the container
    should it not end by itself after one, or should podman end on it while the container runs.
    Either way linpodx must not die and leave things behind.
    """
    import subprocess

    # The signals are held before podman starts: one that came between its start and the hold
    # would otherwise end linpodx (or unwind it) while podman and the container run on.
    # Signals that come before podman exists are passed on as soon as it does.
    started: list[subprocess.Popen[bytes]] = []
    early: list[int] = []

    def send(signum: int) -> None:
        if started:
            started[0].send_signal(signum)
        else:
            early.append(signum)

    old = spawn.hold_signals(send, stop)
    try:
        try:
            started.append(proc.popen(argv))
        except FileNotFoundError as exc:
            raise EngineError(f"{argv[0]} not found", PODMAN_HINT, argv=tuple(argv)) from exc
        for signum in early:
            started[0].send_signal(signum)
        rc = old.status(started[0].wait())
        if rc != 0 and old.received and stop is not None:
            # podman ended after a signal it was given, but a SIGTERM that lands before podman
            # set up its signal proxy ends podman itself and leaves the container running
            # (seen under load: exit 143, the container still `running`). Stop it here; a
            # container that already ended makes this a no-op. (`stop` reports nothing: the
            # run's own ending is what the person sees.)
            stop()
    finally:
        spawn.restore_signals(old)
    # podman itself ended by a signal: report it as a shell does (not as Python's -N).
    return 128 - rc if rc < 0 else rc


HELD_STDERR_MAX = 1024 * 1024
"""Bytes of stderr `run_announced` holds back before the container's id is announced; past it,
the reader waits (the pipe fills and the writer blocks), so memory stays bounded."""
CID_POLL_SECONDS = 0.002
PUMP_JOIN_SECONDS = 10.0
"""How long `run_announced` waits, on an error, for its output relay to reach the end."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_cid(cidfile: Path) -> str | None:
    try:
        cid = cidfile.read_text("ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    # podman writes the file after creating the container; a half-written id is not an id yet.
    return cid if len(cid) == 64 and all(c in "0123456789abcdef" for c in cid) else None


def run_announced(
    run_argv: Sequence[str],
    cidfile: Path,
    on_created: Callable[[str, Callable[[], bool]], None],
) -> int:
    """`podman run` (argv from `argv.build_run_argv`, global flags first) in the foreground,
    with `on_created(id, running)` called once the container exists and before any of its
    output is passed on; `running()` says whether podman is still at work (for waits there).

    The container's stdout and stderr reach ours through two pipes, held back until
    `on_created` has run, so what linpodx prints about the container comes first. stdin is
    inherited (this path is never used with a TTY). If podman exits without creating the
    container, nothing of its stderr was shown: it becomes the EngineError, with a hint, as for
    `podman create`. If `on_created` raises, podman (and with it the container) is ended and the
    error passes on; the caller removes what is left. Otherwise returns podman's exit status (the
    container's, or 125-127 when podman could not start it). Signals while waiting: as in
    `run_inherited`.
    """
    return relay_announced(start_run((podman_bin(), *run_argv)), cidfile, on_created)


def start_run(argv: Sequence[str]) -> Child:
    """Start `podman run` (argv[0] the full path of podman) with stdout/stderr in pipes."""
    try:
        return Child(argv)
    except FileNotFoundError as exc:
        raise EngineError(f"{argv[0]} not found", PODMAN_HINT, argv=argv) from exc
    except OSError as exc:
        raise EngineError(
            f"{argv[0]} could not be started: {exc.strerror or exc}", PODMAN_HINT, argv=argv
        ) from exc


def relay_announced(
    child: Child,
    cidfile: Path,
    on_created: Callable[[str, Callable[[], bool]], None],
) -> int:
    """The rest of `run_announced` for a `podman run` already started (`start_run`)."""
    import threading

    argv = child.argv
    out_fd, err_fd = child.out_fd, child.err_fd
    released = threading.Event()
    lock = threading.Lock()
    held = bytearray()

    printed = threading.Event()  # the container's stdout had something: it ran

    def pump_out() -> None:
        while chunk := os.read(out_fd, 65536):
            printed.set()
            released.wait()
            _write_all(1, chunk)

    def pump_err() -> None:
        while chunk := os.read(err_fd, 65536):
            with lock:
                if not released.is_set():
                    held.extend(chunk)
                    full = len(held) >= HELD_STDERR_MAX
                    chunk = b""
            if chunk:
                _write_all(2, chunk)
            elif full:
                released.wait()

    def release(show: bool) -> bytes:
        """Let the pumps pass output on; what stderr held so far is shown first (under the
        lock, so nothing overtakes it) or handed back."""
        with lock:
            released.set()
            said = bytes(held)
            held.clear()
            if show:
                _write_all(2, said)
        return said

    pumps = [threading.Thread(target=f, daemon=True) for f in (pump_out, pump_err)]
    for t in pumps:
        t.start()
    def stop() -> None:
        cid = read_cid(cidfile)
        if cid is not None:
            stop_quietly(cid)

    old = spawn.hold_signals(child.signal, stop)
    try:
        cid = None
        while cid is None and child.poll() is None:
            time.sleep(CID_POLL_SECONDS)
            cid = read_cid(cidfile)
        cid = cid or read_cid(cidfile)
        if cid is None:
            rc = child.wait()
            # podman's last words may still be in the pipe: let the stderr pump take them
            # into `held` first (bounded: it only waits for the release once `held` is full),
            # or they would be written raw before our `error:` line instead of inside it.
            pumps[1].join(PUMP_JOIN_SECONDS)
            # Release before joining the stdout pump: a pump that read output waits for the
            # release, so joining first hung for good (podman 4.3 runs the container even when
            # it cannot write the id file, e.g. on a full disk, and its output was then waiting
            # here). That output is the person's: it is passed on, never dropped.
            held_err = release(show=False)
            for t in pumps:
                t.join(PUMP_JOIN_SECONDS)
            stderr = held_err.decode("utf-8", "replace")
            default = "see podman's message above; `linpodx doctor` checks the host"
            what = f"podman run failed (exit {rc})"
            if rc == 0 or printed.is_set():
                what = (
                    f"podman ran the container but did not write its id (exit {rc}), so "
                    "linpodx could not record or announce it"
                )
            raise EngineError(
                what, classify_hint(stderr, default), argv=argv, returncode=rc, stderr=stderr
            )
        try:
            on_created(cid, lambda: child.poll() is None)
        except BaseException:
            # Whatever linpodx could not do for it (record its spec, say its id), the container
            # must not run on without it: end podman (its --sig-proxy ends the container).
            child.terminate()
            try:
                child.wait(timeout=10)
            except TimeoutError:
                child.kill()
                child.wait()
            raise
        finally:
            release(show=True)
        rc = old.status(child.wait())
        for t in pumps:
            t.join()
        return rc
    finally:
        spawn.restore_signals(old)
        # On an error too, the pumps pass on what podman wrote before it ended and stop at
        # end of file; the pipes are closed only when they have (a descriptor closed under a
        # reading thread could be reused by the next file this process opens).
        for t in pumps:
            t.join(PUMP_JOIN_SECONDS)
        if not any(t.is_alive() for t in pumps):
            child.close()


STREAM_CHUNK_BYTES = 64 * 1024


def stream_chunks(argv: Sequence[str], sink: Any) -> int:
    """Run a long-lived podman command (`logs --follow`) and feed its output (bytes, stdout
    and stderr merged) to `sink` as it arrives, in pieces of at most STREAM_CHUNK_BYTES;
    returns podman's exit status.

    Pieces, not lines: a line has no length limit (an agent can print 400 MB without a
    newline), so holding one whole would let the container size this process's memory.
    A Popen (not `proc.run`) because the output has no end while following.
    """
    import subprocess

    try:
        child = proc.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except FileNotFoundError as exc:
        raise EngineError(f"{argv[0]} not found", PODMAN_HINT, argv=tuple(argv)) from exc
    assert child.stdout is not None  # noqa: S101 - PIPE was requested just above
    fd = child.stdout.fileno()
    try:
        while chunk := os.read(fd, STREAM_CHUNK_BYTES):
            sink(chunk)
    except KeyboardInterrupt:
        child.terminate()
    finally:
        child.stdout.close()
    return child.wait()


# ----------------------------------------------------------------------------------------------
# The verbs of snapshots and rollback (`linpodx.snapshot`): images, commits, pauses, mounts and
# the container look-ups they need. They run `podman` by name (PATH), take no hint from
# `classify_hint` and keep their own messages, exactly as the snapshot code wrote them before
# they moved here. Looking a container up and removing one are the run paths' `inspect` and
# `remove` above (one verb each: the snapshot code needs no words of its own for them).

SNAP_PODMAN = "podman"


def _snap(*args: str, **kw: Any) -> proc.Result:
    return proc.run([SNAP_PODMAN, *args], **kw)


def _inspect_failed(res: proc.Result, hint: str | None = None) -> EngineError:
    return EngineError("podman container inspect failed", hint, argv=res.argv,
                       returncode=res.returncode, stderr=res.stderr)


def other_containers_info(own_id: str) -> list[dict[str, Any]]:
    """`podman inspect` of every container podman knows but `own_id` (running or not,
    linpodx's or not). One that goes away while we look is left out."""
    res = _snap("ps", "-a", "--no-trunc", "--format", "{{.ID}}", what="podman ps")
    ids = [i for i in res.stdout.split() if i and i != own_id]
    if not ids:
        return []
    # All at once; if one went away meanwhile (podman then fails the lot), one by one.
    r = _snap("container", "inspect", *ids, check=False, what="podman container inspect")
    if r.returncode == 0:
        with contextlib.suppress(EngineError, TypeError):  # (read one by one below)
            return [d for d in podman_json(r.stdout, "podman inspect") if isinstance(d, dict)]
    out: list[dict[str, Any]] = []
    for cid in ids:
        r = _snap("container", "inspect", cid, check=False, what="podman container inspect")
        if r.returncode != 0:
            if "no such container" in r.stderr.lower():
                continue
            raise _inspect_failed(r)
        data = podman_json(r.stdout, "podman inspect", r.argv)
        out += [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
    return out


def container_id_of(name: str) -> str | None:
    """The full id of the container under NAME, None if there is none."""
    res = _snap("container", "inspect", "--format", "{{.Id}}", name, check=False,
                what="podman container inspect")
    if res.returncode == 0:
        return res.stdout.strip()
    if "no such container" in res.stderr.lower():
        return None
    raise _inspect_failed(res)


def status_and_pid(name: str) -> tuple[str, int]:
    """The container's status (`running`, `paused`, …) and its init's pid (0 if none)."""
    res = _snap("inspect", "--type", "container", "--format", "{{.State.Status}} {{.State.Pid}}",
                name, what="podman inspect")
    status, _, pid = res.stdout.strip().partition(" ")
    return status, int(pid or "0")


def changes_size(cid: str) -> int:
    """Bytes of the container's changes to its image, at their apparent size (`SizeRw`)."""
    res = _snap("container", "inspect", "--size", "--format", "{{.SizeRw}}", cid,
                what="podman container inspect --size")
    try:
        return int(res.stdout.strip() or "0")
    except ValueError:
        raise EngineError("podman inspect --size printed no size", argv=res.argv,
                          stderr=res.stdout) from None


def graph_root() -> str:
    """The directory podman keeps this user's images and containers in."""
    return _snap("info", "--format", "{{.Store.GraphRoot}}", what="podman info").stdout.strip()


def pause(name: str) -> None:
    _snap("pause", name, what="podman pause")


def unpause(name: str, hint: str | None = None) -> None:
    _snap("unpause", name, what="podman unpause", hint=hint)


def mount_rootfs(cid: str) -> str:
    """`podman mount`: where the container's own filesystem is mounted ("" if podman said
    nothing)."""
    res = _snap("mount", cid, what="podman mount")
    return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""


def umount_rootfs(cid: str) -> None:
    _snap("umount", cid, check=False, what="podman umount")


def rename_container(ref: str, new: str, *, check: bool = True) -> proc.Result:
    """`podman rename REF NEW` (REF: id or name)."""
    return _snap("rename", ref, new, check=check, what="podman rename")


def unshare(argv: Sequence[str], *, what: str, timeout: float | None) -> proc.Result:
    """`podman unshare ARGV…` (rootless only: as root there is no user namespace to enter)."""
    return _snap("unshare", *argv, what=what, timeout=timeout)


def image_id(ref: str) -> str | None:
    """Full id of image `ref`, None if there is no such image."""
    res = _snap("image", "inspect", "--format", "{{.Id}}", ref, check=False,
                what="podman image inspect")
    if res.returncode != 0:
        if "image not known" in res.stderr or "no such image" in res.stderr.lower():
            return None
        raise EngineError(
            "podman image inspect failed",
            "podman's own words are above; `podman info` checks that podman works for you",
            argv=res.argv,
            returncode=res.returncode,
            stderr=res.stderr,
        )
    return res.stdout.strip() or None


def image_untagged(image: str) -> bool:
    """True if `image` exists and no name points at it (so it is nobody's but ours)."""
    res = _snap("image", "inspect", "--format", "{{len .RepoTags}}", image, check=False,
                what="podman image inspect")
    return res.returncode == 0 and res.stdout.strip() == "0"


def commit(cid: str, blank: Sequence[str] = ()) -> proc.Result:
    """`podman commit` of the container as it is (the caller holds it still), untagged; the
    new image's id is the last line of stdout. Each variable in `blank` (a run's own, `run -e`
    and `--env-file`) is left in the image's config without its value: podman copies the
    container's whole environment there, where `podman image inspect` shows it to anyone with
    the image, long after the container is gone."""
    changes = [arg for key in blank for arg in ("--change", f"ENV {key}=")]
    return _snap("commit", "--pause=false", "--quiet", *changes, cid, what="podman commit",
                 timeout=3600, hint="check free space in podman's storage (`podman system df`)")


def tag(image: str, ref: str) -> None:
    _snap("tag", image, ref, what="podman tag")


def untag(image: str, ref: str) -> None:
    _snap("untag", image, ref, what="podman untag")


def remove_image(ref: str) -> proc.Result:
    """`podman rmi REF`, which podman refuses while a container uses the image."""
    return _snap("rmi", ref, check=False, what="podman rmi")
