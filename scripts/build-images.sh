#!/usr/bin/env bash
# Build linpodx's two test images from Debian packages (no container registry is reachable) and
# import them for root and for the rootless test user (each has its own image store):
#   localhost/linpodx-test/debian:12       bookworm (apt variant) + python3, curl, iproute2, dnsutils,
#                                          procps, netcat-openbsd and the `mcp` SDK
#   localhost/linpodx-test/busybox:latest  /bin/busybox from busybox-static and its applet links
# Each image has a recipe hash: the tarball is cached as /var/cache/linpodx-test/NAME-HASH.tar
# and the imported image carries the label io.linpodx.test.recipe=HASH, so a re-run with the same
# recipe builds and imports nothing.
#
# Needs: root, scripts/setup-host.sh done, and a venv whose pip can install `mcp` (argument 1 or
# LINPODX_TEST_VENV); the image's mcp is pinned to the venv's version so both sides of the MCP
# tests speak the same SDK.
set -euo pipefail
umask 022

: "${LINPODX_TEST_USER:=linpodx-test}"
: "${LINPODX_TEST_VENV:=${1:-/opt/linpodx-test/venv}}"
: "${LINPODX_TEST_CACHE:=/var/cache/linpodx-test}"
DEBIAN_IMAGE=localhost/linpodx-test/debian:12
BUSYBOX_IMAGE=localhost/linpodx-test/busybox:latest
LABEL=io.linpodx.test.recipe
# Bump when the build steps below change in a way the recipe strings do not show.
RECIPE_VERSION=1
DEBIAN_INCLUDE=python3,ca-certificates,curl,iproute2,dnsutils,procps,netcat-openbsd

log() { printf 'build-images: %s\n' "$*"; }
die() {
    printf 'error: %s\n' "$1" >&2
    [[ $# -gt 1 ]] && printf 'hint: %s\n' "$2" >&2
    exit 1
}

[[ $(id -u) -eq 0 ]] || die "scripts/build-images.sh must run as root" "run scripts/test.sh as root"
[[ -x $LINPODX_TEST_VENV/bin/pip ]] ||
    die "no venv at $LINPODX_TEST_VENV" "run scripts/test.sh, which creates it first"
id -u "$LINPODX_TEST_USER" >/dev/null 2>&1 ||
    die "user $LINPODX_TEST_USER does not exist" "run scripts/setup-host.sh first"

uid=$(id -u "$LINPODX_TEST_USER")
home=$(getent passwd "$LINPODX_TEST_USER" | cut -d: -f6)
as_user() {
    runuser -u "$LINPODX_TEST_USER" -- env -i --chdir="$home" \
        HOME="$home" USER="$LINPODX_TEST_USER" LOGNAME="$LINPODX_TEST_USER" \
        PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
        XDG_RUNTIME_DIR="/run/user/$uid" \
        CONTAINERS_STORAGE_CONF="$home/.config/containers/storage.conf" \
        "$@" </dev/null
}
as_root() { "$@" </dev/null; }

install -d -m 0755 "$LINPODX_TEST_CACHE"

hash_of() { printf '%s' "$1" | sha256sum | cut -c1-16; }

mcp_version=$("$LINPODX_TEST_VENV/bin/python" -c \
    'import importlib.metadata as m; print(m.version("mcp"))') ||
    die "the venv has no mcp package" "scripts/test.sh installs the test extras first"

# --- recipes ------------------------------------------------------------------------------
busybox_recipe="v$RECIPE_VERSION busybox-static=$(dpkg-query -W -f='${Version}' busybox-static)"
busybox_recipe+=" layout=bin-applets+passwd cmd=/bin/sh"
debian_recipe="v$RECIPE_VERSION mmdebstrap variant=apt suite=bookworm include=$DEBIAN_INCLUDE"
debian_recipe+=" mcp==$mcp_version target=/usr/local/lib/python3.11/dist-packages compileall"
debian_recipe+=" cmd=/bin/sh"
busybox_hash=$(hash_of "$busybox_recipe")
debian_hash=$(hash_of "$debian_recipe")
busybox_tar=$LINPODX_TEST_CACHE/busybox-$busybox_hash.tar
debian_tar=$LINPODX_TEST_CACHE/debian-$debian_hash.tar

# Drop tarballs of older recipes so the cache does not grow without bound.
prune() {
    local prefix=$1 keep=$2 f
    for f in "$LINPODX_TEST_CACHE/$prefix"-*.tar; do
        [[ -e $f && $f != "$keep" ]] && rm -f -- "$f"
    done
    return 0
}

# --- busybox ------------------------------------------------------------------------------
build_busybox() {
    local tree
    tree=$(mktemp -d "$LINPODX_TEST_CACHE/.busybox.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this very dir
    trap "rm -rf -- '$tree'" RETURN
    install -d -m 0755 "$tree/root/bin" "$tree/root/etc" "$tree/root/root" "$tree/root/proc" \
        "$tree/root/sys" "$tree/root/dev" "$tree/root/run"
    install -d -m 1777 "$tree/root/tmp"
    install -m 0755 /bin/busybox "$tree/root/bin/busybox"
    local applet n=0
    while IFS= read -r applet; do
        [[ -n $applet && $applet != busybox && $applet != */* ]] || continue
        ln -s busybox "$tree/root/bin/$applet"
        n=$((n + 1))
    done < <(/bin/busybox --list)
    ((n > 100)) || die "busybox --list gave only $n applets" "is busybox-static installed?"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' \
        >"$tree/root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$tree/root/etc/group"
    tar -C "$tree/root" --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 \
        -cf "$tree/out.tar" .
    mv -f "$tree/out.tar" "$busybox_tar"
    log "built $busybox_tar ($n applets)"
}

# --- debian -------------------------------------------------------------------------------
build_debian() {
    local tmp
    tmp=$(mktemp --suffix=.tar "$LINPODX_TEST_CACHE/.debian.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this very file
    trap "rm -f -- '$tmp'" RETURN
    log "building $debian_tar with mmdebstrap (about a minute)"
    # The hook runs on the host with the chroot at $1: the venv's pip (which reaches PyPI through
    # this machine's own pip configuration) installs mcp into the image's dist-packages, then the
    # image's own python compiles it and proves it imports. pip's output is shown only when it
    # fails (the machine's pip config can make it warn once per package about missing dirs).
    LPX_PIP="$LINPODX_TEST_VENV/bin/pip" LPX_MCP="mcp==$mcp_version" \
        mmdebstrap --quiet --variant=apt --include="$DEBIAN_INCLUDE" \
        --customize-hook='out=$("$LPX_PIP" install --quiet --no-compile --disable-pip-version-check --target "$1/usr/local/lib/python3.11/dist-packages" "$LPX_MCP" 2>&1) || { printf "%s\n" "$out" >&2; exit 1; }' \
        --customize-hook='chroot "$1" python3 -m compileall -q /usr/local/lib/python3.11/dist-packages >/dev/null' \
        --customize-hook='chroot "$1" python3 -c "import mcp, mcp.server"' \
        --customize-hook='rm -rf "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*' \
        bookworm "$tmp" </dev/null ||
        die "mmdebstrap failed" "see its messages above; Debian's package mirror must be reachable"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$debian_tar"
    log "built $debian_tar ($(du -m "$debian_tar" | cut -f1) MB)"
}

[[ -s $busybox_tar ]] || build_busybox
[[ -s $debian_tar ]] || build_debian
prune busybox "$busybox_tar"
prune debian "$debian_tar"

# --- import -------------------------------------------------------------------------------
# ensure_image RUNNER WHO IMAGE TAR HASH: import TAR as IMAGE unless it is there with HASH.
ensure_image() {
    local runner=$1 who=$2 image=$3 tar=$4 hash=$5 have old_id
    have=$($runner podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$image" \
        2>/dev/null || true)
    if [[ $have == "$hash" ]]; then
        log "$who: $image up to date ($hash)"
        return 0
    fi
    old_id=$($runner podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    log "$who: importing $image ($hash)"
    $runner podman import --quiet --change "LABEL $LABEL=$hash" --change 'CMD ["/bin/sh"]' \
        "$tar" "$image" >/dev/null || die "podman import of $image failed for $who"
    have=$($runner podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$image")
    [[ $have == "$hash" ]] || die "$image for $who lacks its recipe label after import"
    if [[ -n $old_id ]]; then
        # The replaced image is now untagged; remove it unless a container still uses it.
        $runner podman rmi "$old_id" >/dev/null 2>&1 || true
    fi
}

ensure_image as_root root "$BUSYBOX_IMAGE" "$busybox_tar" "$busybox_hash"
ensure_image as_root root "$DEBIAN_IMAGE" "$debian_tar" "$debian_hash"
ensure_image as_user "$LINPODX_TEST_USER" "$BUSYBOX_IMAGE" "$busybox_tar" "$busybox_hash"
ensure_image as_user "$LINPODX_TEST_USER" "$DEBIAN_IMAGE" "$debian_tar" "$debian_hash"
