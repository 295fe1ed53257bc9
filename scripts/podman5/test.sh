#!/usr/bin/env bash
# linpodx's podman tests against podman 5 (Debian 13's 5.4.x), as root, inside a Debian 13 tree
# (build.sh) entered in a private mount namespace (lib.sh), with the egress helper slirp4netns
# and then pasta. Not part of scripts/test.sh (it downloads a ~750 MB tree and adds ~25 min):
# run it by hand, as root, after `bash scripts/test.sh --prepare-only` has built the images:
#
#     bash scripts/podman5/test.sh              # build or refresh the tree, run, summarize
#     bash scripts/podman5/test.sh cleanup      # stop what the tree left, unmount leftovers
#
# Rootless is not covered: podman cannot run rootless from inside such a tree (no user
# namespaces there). One test is deselected, with the reason below; every other test of the
# files listed runs. Exit status: 0 only if every run passed.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
[[ $(id -u) -eq 0 ]] || { echo "error: run as root" >&2; exit 1; }
if [[ ${1:-} == cleanup ]]; then exec bash "$HERE/run.sh" cleanup; fi

bash "$HERE/build.sh" || { echo "error: building the podman 5 tree failed" >&2; exit 1; }

# It bind-mounts the HOST's nft and its libraries into the Debian 12 test image to show that
# nft fails inside the container; inside the Debian 13 tree that nft needs glibc 2.38, which
# the image lacks, so it cannot get as far as the point it tests (an environment mismatch of
# the test, not a podman 5 behaviour). It runs in scripts/test.sh on Debian 12, root and
# rootless.
DESELECT=tests/integration/test_egress_live.py::test_container_cannot_change_rules_or_routes

RUNS=(
    "slirp4netns tests/integration/test_egress_live.py"
    "pasta tests/integration/test_egress_live.py"
    "slirp4netns tests/integration/test_lifecycle.py tests/integration/test_run_profile.py tests/integration/test_run_hardening.py tests/integration/test_mount_pinning.py"
    "pasta tests/integration/test_run_hardening.py"
    "slirp4netns tests/integration/test_mcp_e2e.py tests/integration/test_mcp_lifecycle.py tests/integration/test_snapshot.py"
)
failed=0
summary=()
for run in "${RUNS[@]}"; do
    read -r helper files <<<"$run"
    echo "======== podman 5, $helper: $files ========"
    # shellcheck disable=SC2086 # $files is a list of paths without spaces
    LINPODX_EGRESS_HELPER=$helper bash "$HERE/run.sh" python -m pytest -p no:cacheprovider -q \
        -m podman --deselect "$DESELECT" $files 2>&1 | tee /tmp/linpodx-podman5.log
    rc=${PIPESTATUS[0]}
    # pytest -q ends with a bare `N passed, … in Ts` line (no `===` around it).
    last=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error).* in [0-9.]+s' /tmp/linpodx-podman5.log |
        tail -n1)
    summary+=("$helper rc=$rc ${last:-no summary}: $files")
    ((rc == 0)) || failed=1
done
echo "======== summary ========"
printf '  %s\n' "${summary[@]}"
((failed == 0)) && echo "podman5/test.sh: all runs passed" || echo "podman5/test.sh: FAILED"
exit "$failed"
