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
"""

from __future__ import annotations

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
