"""`linpodx sandbox …`: validate, apply, list, show and remove sandbox profiles."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from ruamel.yaml import YAML

from linpodx.cli.common import JsonOpt, QuietOpt, new_app, run_command
from linpodx.errors import LinpodxError, NotFound, UsageError
from linpodx.ids import is_id
from linpodx.output import hides_text, kv_line, note, print_lines, safe_text
from linpodx.profile import store
from linpodx.profile.loader import load_file
from linpodx.suggest import add_to_hint

app = new_app("Write, check and apply sandbox profiles (YAML).")


def _profile_file(value: str) -> Path:
    """The file as given: an empty one would be read as `.` (pathlib) and then named so."""
    if not value:
        raise typer.BadParameter("the profile file's path is empty")
    return Path(value)


FileArg = Annotated[
    Path,
    typer.Argument(help="The profile file (YAML).", show_default=False, parser=_profile_file),
]
NameArg = Annotated[
    str, typer.Argument(help="Profile name (or a revision id prof_…).", show_default=False)
]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _egress_summary(r: dict[str, Any]) -> str:
    text = _plural(r["egress"], "host allowed", "hosts allowed")
    if r["wildcards"]:
        # What a wildcard lets the agent write into DNS names is bounded by the budget.
        text += (
            f" ({_plural(r['wildcards'], 'wildcard', 'wildcards')}: at most "
            f"{r['wildcard_budget']} new names per 10 minutes)"
        )
    return text


@app.command("validate")
def validate_cmd(file: FileArg, json_mode: JsonOpt = False) -> None:
    """Check a profile file and summarize it; nothing is stored."""

    def run() -> dict[str, Any]:
        from linpodx.podman import flags, probe

        p = load_file(file)
        missing = flags.unenforced(p.to_dict()["resources"], probe.host_limits().cgroup_limits)
        for entry in p.network.egress_dns_allowlist:
            if entry.endswith("/tcp"):
                # Not an error: some protocols carry no name. But say what it means.
                sys.stderr.write(
                    f"note: {entry} is checked by address only (weaker than a TLS or /http "
                    "entry: any name served on that address is reachable on that port)\n"
                )
        return {
            "name": p.name,
            "status": "ok",
            "mounts": len(p.mounts),
            "egress": len(p.network.egress_dns_allowlist),
            "wildcards": sum(h.startswith("*.") for h in p.network.egress_dns_allowlist),
            "wildcard_budget": p.network.wildcard_budget,
            "mcp": len(p.mcp_policy),
            "mcp_on_arguments": sum(bool(r.arguments) for r in p.mcp_policy),
            "mcp_rated": [
                {"rule": i, "rate": r.rate.text} for i, r in enumerate(p.mcp_policy) if r.rate
            ],
            "limits": {"enforcement": p.resources.enforcement, "not_enforceable_here": missing},
        }

    def limits_line(lim: dict[str, Any]) -> str:
        """What this host does with the profile's cgroup limits it cannot enforce."""
        from linpodx.podman.flags import BEST_EFFORT

        missing = lim["not_enforceable_here"]
        names = ", ".join(missing)
        if lim["enforcement"] == BEST_EFFORT:
            return f"best effort: {names} cannot be enforced on this host and will not apply"
        return (
            f"required: {names} cannot be enforced on this host for this user, so runs here "
            "are refused (or set resources.enforcement: best_effort)"
        )

    def render(r: dict[str, Any]) -> None:
        sys.stdout.write(
            "".join(
                line + "\n"
                for line in (
                    kv_line("profile", r["name"]),
                    kv_line("status", r["status"]),
                    kv_line("mounts", r["mounts"]),
                    kv_line("egress", _egress_summary(r)),
                    kv_line("mcp", _mcp_summary(r)),
                    # Only when there is something to say: limits this host cannot enforce.
                    *([kv_line("limits", limits_line(r["limits"]))]
                      if r["limits"]["not_enforceable_here"] else []),
                )
            )
        )

    run_command("sandbox validate", json_mode, run, render)


def _mcp_summary(r: dict[str, Any]) -> str:
    """`3 rules (1 on arguments; rule 2 at most 30/min)`: what a reader must not miss."""
    text = _plural(r["mcp"], "rule", "rules")
    extra = []
    if r["mcp_on_arguments"]:
        extra.append(f"{r['mcp_on_arguments']} on arguments")
    if r["mcp_rated"]:
        extra.extend(f"rule {x['rule']} at most {x['rate']}" for x in r["mcp_rated"])
    return f"{text} ({'; '.join(extra)})" if extra else text


def _push_egress(result: dict[str, Any]) -> list[str]:
    """A changed allowlist takes effect in running containers of the profile at once.

    The new revision is already stored (and audited) when this runs; if a guard does not take
    it, say exactly that instead of pretending the apply failed. An unchanged file pushes only
    to containers not at the current revision yet: an apply cut short after storing its
    revision (Ctrl-C, kill, a guard that did not answer) is finished by applying it again.
    """
    from linpodx.egress import guard

    try:
        # Under the store's lock, with the revision current now: two applies close together
        # push one after the other, and the later push never carries the older revision (an
        # apply whose push waited for another's pushes whatever is current by then).
        with store.locked():
            return guard.update_profile(
                store.get(result["name"]), only_stale=not result["changed"]
            )
    except LinpodxError as exc:
        raise type(exc)(
            f"profile {result['name']} was applied as revision {result['revision']} "
            f"({result['profile_id']}), but running containers did not take it: {exc.message}",
            exc.hint,
        ) from exc


@app.command("apply")
def apply_cmd(
    profile: Annotated[
        Path,
        typer.Option(
            "--profile", "-p", help="The profile file (YAML).", show_default=False,
            parser=_profile_file,
        ),
    ],
    json_mode: JsonOpt = False,
) -> None:
    """Validate a profile and store it as a new revision (recorded in the audit chain first).

    An unchanged file changes nothing and prints the current revision.
    """

    def run() -> dict[str, Any]:
        result = store.apply(profile).to_dict()
        result["egress_updated"] = _push_egress(result)
        from linpodx import containers

        # The revision's podman flags on this host, so its first `run` can take the fast path.
        containers.save_plan(containers.profile_by_id(str(result["profile_id"])))
        return result

    def render(r: dict[str, Any]) -> None:
        lines = [
            kv_line("profile_id", r["profile_id"]),
            kv_line("audit_hash", r["audit_hash"]),
            kv_line("revision", r["revision"]),
            kv_line("changed", r["changed"]),
        ]
        if r["egress_updated"]:
            lines.append(kv_line("egress_updated", ", ".join(r["egress_updated"])))
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
        if not r["changed"]:
            note(f"profile {r['name']} unchanged (revision {r['revision']}): nothing stored")

    run_command("sandbox apply", json_mode, run, render)


@app.command("list")
def list_cmd(quiet: QuietOpt = False, json_mode: JsonOpt = False) -> None:
    """List applied profiles: name, revision, profile_id, applied_at, state.

    A profile whose `sandbox rm` was interrupted is listed with state `removing` (no run uses
    it until the next `rm` or `apply` settles it), and a hint saying so on stderr.
    """

    def run() -> dict[str, Any]:
        return {"profiles": [sp.summary() for sp in store.list_profiles()]}

    def render(r: dict[str, Any]) -> None:
        rows = r["profiles"]
        if quiet:
            print_lines(row["name"] for row in rows)
            return
        if not rows:
            note("no profiles applied yet (run `linpodx sandbox apply --profile FILE`)")
            return
        header = ("NAME", "REVISION", "PROFILE_ID", "APPLIED_AT", "STATE")
        table = [header] + [
            (row["name"], str(row["revision"]), row["profile_id"], row["applied_at"], row["state"])
            for row in rows
        ]
        widths = [max(len(t[i]) for t in table) for i in range(len(header))]
        for t in table:
            sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip())
            sys.stdout.write("\n")
        sys.stdout.flush()
        for row in rows:
            if row["hint"]:
                note(f"hint: profile {row['name']}: a `sandbox rm` of it was interrupted, so no "
                     f"run uses it; {row['hint']}")

    run_command("sandbox list", json_mode, run, render)


def _by_name(name: str, fn: Callable[[str], Any]) -> Any:
    """`fn(name)`; a profile it does not find gets a did-you-mean of the applied names (as
    `run --profile` does)."""
    try:
        return fn(name)
    except NotFound as err:
        with contextlib.suppress(LinpodxError, OSError):  # the store's own damage: no advice
            err.hint = add_to_hint(err.hint, name, (p.name for p in store.list_profiles()))
        raise


def _show_doc(name: str) -> dict[str, Any]:
    sp = store.get_by_id(name) if is_id(name, "prof") else _by_name(name, store.get)
    return {
        "name": sp.name,
        "profile_id": sp.profile_id,
        "revision": sp.revision,
        "audit_hash": sp.audit_hash,
        "applied_at": sp.applied_at,
        "current": sp.current,
        "profile": json.loads(json.dumps(sp.profile.to_dict())),
    }


@app.command("show")
def show_cmd(
    name: NameArg,
    fmt: Annotated[
        str, typer.Option("--format", help="yaml or json (the normalized profile only).")
    ] = "yaml",
    json_mode: JsonOpt = False,
) -> None:
    """Print an applied profile in its normalized form (what linpodx enforces)."""

    def run() -> dict[str, Any]:
        if fmt not in ("yaml", "json"):
            raise UsageError(f"unknown --format {safe_text(fmt, 40)}", "use yaml or json")
        return _show_doc(name)

    def render(r: dict[str, Any]) -> None:
        # A description or env value may hold bidirectional or zero-width characters (the
        # loader refuses only control characters): shown raw, they reorder or hide what the
        # person reads. Then every non-ASCII character is printed escaped (valid YAML/JSON).
        hidden = hides_text(r["profile"])
        if fmt == "json":
            sys.stdout.write(json.dumps(r["profile"], ensure_ascii=hidden, indent=2) + "\n")
            return
        head = (
            f"# profile_id: {r['profile_id']}\n# revision: {r['revision']}"
            f"{'' if r['current'] else ' (not current)'}\n"
            f"# audit_hash: {r['audit_hash']}\n# applied_at: {r['applied_at']}\n"
        )
        out = io.StringIO()
        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.allow_unicode = not hidden
        # Keep the model's field order (ruamel types this attribute as None).
        yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]
        yaml.dump(r["profile"], out)
        sys.stdout.write(head + out.getvalue())
        sys.stdout.flush()

    run_command("sandbox show", json_mode, run, render)


@app.command("rm")
def rm_cmd(name: NameArg, json_mode: JsonOpt = False) -> None:
    """Remove an applied profile (recorded in the audit chain). Its revisions stay readable by
    id, so containers started under them keep working."""

    def run() -> dict[str, Any]:
        r = _by_name(name, store.remove)
        return {
            "removed": r.name,
            "profile_id": r.profile_id,
            "revision": r.revision,
            "audit_hash": r.audit_hash,
        }

    run_command("sandbox rm", json_mode, run)
