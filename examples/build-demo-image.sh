#!/usr/bin/env bash
# Build the walk-through's demo image for the user running this script (root and rootless users
# each have their own image store):
#
#     bash examples/build-demo-image.sh [IMAGE]      (default localhost/linpodx-demo/agent:latest)
#
# FROM the local Debian test image (scripts/build-images.sh makes it), with the demo MCP server
# at /opt/demo/server.py. The image carries the label io.linpodx.demo.recipe=HASH, a hash of the
# Containerfile, the server and the base image's id: when an image with that label exists the
# build is skipped. Prints `image: NAME` and `recipe: HASH` on the last two lines.
#
# Environment: LINPODX_DEMO_BASE (default localhost/linpodx-test/debian:12).
set -euo pipefail
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
IMAGE=${1:-localhost/linpodx-demo/agent:latest}
BASE=${LINPODX_DEMO_BASE:-localhost/linpodx-test/debian:12}
LABEL=io.linpodx.demo.recipe
# Bump when the build steps below change in a way the inputs do not show.
RECIPE_VERSION=1

die() {
    printf 'error: %s\n' "$1" >&2
    [[ $# -gt 1 ]] && printf 'hint: %s\n' "$2" >&2
    exit 1
}

command -v podman >/dev/null || die "podman is not installed" "run scripts/setup-host.sh as root"
base_id=$(podman image inspect --format '{{.Id}}' "$BASE" 2>/dev/null) ||
    die "base image $BASE is not in this user's image store" \
        "run scripts/build-images.sh as root (it imports it for root and the rootless test user)"

recipe=$( {
    printf 'v%s base=%s id=%s\n' "$RECIPE_VERSION" "$BASE" "$base_id"
    sha256sum <"$HERE/Containerfile.demo"
    sha256sum <"$HERE/demo-mcp-server/server.py"
} | sha256sum | cut -c1-16)

have=$(podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$IMAGE" 2>/dev/null || true)
if [[ $have == "$recipe" ]]; then
    echo "build-demo-image: $IMAGE up to date"
else
    old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    echo "build-demo-image: building $IMAGE from $BASE (no registry: --pull=never)"
    # A private context holding only what the Containerfile copies.
    ctx=$(mktemp -d)
    trap 'rm -rf -- "$ctx"' EXIT
    install -d -m 0755 "$ctx/demo-mcp-server"
    install -m 0644 "$HERE/demo-mcp-server/server.py" "$ctx/demo-mcp-server/server.py"
    # --network none: the build needs no network, and rootful podman's default network needs
    # netavark's firewall tools (iptables) that a fresh machine may lack.
    podman build --quiet --pull=never --network none --build-arg "BASE=$BASE" --label "$LABEL=$recipe" \
        -f "$HERE/Containerfile.demo" -t "$IMAGE" "$ctx" </dev/null >/dev/null ||
        die "podman build of $IMAGE failed" "see podman's messages above"
    have=$(podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$IMAGE")
    [[ $have == "$recipe" ]] || die "$IMAGE lacks its recipe label after the build"
    if [[ -n $old_id && $old_id != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]]; then
        # The replaced image is untagged now; remove it unless a container still uses it.
        podman rmi "$old_id" >/dev/null 2>&1 || true
    fi
fi
echo "image: $IMAGE"
echo "recipe: $recipe"
