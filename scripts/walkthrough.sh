#!/usr/bin/env bash
# The README's first command: the whole walk-through, for real, as root on a Debian 12 machine.
#
#     bash scripts/walkthrough.sh [--name NAME]
#
# 1. Prepares the machine with `scripts/test.sh --prepare-only` (host packages, containers.conf,
#    the venv with linpodx and the official `mcp` SDK, the local Debian test image; each step
#    skips what is already in place).
# 2. Builds the demo agent image localhost/linpodx-demo/agent:latest (examples/Containerfile.demo:
#    the Debian test image + the demo MCP server; skipped when its recipe hash matches).
# 3. Runs examples/walkthrough.py with the venv's python: profile validate/apply, run, the
#    sandbox's rootfs/$HOME/read-only checks, egress (a local DNS upstream stands in for the
#    internet: this machine has none), MCP calls through the gate with approvals answered from a
#    second terminal, audit verify, snapshot, a destructive change and rollback.
# It uses its own HOME and linpodx state dir under a new temp dir (never your own state), removes
# its container and snapshot image at the end, keeps the state dir (printed) so you can run
# `linpodx audit verify` yourself, and exits non-zero if any claim of the walk-through failed.
#
# Environment: LINPODX_TEST_ROOT (default /opt/linpodx-test, where the venv lives).
set -uo pipefail
umask 022

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
: "${LINPODX_TEST_ROOT:=/opt/linpodx-test}"
VENV=$LINPODX_TEST_ROOT/venv

die() {
    printf 'error: %s\n' "$1" >&2
    [[ $# -gt 1 ]] && printf 'hint: %s\n' "$2" >&2
    exit 1
}

# Everything below is one function, read whole before it runs: editing this file while it runs
# cannot change what a running walk-through does.
main() {
    [[ $(id -u) -eq 0 ]] ||
        die "scripts/walkthrough.sh must run as root (it installs podman and sets the machine up)" \
            "run it as root: sudo bash scripts/walkthrough.sh"

    grep -q -e '--prepare-only' "$REPO/scripts/test.sh" ||
        die "scripts/test.sh does not know --prepare-only" "update this checkout (git pull)"
    echo "walkthrough: preparing this machine (scripts/test.sh --prepare-only)"
    bash "$REPO/scripts/test.sh" --prepare-only ||
        die "preparing the machine failed" "see the messages above (scripts/test.sh --prepare-only)"
    [[ -x $VENV/bin/python ]] || die "no venv at $VENV after preparing" \
        "run scripts/test.sh --prepare-only and look at its python phase"

    echo "walkthrough: building the demo agent image"
    bash "$REPO/examples/build-demo-image.sh" ||
        die "the demo image could not be built" "see podman's messages above"

    demo_dir=$(mktemp -d /tmp/linpodx-walkthrough.XXXXXX)
    chmod 0700 "$demo_dir"
    echo "walkthrough: demo HOME and linpodx state under $demo_dir"
    # env -i: nothing of the caller's environment (XDG dirs, LINPODX_* settings) leaks into the
    # demo. PYTHONPATH: linpodx runs from this checkout (the venv supplies its dependencies), not
    # from test.sh's source copy, which a later test.sh run may replace while the demo runs.
    env -i PATH="$VENV/bin:/usr/sbin:/usr/bin:/sbin:/bin" LANG=C.UTF-8 TERM="${TERM:-xterm}" \
        PYTHONPATH="$REPO" \
        "$VENV/bin/python" "$REPO/examples/walkthrough.py" --dir "$demo_dir" "$@"
    rc=$?
    echo "walkthrough: demo files and linpodx state kept in $demo_dir (remove it when done)"
    exit "$rc"
}

main "$@"
exit $?
