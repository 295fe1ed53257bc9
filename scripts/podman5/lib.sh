# Shared by build.sh and run.sh: paths, entering the tree, cleanup. Sourced, not run.
# shellcheck shell=bash
#
# The tree is entered in a private mount namespace with pivot_root, not with chroot: under a
# plain chroot the mount namespace's root stays the host's "/", and `runc exec` (podman exec)
# then lands on the HOST's root filesystem instead of the container's (seen: `podman exec C ls /`
# listed the host's /). All mounts (proc, sys, dev, a fresh /run) live in that namespace only and
# go away with it: nothing is mounted on the host.
: "${LPX_TRIXIE:=/var/tmp/lpx-trixie}"
ROOT=$LPX_TRIXIE/root
LOCK=$LPX_TRIXIE/lock
NSFILE=$LPX_TRIXIE/mntns
DEBIAN_IMAGE=${LINPODX_TEST_IMAGE:-localhost/linpodx-test/debian:12}
BUSYBOX_IMAGE=${LINPODX_TEST_BUSYBOX:-localhost/linpodx-test/busybox:latest}
TREE_PATH=/opt/lpx-venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '[%s %s] %s\n' "${0##*/}" "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# What runs inside the new mount namespace (as bash -c): $1 root, $2 nsfile, rest: env -i args.
# shellcheck disable=SC2016
INNER='
set -eu
ROOT=$1 NSFILE=$2; shift 2
readlink /proc/self/ns/mnt >"$NSFILE"
mount --bind "$ROOT" "$ROOT"
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys"
mount --rbind /dev "$ROOT/dev"
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$ROOT/run"
UMOUNT=$(command -v umount)
cd "$ROOT"
pivot_root . .oldroot
cd /
# The tree may have no umount (mount is not essential in trixie): use the host'"'"'s, once more.
"/.oldroot$UMOUNT" -l /.oldroot
set +e
/usr/bin/env -i "$@"
rc=$?
# Containers of this store must not outlive the namespace their storage is mounted in.
if [ -n "$(/usr/bin/podman ps -aq 2>/dev/null)" ]; then
    PODMAN_IGNORE_CGROUPSV1_WARNING=1 timeout 120 /usr/bin/podman rm -af -t 0 >/dev/null 2>&1
fi
exit $rc
'

# in_tree [VAR=VALUE...] CMD [ARGS...]: run CMD as root inside the tree from /opt/lpx (or /)
# with a clean environment (PATH, HOME=/root, LANG, TERM) plus the VAR=VALUEs given; then
# remove the store's containers and kill whatever is left in the namespace.
in_tree() {
    [[ -x $ROOT/usr/bin/podman ]] || die "no tree at $ROOT (run build.sh)"
    cp -f /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
    install -d -m 1777 "$ROOT/tmp"
    install -d -m 0755 "$ROOT/.oldroot"
    local cwd=/ rc=0 quiet=()
    [[ -d $ROOT/opt/lpx ]] && cwd=/opt/lpx
    # This host is cgroup v1 and podman 5 warns about it on every call. Any non-empty value
    # hides the warning; PODMAN_IGNORE_CGROUPSV1_WARNING= (empty) shows it.
    [[ -n ${PODMAN_IGNORE_CGROUPSV1_WARNING-1} ]] &&
        quiet=(PODMAN_IGNORE_CGROUPSV1_WARNING="${PODMAN_IGNORE_CGROUPSV1_WARNING:-1}")
    unshare --mount --propagation private -- /bin/bash -c "$INNER" inner "$ROOT" "$NSFILE" \
        --chdir="$cwd" PATH="$TREE_PATH" HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
        "${quiet[@]}" "$@" 8>&- || rc=$?
    kill_leftovers
    return "$rc"
}

# Processes still in the tree's last mount namespace (conmon, guards, helpers...).
ns_pids() {
    local ns p
    ns=$(cat "$NSFILE" 2>/dev/null) || return 0
    [[ -n $ns ]] || return 0
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/ns/mnt" 2>/dev/null) == "$ns" ]] && printf '%s\n' "${p#/proc/}"
    done
    return 0
}

kill_leftovers() {
    local pids i calm=0
    for i in 1 2 3 4 5 6 7 8; do
        mapfile -t pids < <(ns_pids)
        if ((${#pids[@]} == 0)); then
            # conmon may start a late `podman container cleanup`: look twice, a second apart.
            ((calm++)) && return 0
            sleep 1
            continue
        fi
        log "stopping ${#pids[@]} process(es) left in the tree's namespace: ${pids[*]}"
        if ((i <= 3)); then kill -TERM "${pids[@]}" 2>/dev/null || true
        else kill -KILL "${pids[@]}" 2>/dev/null || true; fi
        sleep 1
    done
    mapfile -t pids < <(ns_pids)
    ((${#pids[@]} == 0)) || { log "WARNING: still running: ${pids[*]}"; return 1; }
}

# `cleanup`: leftover processes, and any host mount below the tree (none are made any more).
cleanup_all() {
    kill_leftovers || true
    if findmnt -rn -o TARGET | grep -q "^$ROOT\(/\|$\)"; then
        log "unmounting leftovers below $ROOT"
        umount -R "$ROOT" 2>/dev/null || umount -R -l "$ROOT" 2>/dev/null || true
    fi
    ! findmnt -rn -o TARGET | grep "^$ROOT\(/\|$\)" >&2
}
