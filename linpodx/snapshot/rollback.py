"""`linpodx snapshot rollback` and `snapshot recover`: the rollback saga and its recovery.

A rollback is `STEPS` (extract → stop → rename → swap → create → verify), each with the undo
that puts back what it changed, run by `saga.Saga` with the journal (`journal.py`) written
before each step; then the commit record, after which the original is removed instead of put
back. A failure undoes the steps that may have started, last first; a rollback killed outright
is undone by `recover` from its journal with the very same undos (or, once committed,
finished).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from linpodx import proc
from linpodx.containers import sessions
from linpodx.containers.manage import revision_of
from linpodx.errors import (
    EXIT_AUDIT,
    EngineError,
    InvalidInput,
    LinpodxError,
    NotFound,
)
from linpodx.ids import new_ulid
from linpodx.output import note
from linpodx.podman import engine
from linpodx.snapshot import egresskeep, journal, lifecycle, manifest, runner, workspace
from linpodx.snapshot.container import (
    PROFILE_LABELS,
    Container,
    inspect_container,
    require_managed,
)
from linpodx.snapshot.lock import container_lock
from linpodx.snapshot.names import check_container_name, check_label, image_ref, snapshot_dir
from linpodx.snapshot.records import audit, emit
from linpodx.snapshot.saga import NO_FAULTS, Faults, Saga, Step

# ----------------------------------------------------------------------------------------------
# the steps and their undos


@dataclass
class _Rollback:
    """One rollback in progress, or the recovery of a killed one (then only `jour` and
    `lock_fd` are known, and only the undos run): what the steps and undos act on."""

    jour: journal.Journal
    lock_fd: int
    faults: Faults = NO_FAULTS
    # Known to a rollback only (its checks found them):
    man: dict[str, Any] = field(default_factory=dict)
    orig_labels: dict[str, str] = field(default_factory=dict)
    # The newest egress policy the original had been given, which the new container keeps.
    kept: dict[str, Any] | None = None
    restores: list[workspace.Restore] = field(default_factory=list)
    new: Container | None = None
    enforced: dict[str, Any] | None = None
    # The last step the journal is known to name (what an error says it failed at).
    step: str = journal.STEPS[0]
    # Set by `_undo`: the egress policy the original gets back, whether the swap may have
    # started, and what the undos found.
    keep: dict[str, Any] | None = None
    swap_started: bool = False
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.jour.container

    def at(self, step: str) -> None:
        """Write-ahead: the journal names the step before it changes anything."""
        if self.jour.step != step:
            self.jour = replace(self.jour, step=step)
            journal.write(self.jour)
        self.step = step

    def holding(self) -> contextlib.AbstractContextManager[None]:
        # The short-lived programs of the steps hold the container's lock with us: one still
        # running after a kill -9 keeps the next command's recovery waiting until it is done,
        # instead of racing it (`proc.lending`). Not the create step: its conmon lives as long
        # as the new container.
        return proc.lending(self.lock_fd)


def _extract(r: _Rollback) -> None:
    """Each archive into a staging dir beside its mount source; the live workspace is
    untouched."""
    sdir = snapshot_dir(r.name, r.jour.label)
    for entry in r.man["mounts"]:
        restore = workspace.Restore(entry, r.jour.rollback_id)
        r.restores.append(restore)
        with r.holding():
            restore.extract(sdir / str(entry["file"]))


def _drop_staging(r: _Rollback) -> None:
    if r.swap_started:
        return  # the swap's undo dropped the staging copies with the rest, whatever it found
    for m in reversed(r.jour.mounts):
        r.problems += workspace.undo_interrupted(
            Path(m["source"]), r.jour.rollback_id, existed=bool(m["existed"]), swap_started=False
        )


def _stop(r: _Rollback) -> None:
    if r.jour.was_running:
        # Each attached terminal (`rollback --force`) prints this when its session ends.
        sessions.tell_all(r.name, f"{r.name} was stopped by `linpodx snapshot rollback "
                          f"{r.name} --to {r.jour.label}` (from another terminal); once it is "
                          f"done, get back in with `linpodx attach {r.name}`")
        with r.holding():
            lifecycle.stop(r.name, r.kept)


def _put_policy_back(r: _Rollback) -> None:
    try:
        # Stopping (detaching the guard) and removing the new container took the name's policy
        # file away; a start of the original without it would enforce its creation revision.
        egresskeep.put_back(r.name, r.keep)
    except (OSError, LinpodxError) as exc:
        r.problems.append(f"could not restore the egress policy: {_said(exc)}")


def _rename_aside(r: _Rollback) -> None:
    with r.holding():
        engine.rename_container(r.jour.orig_id, r.jour.aside)


def _rename_back(r: _Rollback) -> None:
    try:
        _rename_original_back(r)
    except LinpodxError as exc:
        # A problem, not a raise (podman erring or timing out): the undos after this one (the
        # egress policy, which a re-apply finds the container by, and the staging dirs) must
        # still run, as they did before it when the undo was one function.
        r.problems.append(f"could not rename {r.jour.aside} back to {r.name}: {_said(exc)}")


def _rename_original_back(r: _Rollback) -> None:
    orig = _inspect_or_none(r.jour.orig_id)
    if orig is None or orig.name == r.name:
        return  # back already, or removed outside linpodx (`_settle` says so)
    if _inspect_or_none(r.name) is not None:
        r.problems.append(f"cannot rename {r.jour.aside} back: a container named {r.name} "
                          "exists")
        return
    res = engine.rename_container(r.jour.orig_id, r.name, check=False)
    if res.returncode != 0:
        r.problems.append(f"could not rename {r.jour.aside} back to {r.name}: "
                          f"{res.stderr.strip()}")


def _swap(r: _Rollback) -> None:
    for restore in r.restores:
        restore.swap()


def _swap_back(r: _Rollback) -> None:
    for m in reversed(r.jour.mounts):
        r.problems += workspace.undo_interrupted(
            Path(m["source"]), r.jour.rollback_id, existed=bool(m["existed"]), swap_started=True
        )


def _create(r: _Rollback) -> None:
    lifecycle.create_from(
        r.name, str(r.man["image"]), r.orig_labels.get("linpodx.profile_id", ""),
        start=r.jour.was_running, egress_policy=r.kept, env_from=r.jour.orig_id,
    )


def _remove_new(r: _Rollback) -> None:
    r.problems += _remove_if_made_by(r.jour)
    lifecycle.detach_guard(r.name)  # a guard made ready for the new container, if any
    # (LinpodxError too: the state dir's checks raise it. Every undo must still run: the
    # workspaces and the original come back whatever one of them says.)
    try:
        lifecycle.restore_spec(r.name, r.jour.spec_bytes())
    except (OSError, LinpodxError) as exc:
        r.problems.append(f"could not restore the run spec: {_said(exc)}")


def _verify(r: _Rollback) -> None:
    new = Container.of(inspect_container(r.name))
    if new.id == r.jour.orig_id:
        raise EngineError("the new container has the original's id")
    diff = [k for k in PROFILE_LABELS if new.labels.get(k) != r.orig_labels.get(k)]
    if diff:
        raise EngineError(f"the new container's labels differ: {', '.join(diff)}")
    if r.jour.was_running and not new.running:
        raise EngineError("the new container is not running")
    r.enforced = _check_egress(r.name, r.kept, running=r.jour.was_running)
    r.new = new


# In the order they run (the journal's steps, `journal.STEPS`, up to `commit`). Each fault
# point sits AFTER its step changed something, so tests prove the undo.
STEPS: Saga[_Rollback] = Saga((
    Step("extract", _extract, _drop_staging),
    Step("stop", _stop, _put_policy_back),
    Step("rename", _rename_aside, _rename_back),
    Step("swap", _swap, _swap_back),
    Step("create", _create, _remove_new),
    Step("verify", _verify),
))


def _undo(r: _Rollback) -> list[str]:
    """Put the original container and workspace back from what is really there (the journal's
    step says how far the rollback may have got, not how far it did); clear the journal once
    nothing is half done. For a failed rollback (in-process) and a killed one (recovery) alike.
    Returns the problems that stop it; `r.notes` gets what is worth saying but is not one."""
    # The egress policy the original gets back: the one it had been given (journal), or a
    # newer one a re-apply pushed to the name after a kill let the name's lock go.
    r.keep = egresskeep.newest(r.jour.egress_policy, egresskeep.current_or_none(r.name))
    r.swap_started = journal.STEPS.index(r.jour.step) >= journal.STEPS.index("swap")
    with proc.lending(r.lock_fd):  # short-lived programs only, as in the steps
        STEPS.undo(r, r.jour.step)
    if r.problems:
        return r.problems
    _settle(r)
    return r.problems


def _settle(r: _Rollback) -> None:
    """The original is back in place. If it ran, starting it again is all that is left, and the
    journal says so first (a kill during the start is recovered by starting it)."""
    if _inspect_or_none(r.jour.orig_id) is None:
        # Removed outside linpodx meanwhile: with its workspace back, nothing is half done.
        r.notes.append(f"the original container ({r.jour.orig_id[:12]}) was removed outside "
                       f"linpodx, so there is no {r.name} any more")
        journal.clear(r.name)
    elif r.jour.was_running:
        with contextlib.suppress(OSError):
            journal.write(replace(r.jour, step="undone"))
        _restart(r)
    else:
        journal.clear(r.name)


def _restart(r: _Rollback) -> None:
    """The last of an undo: start the original again if it is not running (it ran before the
    rollback), then drop the journal. A start that fails is said, not a reason to keep the
    container blocked: it is whole, only stopped."""
    r.faults.at("restart")
    with contextlib.suppress(OSError):  # the undo put it back already; this is for a kill
        egresskeep.put_back(r.name, r.jour.egress_policy)
    now = _inspect_or_none(r.name)
    if now is not None and not now.running:
        try:
            lifecycle.start(r.name)  # not lending: its conmon lives as long as the container
        except LinpodxError as exc:
            r.notes.append(f"{r.name} is back but could not be started again: {_said(exc)}; "
                           f"start it with `linpodx start {r.name}`")
    journal.clear(r.name)


def _finish(r: _Rollback) -> list[str]:
    """A recovery of a committed rollback (the new container was checked): remove the original
    and the moved-aside copies, as the rollback would have."""
    jour = r.jour
    problems: list[str] = []
    res = engine.remove(jour.orig_id, force=True, check=False)
    if res.returncode != 0 and "no such container" not in res.stderr.lower():
        problems.append(f"could not remove the original container {jour.aside}: "
                        f"{res.stderr.strip()}")
    for m in jour.mounts:
        problems += workspace.finish_interrupted(Path(m["source"]), jour.rollback_id)
    if not problems:
        journal.clear(jour.container)
    return problems


def _inspect_or_none(ref: str) -> Container | None:
    try:
        return Container.of(inspect_container(ref))
    except NotFound:
        return None


def _remove_if_made_by(jour: journal.Journal) -> list[str]:
    """Remove the container under NAME if the rollback made it: a linpodx container from the
    snapshot's image that is not the original. Anything else under NAME is left alone."""
    name = jour.container
    new = _inspect_or_none(name)
    if new is None or new.id == jour.orig_id:
        return []
    if not (new.managed and new.image_name == jour.image):
        return [f"a container named {name} that the rollback did not create is in the way"]
    try:
        lifecycle.remove_new(name, new.id)
    except LinpodxError as exc:
        return [f"could not remove the new container: {exc.message}"]
    return []


def _said(exc: BaseException) -> str:
    # With podman's last words: "podman init failed (exit 125)" alone says little.
    return _reason(exc)


# ----------------------------------------------------------------------------------------------
# rollback


def _verify_snapshot(name: str, label: str) -> dict[str, Any]:
    man = manifest.read(name, label)
    ref = str(man.get("image"))
    if ref != image_ref(name, label):
        raise LinpodxError(
            f"snapshot manifest names another image: {ref[:200]}",
            f"the manifest is damaged; remove the snapshot with "
            f"`linpodx snapshot rm {name} --label {label}` and create it again",
        )
    iid = runner.host().image_id(ref)
    if iid is None:
        raise NotFound(
            f"snapshot image missing: {ref}",
            "the image was removed outside linpodx; remove the snapshot with "
            f"`linpodx snapshot rm {name} --label {label}`",
        )
    if iid != man["image_id"]:
        raise LinpodxError(
            f"snapshot image {ref} is {iid[:12]}, the snapshot recorded {man['image_id'][:12]}",
            "the tag was moved outside linpodx; nothing was changed",
        )
    sdir = snapshot_dir(name, label)
    for entry in man["mounts"]:
        f = sdir / str(entry.get("file"))
        if not f.is_file():
            raise NotFound(f"workspace archive missing: {f}", "nothing was changed")
        if workspace.sha256_file(f) != entry.get("sha256"):
            raise LinpodxError(
                f"workspace archive {f.name} of {name} --label {label} does not match its "
                "recorded sha256",
                "the archive was changed or damaged; nothing was changed",
            )
    return man


def rollback(
    name: str, label: str, *, force: bool = False, faults: Faults = NO_FAULTS
) -> dict[str, Any]:
    """Recreate container `name` from snapshot `label` and restore its workspace, safely.

    A rollback of `name` that was interrupted before (its journal is left) is recovered first.
    Nothing changes until every check passed (snapshot image and archive digests, container,
    mounts, spec). Then `STEPS`: extract archives into staging dirs → stop the container →
    rename it aside → swap the workspace dirs → create and start the new container from the
    snapshot image via the containers service → check it; then record the commit and remove
    the original and the moved-aside copies. A failure at any step undoes the steps before it
    (new container removed, workspace swapped back, original renamed back and started again if
    it was running) and the error says so. The journal (`linpodx.snapshot.journal`) names the
    step about to be taken, so a rollback killed outright is undone (or, once committed,
    finished) by the next `snapshot rollback` or `snapshot recover` of `name`. A container
    with an attached session (`sessions`) is refused unless `force` (then warned about, and
    its terminals told). `faults` is for tests only (`saga.Faults`).
    """
    check_container_name(name)
    check_label(label)
    with container_lock(name) as lock_fd, lifecycle.hold_name(name):
        recovered = _recover_locked(name, lock_fd, faults)
        man = _verify_snapshot(name, label)
        orig = _check_rollback(name, label, man)
        if orig.running:
            _check_sessions(name, label, force)
        r = _begin(name, label, man, orig, lock_fd, faults)
        try:
            STEPS.run(r, r.at, faults)
            # Removing the original cannot be undone: recorded first (a failed record undoes).
            # Write-ahead as for every step: the journal says `commit` before the record does,
            # so a record in the chain always means that recovery finishes, never undoes.
            r.at("commit")
            assert r.new is not None  # noqa: S101 - the verify step set it or raised
            audit("snapshot.rollback.commit", {"rollback_id": r.jour.rollback_id,
                                               "container": name, "container_id": r.new.id,
                                               "previous_id": orig.id,
                                               "egress_policy": r.enforced})
        except BaseException as exc:  # Ctrl-C too: the original must come back either way
            _undo_failed(r, exc)
            raise
        faults.at("commit")
        leftovers = _clean_up_committed(r)
        new = Container.of(inspect_container(name))
    emit("snapshot.rollback", container=name, label=label, status="succeeded",
         rollback_id=r.jour.rollback_id)
    result: dict[str, Any] = {
        "rolled_back": True,
        "container": name,
        "label": label,
        "image": man["image"],
        # Whole ids and the revision as a number, as `run --json` and `ps --json` give them.
        "container_id": new.id,
        "previous_id": orig.id,
        "revision": revision_of(new.labels.get("linpodx.revision")),
        "restored": [str(e["target"]) for e in man["mounts"]],
    }
    if recovered is not None:
        result["recovered_first"] = recovered
    if leftovers:
        result["leftovers"] = leftovers
    return result


def _check_rollback(name: str, label: str, man: dict[str, Any]) -> Container:
    """Everything a rollback of `name` to `man` needs, checked before anything changes;
    returns the container as it is."""
    info = require_managed(name)
    orig = Container.of(info)
    if orig.auto_remove:
        raise InvalidInput(
            f"{name} was started with --rm: stopping it for the rollback would remove it",
            "roll back only containers run without --rm; nothing was changed",
        )
    if orig.paused:
        # Neither running nor stopped: which one the rolled-back container should be is the
        # person's call, not ours (a snapshot worker that died may also have left it so).
        raise InvalidInput(
            f"{name} is paused",
            # (podman 4.3 refuses to stop a paused container: unpause comes first either way.)
            f"run `podman unpause {name}` (and then `linpodx stop {name}` to roll it back "
            "stopped), then roll back again; nothing was changed",
        )
    current = {(m.source, m.target) for m in workspace.writable_mounts(info)}
    recorded = {(str(e["source"]), str(e["target"])) for e in man["mounts"]}
    if current != recorded:
        raise InvalidInput(
            f"the writable mounts of {name} changed since snapshot {label}",
            "roll back only to a snapshot taken with the same mounts; nothing was changed",
        )
    workspace.check_workspace(name, info, for_rollback=True)
    for entry in man["mounts"]:
        workspace.check_restorable(entry)
    lifecycle.check_recreatable(name, orig.labels.get("linpodx.profile_id", ""))
    return orig


def _check_sessions(name: str, label: str, force: bool) -> None:
    """Warn before stopping a container someone is attached to (`run -it`, `attach`): the
    rollback goes on, as the walk-through's own step 7 does under its `run -it` terminal, and
    the attached terminal is told why it ended and how to get back in (`_stop`). `force`: no
    warning (a script that knows)."""
    attached = sessions.live(name)
    if not attached or force:
        return
    who = ", ".join(s.describe() for s in attached)
    note(
        f"warning: {name} has an attached session ({who}); the rollback stops it (its terminal "
        f"is told, and how to get back in: `linpodx attach {name}`)"
    )


def _begin(
    name: str, label: str, man: dict[str, Any], orig: Container, lock_fd: int, faults: Faults
) -> _Rollback:
    """Journal and record the rollback (the record first: if it cannot be written, nothing
    happens); returns it, at its first step."""
    # Before anything changes: the newest allowlist the container had been given (a
    # re-apply's, not only its creation revision's), which the new container must keep.
    kept = egresskeep.current(name)
    rb_id = new_ulid()
    jour = journal.new(
        rollback_id=rb_id, container=name, label=label, image=str(man["image"]),
        orig_id=orig.id, aside=journal.aside_name(name, rb_id), was_running=orig.running,
        spec=lifecycle.save_spec(name), mounts=list(man["mounts"]), egress_policy=kept,
    )
    # The journal needs disk space, the record comes first: stage it, record, rename it in.
    staged = journal.stage(jour)
    try:
        audit(
            "snapshot.rollback",
            {
                "rollback_id": rb_id,
                "container": name,
                "container_id": orig.id,
                "label": label,
                "image": man["image"],
                "image_id": man["image_id"],
                "egress_policy": egresskeep.summary(kept),
            },
        )
    except BaseException:
        staged.discard()
        raise
    try:
        staged.commit()
    except OSError as exc:
        _audit_quietly("snapshot.rollback.undo", {"rollback_id": rb_id, "container": name,
                                                  "step": "journal", "reason": str(exc)})
        raise LinpodxError(
            f"the rollback of {name} was recorded but its journal could not be written "
            f"({exc.strerror or exc}); nothing was changed",
            "check the state dir (free space, permissions) and roll back again",
            exit_code=EXIT_AUDIT,
        ) from None
    emit("snapshot.rollback", container=name, label=label, status="started",
         rollback_id=rb_id)
    return _Rollback(jour=jour, lock_fd=lock_fd, faults=faults, man=man,
                     orig_labels=dict(orig.labels), kept=kept)


def _clean_up_committed(r: _Rollback) -> list[str]:
    """Committed: the old container and the moved-aside workspace copies go. What is left is
    garbage, not a half-done rollback (named, returned): the journal goes either way."""
    leftovers = []
    with r.holding():
        res = engine.remove(r.jour.orig_id, force=True, check=False)
    if res.returncode != 0:
        leftovers.append(f"old container {r.jour.aside}")
    for restore in r.restores:
        with r.holding():
            leftovers += restore.cleanup()
    journal.clear(r.name)
    return leftovers


def _undo_failed(r: _Rollback, exc: BaseException) -> None:
    """A step (or the commit record) of rollback `r` failed with `exc`: undo it and raise the
    error that says so. Anything but an Exception or a Ctrl-C is left to the caller to raise
    once the undo ran."""
    name, label, rb_id, step = r.name, r.jour.label, r.jour.rollback_id, r.step
    if r.jour.step == "commit":
        # Not recorded: undone after all, so first the journal must say so (recovery would
        # otherwise finish what is being undone).
        with contextlib.suppress(OSError):
            r.at("verify")
    _audit_quietly("snapshot.rollback.undo", {"rollback_id": rb_id, "container": name,
                                              "step": step, "reason": _reason(exc)})
    problems = _undo(r)
    if not isinstance(exc, (Exception, KeyboardInterrupt)):
        return
    reason = _reason(exc)
    emit("snapshot.rollback", container=name, label=label, status="failed",
         rollback_id=rb_id, step=step, undone=not problems)
    if not problems:
        failed = LinpodxError(
            f"rollback of {name} to {label} failed at step {step}: {reason}; the "
            "original container and workspace were put back as they were"
            + "".join(f"; {n}" for n in r.notes),
            "fix the cause and roll back again",
            exit_code=(
                exc.exit_code if isinstance(exc, LinpodxError)
                else 130 if isinstance(exc, KeyboardInterrupt) else 1
            ),
            details={"step": step, "restored": True},
        )
        raise _with_podmans_words(failed, exc) from None
    raise LinpodxError(
        f"rollback of {name} to {label} failed at step {step}: {reason}; undoing it "
        f"also failed: {'; '.join(problems)}",
        f"fix what is named there and run `linpodx snapshot recover {name}`, which "
        f"tries the undo again (the original container may be named {r.jour.aside}; "
        f"moved-aside workspace copies end in .linpodx-before-{rb_id})",
        details={"step": step, "restored": False, "problems": problems},
    ) from None


def _check_egress(
    name: str, kept: dict[str, Any] | None, *, running: bool
) -> dict[str, Any] | None:
    """The new container's egress policy (profile, id, revision, for the commit record), checked
    to be no older than the one the original had been given, `kept`; and, if it runs, the one
    its guard reports it enforces. EngineError otherwise (the rollback is then undone)."""
    now = egresskeep.current(name)
    if kept is not None and (now is None or egresskeep.newer(kept, now)):
        got = "none" if now is None else f"revision {now['revision']}"
        raise EngineError(
            f"the new container's egress policy is {got}, the original had been given "
            f"revision {kept['revision']}"
        )
    if now is not None and running and egresskeep.enforced_revision(name) != now["revision"]:
        raise EngineError(
            f"the new container's egress guard does not report revision {now['revision']}"
        )
    return egresskeep.summary(now)


def _with_podmans_words(err: LinpodxError, exc: BaseException) -> LinpodxError:
    """`err`, as an EngineError that shows what podman said (all of it, not only the last line
    in the message) when a podman call failed the step; `err` itself otherwise."""
    if not (isinstance(exc, EngineError) and exc.stderr.strip()):
        return err
    out = EngineError(err.message, err.hint, argv=exc.argv, returncode=exc.returncode,
                      stderr=exc.stderr)
    out.exit_code, out.details = err.exit_code, err.details
    return out


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, LinpodxError):
        reason = exc.message
        if isinstance(exc, EngineError) and exc.stderr.strip():
            reason += f": {exc.stderr.strip().splitlines()[-1]}"
        return reason
    return f"{type(exc).__name__}: {exc}"


def _audit_quietly(event_type: str, data: dict[str, Any]) -> bool:
    """Record an undo. It puts things back as they were, so it goes ahead even when the record
    cannot be written (refusing would leave the half-done state in place); False then."""
    try:
        audit(event_type, data)
    except LinpodxError:
        return False
    return True


# ----------------------------------------------------------------------------------------------
# recovery of a rollback that was killed part-way


def recover(name: str, *, faults: Faults = NO_FAULTS) -> dict[str, Any]:
    """`linpodx snapshot recover NAME`: undo (or, once committed, finish) a rollback of NAME
    that was interrupted, from its journal. Nothing to do is not an error. `faults` is for
    tests only (`saga.Faults`)."""
    check_container_name(name)
    with container_lock(name) as lock_fd, lifecycle.hold_name(name):
        done = _recover_locked(name, lock_fd, faults)
    if done is None:
        return {"recovered": False, "container": name}
    return {"recovered": True, "container": name, **done}


def _recover_locked(name: str, lock_fd: int, faults: Faults) -> dict[str, Any] | None:
    """Recover NAME's interrupted rollback, if its journal says there is one (the caller holds
    the container's snapshot lock, so its owner cannot still be at work on it)."""
    journal.sweep_temps(name)
    jour = journal.read(name)
    if jour is None:
        return None
    if jour.owned_here() or jour.owner_alive():
        raise LinpodxError(
            f"a rollback of {name} (to {jour.label}) is in progress (pid {jour.pid})",
            "wait for it to finish, then retry",
        )
    finishing = jour.step == "commit"
    action = "finish" if finishing else "restart" if jour.step == "undone" else "undo"
    audit(
        "snapshot.rollback.recover",
        {"rollback_id": jour.rollback_id, "container": name, "label": jour.label,
         "step": jour.step, "action": action},
    )
    # Taken over: the containers service now lets this process act on the container.
    jour = journal.owned(jour)
    journal.write(jour)
    r = _Rollback(jour=jour, lock_fd=lock_fd, faults=faults)
    if finishing:
        with proc.lending(lock_fd):  # as in `rollback`: a kill here leaves no podman racing
            problems = _finish(r)
    elif action == "restart":
        problems = []
        _restart(r)
    else:
        problems = _undo(r)
    emit("snapshot.rollback", container=name, label=jour.label, rollback_id=jour.rollback_id,
         status="recovered" if not problems else "recovery failed", action=action)
    if problems:
        raise LinpodxError(
            f"recovering the interrupted rollback of {name} to {jour.label} ({action}) did "
            f"not finish: {'; '.join(problems)}",
            f"fix what is named there and run `linpodx snapshot recover {name}` again",
            details={"problems": problems},
        )
    out: dict[str, Any] = {
        "rollback_id": jour.rollback_id,
        "label": jour.label,
        "interrupted_at": jour.step,
        "action": {"finish": "finished", "restart": "restarted"}.get(action, "undone"),
    }
    if r.notes:
        out["notes"] = r.notes
    return out
