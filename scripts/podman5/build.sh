#!/usr/bin/env bash
# Build (once) a Debian 13 "trixie" tree with podman 5 under $LPX_TRIXIE/root (default
# /var/tmp/lpx-trixie/root), configure it, load the two linpodx test images from the HOST's root
# podman store, copy a snapshot of the linpodx checkout's tracked files to /opt/lpx and make a
# venv /opt/lpx-venv (Debian's python packages + mcp from PyPI).
#   build.sh            build/refresh; unmounts everything on exit
#   build.sh cleanup    remove the tree's containers, stop its processes, unmount
#   build.sh rebuild    throw the tree away first
# Env: LPX_TRIXIE, LPX_REPO (default: this checkout), LINPODX_TEST_IMAGE, LINPODX_TEST_BUSYBOX,
#      LINPODX_TEST_ROOT (default /opt/linpodx-test, where scripts/test.sh keeps its venv),
#      LPX_MCP_SPEC (default: mcp==<version in that venv>, else mcp)
# Debian's package mirror and PyPI must be reachable; the host must have the two test images
# in its root podman store (scripts/test.sh --prepare-only builds them).
set -euo pipefail
umask 022
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
: "${LPX_REPO:=$(cd "$HERE/../.." && pwd -P)}"
: "${LINPODX_TEST_ROOT:=/opt/linpodx-test}"
[[ $(id -u) -eq 0 ]] || die "must run as root"
install -d -m 0755 "$LPX_TRIXIE"
exec 8>"$LOCK"
flock 8

if [[ ${1:-} == cleanup ]]; then cleanup_all; exit; fi
trap 'rc=$?; cleanup_all; exit $rc' EXIT
if [[ ${1:-} == rebuild ]]; then cleanup_all; rm -rf -- "$ROOT"; fi

T0=$(date +%s)
PKGS=(podman runc conmon netavark aardvark-dns nftables libnftables1 uidmap slirp4netns passt
      catatonit iproute2 procps util-linux ca-certificates python3 python3-venv python3-pip
      python3-typer python3-rich python3-ruamel.yaml python3-jsonschema python3-dnspython
      python3-pytest python3-pexpect python3-nftables)
RECIPE=$(printf '%s\n' "${PKGS[@]}" | sha256sum | cut -c1-16)
if [[ $(cat "$ROOT/.lpx-recipe" 2>/dev/null) != "$RECIPE" ]]; then
    cleanup_all
    rm -rf -- "$ROOT" "$ROOT.new"
    log "mmdebstrap trixie -> $ROOT ($(IFS=,; echo "${PKGS[*]}"))"
    mmdebstrap --quiet --variant=apt --include="$(IFS=,; echo "${PKGS[*]}")" \
        trixie "$ROOT.new" </dev/null
    printf '%s\n' "$RECIPE" >"$ROOT.new/.lpx-recipe"
    mv -- "$ROOT.new" "$ROOT"
    log "mmdebstrap done in $(($(date +%s) - T0)) s"
else
    log "tree $ROOT up to date (recipe $RECIPE)"
fi

# --- containers.conf: mirror /etc/containers/containers.conf of setup-host.sh -----------------
cat >"$ROOT/etc/containers/containers.conf" <<'CONF'
# Written by linpodx scripts/podman5/build.sh (mirrors scripts/setup-host.sh)
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
# The tree shares the host's network namespace: should anything use podman's default bridge,
# it must not be the host podman's podman0/10.88.0.0/16. An explicit default network file with
# its own bridge name and subnet, internal (no NAT rules), takes its place.
install -d -m 0755 "$ROOT/etc/containers/networks"
cat >"$ROOT/etc/containers/networks/podman.json" <<'NET'
{
  "name": "podman",
  "id": "2f259bab93aaaaa2542ba43ef33eb990d0999ee1b9924b557b7be53c0b7a1bb9",
  "driver": "bridge",
  "network_interface": "lpxp5br0",
  "created": "2026-01-01T00:00:00Z",
  "subnets": [{"subnet": "10.89.250.0/24", "gateway": "10.89.250.1"}],
  "ipv6_enabled": false,
  "internal": true,
  "dns_enabled": false,
  "ipam_options": {"driver": "host-local"}
}
NET

# --- venv: Debian's packages + mcp ---------------------------------------------------------
if [[ -z ${LPX_MCP_SPEC:-} ]]; then
    v=$("$LINPODX_TEST_ROOT/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))' 2>/dev/null || true)
    LPX_MCP_SPEC=mcp${v:+==$v}
fi
if ! in_tree /opt/lpx-venv/bin/python -c 'import mcp, typer, rich, ruamel.yaml, jsonschema, dns, pytest, pexpect' 2>/dev/null \
   || [[ $(cat "$ROOT/opt/lpx-venv/.spec" 2>/dev/null) != "$LPX_MCP_SPEC" ]]; then
    log "venv /opt/lpx-venv (--system-site-packages) + $LPX_MCP_SPEC"
    rm -rf -- "$ROOT/opt/lpx-venv"
    in_tree /usr/bin/python3 -m venv --system-site-packages /opt/lpx-venv
    # The host's CA bundle: a host that reaches PyPI through a TLS proxy trusts its CA there.
    cp -f /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/lpx-host-ca.crt"
    in_tree PIP_CERT=/etc/ssl/certs/lpx-host-ca.crt PIP_DEFAULT_TIMEOUT=180 \
        /opt/lpx-venv/bin/pip install --quiet --disable-pip-version-check "$LPX_MCP_SPEC" </dev/null
    printf '%s\n' "$LPX_MCP_SPEC" >"$ROOT/opt/lpx-venv/.spec"
fi

# --- images from the host's root store ------------------------------------------------------
install -d -m 0755 "$LPX_TRIXIE/images"
for img in "$DEBIAN_IMAGE" "$BUSYBOX_IMAGE"; do
    id=$(podman image inspect --format '{{.Id}}' "$img") || die "host has no image $img"
    have=$(in_tree podman image inspect --format '{{.Id}}' "$img" 2>/dev/null || true)
    if [[ $have != "$id" ]]; then
        tar=$LPX_TRIXIE/images/${id:0:16}.tar
        [[ -s $tar ]] || { log "podman save $img (host)"; podman save -q -o "$tar.tmp" "$img" && mv "$tar.tmp" "$tar"; }
        install -d "$ROOT/var/tmp/images"
        cp -f "$tar" "$ROOT/var/tmp/images/x.tar"
        log "podman load $img (tree)"
        in_tree podman load -q -i /var/tmp/images/x.tar
        rm -f "$ROOT/var/tmp/images/x.tar"
        in_tree podman tag "$id" "$img" 2>/dev/null || true
    fi
done

# --- snapshot of the checkout ------------------------------------------------------------------
# Default: the files of HEAD (`git archive`), a consistent tree even while someone is editing or
# committing in the checkout (a copy of the work tree taken mid-change once mixed a new
# attach.py with an old linpodx/mcp/ that lacked reap.py). LPX_SNAPSHOT=worktree copies the
# work tree's tracked files instead (`git ls-files | tar`), uncommitted edits included.
G=(git -c safe.directory="$LPX_REPO" -C "$LPX_REPO")
rm -rf -- "$ROOT/opt/lpx.new"
install -d -m 0755 "$ROOT/opt/lpx.new"
commit=$("${G[@]}" rev-parse HEAD)
if [[ ${LPX_SNAPSHOT:-head} == worktree ]]; then
    "${G[@]}" ls-files -z | tar -C "$LPX_REPO" --null -cf - -T - | tar -C "$ROOT/opt/lpx.new" -xf -
    printf '%s+worktree\n' "$commit" >"$ROOT/opt/lpx.new/.lpx-commit"
else
    "${G[@]}" archive --format=tar "$commit" | tar -C "$ROOT/opt/lpx.new" -xf -
    printf '%s\n' "$commit" >"$ROOT/opt/lpx.new/.lpx-commit"
fi
rm -rf -- "$ROOT/opt/lpx"
mv -- "$ROOT/opt/lpx.new" "$ROOT/opt/lpx"
log "copied $LPX_REPO ($(cat "$ROOT/opt/lpx/.lpx-commit")) to /opt/lpx"

in_tree podman version --format '{{.Client.Version}}' | sed 's/^/podman in tree: /' >&2
log "build.sh done in $(($(date +%s) - T0)) s"
