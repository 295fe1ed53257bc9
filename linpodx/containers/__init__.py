"""The container service: run, start, stop, rm, exec, with audit before every action.

Sequence for a new container (`create_and_start`):
  audit `container.run` -> [egress: guard.prepare writes resolv.conf] -> `podman create`
  (`--network=none`, argv from the pure builder) -> create `$HOME` in the rootfs ->
  [egress: `podman init` -> guard.attach(name, pid, profile)] -> `podman start`.
Any failure after `podman create` removes what was created and says so. A container is never
started unless its `container.run`/`container.start` record is in the administrative chain.

Where things are:
  request   RunRequest, ContainerInfo, the profile revision a run is under
  plan      the CreateSpec and `container.run` record of a run (checks only, changes nothing)
  record    audit before acting; `recorded(...)`, the frame whose Outcome records a failure
  state     the run spec and the name's lock under `containers_dir()/NAME`; rollback refusal
  bringup   mount pins, guard, `podman init`/`start`, clean-up after a failure
  pipeline  the one run pipeline (modes detached, attached, one call, resumed)
  manage    start, stop, rm, exec, ps, inspect, logs
  runner    the podman calls of all of them, as one object (`runner.use` hands in another)
This module is the API the CLI, snapshot, the fast path (`linpodx.fastpath`) and mcp use.
Its names load on first use (PEP 562 `__getattr__`): `linpodx ps` imports
`linpodx.containers.listing` alone, and importing every submodule here cost it ~0.1 s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from linpodx.containers.bringup import pin_mounts
    from linpodx.containers.manage import (
        STOP_TIME_MAX,
        attach,
        egress_status,
        exec_in,
        inspect,
        logs,
        managed_info,
        managed_names,
        ps,
        remove,
        start,
        stop,
    )
    from linpodx.containers.pipeline import (
        attached_start,
        create_and_start,
        run,
        run_foreground,
        run_started,
        save_plan,
    )
    from linpodx.containers.plan import (
        check_mount_sources,
        host_limits,
        make_spec,
        needs_guard,
        one_call,
        spec_from_record,
        unapplied_limits,
    )
    from linpodx.containers.record import REASON_MAX, Outcome, audit, audit_stopping, recorded
    from linpodx.containers.request import (
        Announce,
        ContainerInfo,
        RunRequest,
        profile_by_id,
        resolve_profile,
    )
    from linpodx.containers.state import (
        MAX_SPEC_BYTES,
        SPEC_VERSION,
        forget,
        load_spec,
        lock_name,
        read_spec_bytes,
        refuse_if_rolling_back,
        save_spec,
        spec_dir,
        spec_path,
    )
    from linpodx.profile.model import BUILTIN_ID, ProfileRef, builtin_ref

_WHERE: dict[str, str] = {
    **dict.fromkeys(
        (
            "pin_mounts",
        ),
        "linpodx.containers.bringup",
    ),
    **dict.fromkeys(
        (
            "STOP_TIME_MAX", "attach", "egress_status", "exec_in", "inspect", "logs",
            "managed_info", "managed_names", "ps", "remove", "start", "stop"
        ),
        "linpodx.containers.manage",
    ),
    **dict.fromkeys(
        (
            "attached_start", "create_and_start", "run", "run_foreground", "run_started",
            "save_plan"
        ),
        "linpodx.containers.pipeline",
    ),
    **dict.fromkeys(
        (
            "check_mount_sources", "host_limits", "make_spec", "needs_guard", "one_call",
            "spec_from_record", "unapplied_limits"
        ),
        "linpodx.containers.plan",
    ),
    **dict.fromkeys(
        (
            "Outcome", "REASON_MAX", "audit", "audit_stopping", "recorded"
        ),
        "linpodx.containers.record",
    ),
    **dict.fromkeys(
        (
            "Announce", "ContainerInfo", "RunRequest", "profile_by_id", "resolve_profile"
        ),
        "linpodx.containers.request",
    ),
    **dict.fromkeys(
        (
            "MAX_SPEC_BYTES", "SPEC_VERSION", "forget", "load_spec", "lock_name", "read_spec_bytes",
            "refuse_if_rolling_back", "save_spec", "spec_dir", "spec_path"
        ),
        "linpodx.containers.state",
    ),
    **dict.fromkeys(
        (
            "BUILTIN_ID", "ProfileRef", "builtin_ref"
        ),
        "linpodx.profile.model",
    ),
}  # fmt: skip
"""Where each name of the API is defined (loaded by `__getattr__` when first asked for)."""


def _module(where: str) -> Any:
    """The submodule `where` names, imported now (by import statements: no module is named by
    a string at run time, `tests/unit/test_layers.py`)."""
    if where == "linpodx.containers.bringup":
        from linpodx.containers import bringup
        return bringup
    elif where == "linpodx.containers.manage":
        from linpodx.containers import manage
        return manage
    elif where == "linpodx.containers.pipeline":
        from linpodx.containers import pipeline
        return pipeline
    elif where == "linpodx.containers.plan":
        from linpodx.containers import plan
        return plan
    elif where == "linpodx.containers.record":
        from linpodx.containers import record
        return record
    elif where == "linpodx.containers.request":
        from linpodx.containers import request
        return request
    elif where == "linpodx.containers.state":
        from linpodx.containers import state
        return state
    else:
        from linpodx.profile import model

        return model


def __getattr__(name: str) -> Any:
    """The API's NAME from its submodule, imported now (then kept: later lookups are plain)."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "BUILTIN_ID", "MAX_SPEC_BYTES", "REASON_MAX", "SPEC_VERSION", "STOP_TIME_MAX", "Announce",
    "ContainerInfo", "Outcome", "ProfileRef", "RunRequest", "attach", "attached_start", "audit",
    "audit_stopping", "builtin_ref", "check_mount_sources", "create_and_start", "egress_status",
    "exec_in", "forget", "host_limits", "inspect", "load_spec", "lock_name", "logs",
    "make_spec", "managed_info", "managed_names", "needs_guard", "one_call", "pin_mounts",
    "profile_by_id",
    "ps", "read_spec_bytes", "recorded", "refuse_if_rolling_back", "remove", "resolve_profile",
    "run", "run_foreground", "run_started", "save_plan", "save_spec", "spec_dir",
    "spec_from_record", "spec_path", "start", "stop", "unapplied_limits",
]  # fmt: skip
