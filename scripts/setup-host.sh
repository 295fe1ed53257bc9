#!/usr/bin/env bash
# Prepare a Debian 12 host for linpodx's test suite, as root:
#   - install the missing Debian packages (podman with runc, nftables, slirp4netns, mmdebstrap, ...)
#   - /etc/containers/containers.conf: runc, cgroupfs, file events, default ulimits
#   - /dev/net/tun usable by rootless slirp4netns
#   - the rootless test user with subuid/subgid ranges, a runtime dir and its own storage.conf
#   - `podman info` checked as root and as that user
# Every step checks first and does nothing when the host is already set up, so a re-run is fast.
# Called by scripts/test.sh; it can also be run by itself.
set -euo pipefail
umask 022

: "${LINPODX_TEST_USER:=linpodx-test}"
export DEBIAN_FRONTEND=noninteractive

# Packages the suite needs. runc is asked for explicitly in the same apt-get call as podman so
# apt does not pick crun (crun fails on hybrid cgroup hosts); netavark is named so the rootful
# network stack is the one HOST.md describes even where apt skips Recommends. iptables: Debian
# 12's podman only suggests it, yet netavark runs it for every rootful container on the default
# network ("netavark: No such file or directory" without it, `podman build` RUN steps too).
PACKAGES=(
    podman runc conmon catatonit netavark aardvark-dns iptables nftables uidmap slirp4netns passt
    mmdebstrap busybox-static
    python3 python3-venv python3-pip
    iproute2 ca-certificates procps util-linux git tar
)
MARKER="# Managed by linpodx scripts/setup-host.sh; edits here are overwritten."

log() { printf 'setup-host: %s\n' "$*"; }
warn() { printf 'setup-host: WARNING: %s\n' "$*" >&2; }
die() {
    printf 'error: %s\n' "$1" >&2
    [[ $# -gt 1 ]] && printf 'hint: %s\n' "$2" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "scripts/setup-host.sh must run as root" "run it with sudo, or as root"

# --- distribution -------------------------------------------------------------------------
if [[ -r /etc/os-release ]]; then
    # shellcheck disable=SC1091
    . /etc/os-release
    # Debian 13 (trixie, podman 5) is what the test command's podman5 phase sets up with it.
    if [[ ${VERSION_CODENAME:-} != bookworm && ${VERSION_CODENAME:-} != trixie ]]; then
        warn "this script is written for Debian 12 (bookworm) and 13 (trixie); found" \
            "'${PRETTY_NAME:-unknown}'"
    fi
fi
command -v apt-get >/dev/null || die "apt-get not found" "run the test suite on Debian 12"

# --- packages -----------------------------------------------------------------------------
missing=()
for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ $status == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    apt-get update -qq </dev/null
    apt-get install -y -qq "${missing[@]}" </dev/null
else
    log "packages: all ${#PACKAGES[@]} present"
fi

# --- /etc/containers/containers.conf -----------------------------------------------------
# runc: crun fails on this kind of host ("cgroups in hybrid mode not supported").
# cgroupfs + file events: there is no systemd (and no user session) to talk to.
# default_ulimits: podman's default copies the host's nofile limit, which the process may not
# raise (no CAP_SYS_RESOURCE), so every container start would fail without explicit limits.
CONF=/etc/containers/containers.conf
conf_body='[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
conf_want="$MARKER
$conf_body"

# The settings of a TOML-ish file without comments, blank lines or spaces: enough to tell
# whether a file someone else wrote says the same as ours.
normalize() { sed -e 's/#.*$//' -e 's/[[:space:]]//g' -e '/^$/d' "$1"; }

write_conf() {
    install -d -m 0755 /etc/containers
    local tmp
    tmp=$(mktemp /etc/containers/.containers.conf.XXXXXX)
    printf '%s\n' "$conf_want" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$CONF"
}

if [[ ! -e $CONF ]]; then
    log "writing $CONF"
    write_conf
elif grep -qxF "$MARKER" "$CONF"; then
    if [[ $(cat "$CONF") != "$conf_want" ]]; then
        log "updating $CONF (ours)"
        write_conf
    fi
elif [[ $(normalize "$CONF") == "$(printf '%s\n' "$conf_body" | sed -e 's/[[:space:]]//g' -e '/^$/d')" ]]; then
    # Same settings, written by hand before this script existed: take it over.
    log "taking over $CONF (same settings, no marker)"
    write_conf
else
    warn "$CONF was not written by this script and differs from what the suite expects;"
    warn "leaving it alone. The suite needs, under [engine]: runtime=\"runc\","
    warn "cgroup_manager=\"cgroupfs\", events_logger=\"file\"; under [containers]:"
    warn "default_ulimits=[\"nofile=1024:1024\", \"nproc=4096:4096\"]."
fi

# --- /dev/net/tun: rootless slirp4netns opens it as the user ------------------------------
if [[ ! -c /dev/net/tun ]]; then
    log "creating /dev/net/tun"
    install -d -m 0755 /dev/net
    mknod -m 0666 /dev/net/tun c 10 200
fi
if [[ $(stat -c %a /dev/net/tun) != 666 ]]; then
    log "chmod 0666 /dev/net/tun"
    chmod 0666 /dev/net/tun
fi

# --- user namespaces ------------------------------------------------------------------------
if [[ -r /proc/sys/kernel/unprivileged_userns_clone ]] &&
    [[ $(cat /proc/sys/kernel/unprivileged_userns_clone) == 0 ]]; then
    log "enabling kernel.unprivileged_userns_clone"
    sysctl -q -w kernel.unprivileged_userns_clone=1
fi
if [[ $(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0) -lt 1000 ]]; then
    die "user.max_user_namespaces is below 1000; rootless podman cannot work" \
        "sysctl -w user.max_user_namespaces=28633"
fi

# --- the rootless test user -----------------------------------------------------------------
user_created=0
if ! id -u "$LINPODX_TEST_USER" >/dev/null 2>&1; then
    log "creating user $LINPODX_TEST_USER"
    useradd -m -s /bin/bash -c "linpodx rootless tests" "$LINPODX_TEST_USER"
    user_created=1
fi
uid=$(id -u "$LINPODX_TEST_USER")
gid=$(id -g "$LINPODX_TEST_USER")
home=$(getent passwd "$LINPODX_TEST_USER" | cut -d: -f6)
[[ -d $home ]] || install -d -m 0755 -o "$uid" -g "$gid" "$home"

# First id after every range already given out in FILE (at least 100000), so a new range never
# overlaps another user's.
next_free_start() {
    awk -F: 'BEGIN { n = 100000 } NF >= 3 && $2 + $3 > n { n = $2 + $3 } END { print n }' "$1"
}
ids_changed=0
for kind in uid gid; do
    file=/etc/sub$kind
    touch "$file"
    if ! grep -q "^${LINPODX_TEST_USER}:" "$file" && ! grep -q "^${uid}:" "$file"; then
        start=$(next_free_start "$file")
        log "adding sub${kind} range $start-$((start + 65535)) for $LINPODX_TEST_USER"
        usermod "--add-sub${kind}s" "$start-$((start + 65535))" "$LINPODX_TEST_USER"
        ids_changed=1
    fi
done

# No systemd-logind here, so nothing creates the user's runtime dir: podman keeps its rootless
# state (pause process pid, locks, events) there.
run_dir=/run/user/$uid
if ((user_created)) && [[ -e $run_dir ]]; then
    # Left by an earlier user with the same uid (userdel does not clean /run/user): its podman
    # state points at a store that no longer exists.
    log "removing stale $run_dir"
    rm -rf -- "$run_dir"
fi
if [[ ! -d $run_dir ]]; then
    install -d -m 0755 /run/user
    install -d -m 0700 -o "$uid" -g "$gid" "$run_dir"
fi
if [[ $(stat -c '%u %a' "$run_dir") != "$uid 700" ]]; then
    chown "$uid:$gid" "$run_dir"
    chmod 0700 "$run_dir"
fi

# The tests point HOME and XDG_CONFIG_HOME at a temp dir; rootless podman would then look for
# its store under that temp dir and find no images. scripts/test.sh passes this file through
# CONTAINERS_STORAGE_CONF, so the store stays the user's own whatever HOME says.
storage_conf=$home/.config/containers/storage.conf
# rootless_storage_path is what `podman run` honours for a rootless store in this file;
# `podman commit` (buildah's code path) also needs runroot and graphroot here, or it fails with
# "runroot must be set". All three name the defaults, so nothing moves.
storage_want="$MARKER
[storage]
driver = \"overlay\"
runroot = \"$run_dir/containers\"
graphroot = \"$home/.local/share/containers/storage\"
rootless_storage_path = \"$home/.local/share/containers/storage\""
if [[ ! -e $storage_conf ]] || [[ $(cat "$storage_conf") != "$storage_want" ]]; then
    if [[ -e $storage_conf ]] && ! grep -qxF "$MARKER" "$storage_conf"; then
        warn "$storage_conf was not written by this script; leaving it alone"
    else
        log "writing $storage_conf"
        runuser -u "$LINPODX_TEST_USER" -- install -d -m 0700 "$home/.config" \
            "$home/.config/containers"
        printf '%s\n' "$storage_want" >"$storage_conf.tmp"
        chown "$uid:$gid" "$storage_conf.tmp"
        chmod 0644 "$storage_conf.tmp"
        mv -f "$storage_conf.tmp" "$storage_conf"
    fi
fi

# --- podman works, as root and as the user ------------------------------------------------
podman info --format '{{.Host.OCIRuntime.Name}}' >/dev/null </dev/null ||
    die "podman info failed as root" "see podman's message above"

as_user() {
    runuser -u "$LINPODX_TEST_USER" -- env -i --chdir="$home" \
        HOME="$home" USER="$LINPODX_TEST_USER" LOGNAME="$LINPODX_TEST_USER" \
        PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
        XDG_RUNTIME_DIR="$run_dir" CONTAINERS_STORAGE_CONF="$storage_conf" \
        "$@" </dev/null
}

if ((ids_changed && !user_created)); then
    # New subordinate ids only take effect once podman's pause process is restarted.
    log "podman system migrate (subordinate ids changed)"
    as_user podman system migrate || true
fi
if ! info=$(as_user podman info --format '{{.Host.Security.Rootless}} {{.Host.OCIRuntime.Name}}' 2>&1); then
    log "rootless podman info failed; trying podman system migrate"
    as_user podman system migrate || true
    info=$(as_user podman info --format '{{.Host.Security.Rootless}} {{.Host.OCIRuntime.Name}}' 2>&1) ||
        die "podman info failed as $LINPODX_TEST_USER: $info" \
            "check /etc/subuid, /etc/subgid and $run_dir"
fi
info=$(tail -n1 <<<"$info")
[[ $info == "true runc" ]] ||
    die "rootless podman reports '$info', expected 'true runc'" "check $CONF"
log "ready: root and $LINPODX_TEST_USER (uid $uid) run podman with runc"
