#!/usr/bin/env bash
# Run a command inside the trixie tree (built by build.sh) as root, from /opt/lpx, in a private
# mount namespace (see lib.sh), e.g.
#   run.sh python -m pytest -p no:cacheprovider -q -m podman tests/integration/test_lifecycle.py
#   run.sh cleanup      stop leftover processes of the tree, unmount leftovers (normally none)
# Env inside: PATH (venv first), HOME=/root, LANG, TERM, PYTHONPATH=/opt/lpx, VIRTUAL_ENV,
# LINPODX_TEST_IMAGE/LINPODX_TEST_BUSYBOX, PODMAN_IGNORE_CGROUPSV1_WARNING=1 (this host is
# cgroup v1; PODMAN_IGNORE_CGROUPSV1_WARNING= (empty) shows podman's warning), plus LINPODX_* and PYTEST_ADDOPTS from here.
# On exit the tree's containers are removed and no process of it is left running.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
[[ $(id -u) -eq 0 ]] || die "must run as root"
(($#)) || die "usage: run.sh CMD [ARGS...] | run.sh cleanup"
install -d -m 0755 "$LPX_TRIXIE"
exec 8>"$LOCK"
flock 8
if [[ $1 == cleanup ]]; then cleanup_all; exit; fi
trap 'rc=$?; cleanup_all; exit $rc' EXIT
envs=(LINPODX_TEST_IMAGE="$DEBIAN_IMAGE" LINPODX_TEST_BUSYBOX="$BUSYBOX_IMAGE"
      PYTHONPATH=/opt/lpx VIRTUAL_ENV=/opt/lpx-venv)
while IFS='=' read -r k v; do
    case $k in
    LINPODX_TEST_IMAGE | LINPODX_TEST_BUSYBOX) ;;
    LINPODX_* | PYTEST_ADDOPTS) envs+=("$k=$v") ;;
    esac
done < <(env)
in_tree "${envs[@]}" "$@"
