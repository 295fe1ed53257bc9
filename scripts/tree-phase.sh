#!/usr/bin/env bash
# The test command's two phases that run inside privileged containers made from fresh Debian
# trees, so that nothing of this machine can make them pass (see docs/infra.md):
#
#     pristine   Debian 12 tree (ca-certificates, git, python3 and nothing else): the README's
#                set-up and walk-through (`bash scripts/walkthrough.sh`), then the host smoke tests
#                (tests/integration/test_host_ready.py) as root and as the rootless test user;
#                then, in a second fresh container, the README's Install commands as written.
#     podman5    Debian 13 tree (podman 5.4): a chosen set of podman-marked integration and e2e
#                tests as root, then rootless with slirp4netns and with pasta.
#
# Called by scripts/test.sh (`bash scripts/test.sh --phase pristine` runs that phase alone, after
# the set-up phases), as root on the host:
#
#     bash scripts/tree-phase.sh NAME SRC
#
# SRC is test.sh's copy of the checkout (the file list sync_src makes); it is copied into the
# container. The container gets only that copy, the machine's CA bundle and /etc/pip.conf (if
# any), so it reaches the package registries a fresh machine reaches, and the host's test image
# tarballs (so the images are not built twice). The mmdebstrap output of each tree is cached as
# $LINPODX_TEST_CACHE/tree-NAME-RECIPEHASH.tar; for the pristine tree it is the bare tree, so its
# packages are installed inside the fresh container on every run. Lines starting with
# `tree-phase: result:` say what ran (test.sh puts them in its summary).
#
# Inside the container the same file runs as `tree-phase.sh --inside NAME`.
set -uo pipefail
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
: "${LINPODX_TEST_CACHE:=/var/cache/linpodx-test}"
: "${LINPODX_TEST_USER:=linpodx-test}"
LABEL=io.linpodx.test.recipe
# Bump when the container set-up below changes in a way the recipe strings do not show.
RECIPE_VERSION=1
# The tests the podman5 phase runs, root and rootless (each helper). Chosen to fit the CI budget
# (docs/infra.md, "Phases in fresh trees"): the host smoke tests and the whole egress guard (the
# part that depends most on podman's and the helpers' versions) everywhere; lifecycle (apply,
# run, ps, stop, start, signals, across podman 5's inspect output) and hardening as root.
PODMAN5_ROOT_TESTS="tests/integration/test_host_ready.py tests/integration/test_egress_live.py
tests/integration/test_lifecycle.py tests/integration/test_run_hardening.py"
PODMAN5_ROOTLESS_TESTS="tests/integration/test_host_ready.py tests/integration/test_egress_live.py"
# Hard bound on one phase's container, so a hang cannot eat the CI's whole time.
: "${LINPODX_TREE_TIMEOUT:=2400}"

log() { printf 'tree-phase: %s\n' "$*"; }
die() {
    printf 'error: %s\n' "$1" >&2
    [[ $# -gt 1 ]] && printf 'hint: %s\n' "$2" >&2
    exit 1
}

# --- inside the container ---------------------------------------------------------------------

# Run scripts/test.sh from the copy with the given phases; record its last pytest line. A run
# that passes no test at all counts as failed (a phase that collects nothing proves nothing).
INNER_RESULTS=()
INNER_FAILED=0
inner_test() {
    local label=$1 out rc line
    shift
    banner_inner "$label"
    out=$(mktemp)
    env "$@" bash scripts/test.sh "${INNER_PHASES[@]}" 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    # The summary's pytest lines; each one must have passed tests.
    line=$(grep -E '^  (root|rootless) ' "$out" | sed -E 's/^ +//; s/ +/ /g' | paste -sd ';')
    rm -f -- "$out"
    if ((rc == 0)) && [[ -n $line ]] && ! grep -qvE '[0-9]+ passed' <<<"${line//;/$'\n'}"; then
        INNER_RESULTS+=("$label ok: $line")
    else
        INNER_RESULTS+=("$label FAIL (exit $rc): ${line:-no test line}")
        INNER_FAILED=1
    fi
}
banner_inner() { printf '\n-------- %s --------\n' "$*"; }

inside_prepare() {
    # The machine's CA bundle and pip configuration, nothing else (HOST.md: that is what reaching
    # the registries from here takes). The bundle replaces the tree's own.
    install -m 0644 /run/lpx-host/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
    [[ -f /run/lpx-host/pip.conf ]] && install -m 0644 /run/lpx-host/pip.conf /etc/pip.conf
    # A clone as a person would have it: a writable copy under root's home.
    rm -rf /root/linpodx
    cp -a /run/lpx-host/src /root/linpodx
    # The host's image tarballs: scripts/build-images.sh finds them by their recipe hash and
    # imports them (it builds only those whose recipe differs here, e.g. busybox on trixie).
    install -d -m 0755 /var/cache/linpodx-test
    local f
    for f in /run/lpx-host/images/*.tar; do
        [[ -e $f ]] && cp -- "$f" /var/cache/linpodx-test/
    done
    cd /root/linpodx || exit 1
}

inside_pristine() {
    inside_prepare
    local t0 rc
    banner_inner "pristine: bash scripts/walkthrough.sh (set-up from a bare Debian 12 tree)"
    t0=$(date +%s)
    TERM=${TERM:-xterm} bash scripts/walkthrough.sh </dev/null
    rc=$?
    if ((rc == 0)); then
        INNER_RESULTS+=("walkthrough ok ($(($(date +%s) - t0))s)")
    else
        INNER_RESULTS+=("walkthrough FAIL (exit $rc, $(($(date +%s) - t0))s)")
        INNER_FAILED=1
    fi
    # The host smoke tests as root (a rootful container on podman's default network among them)
    # and as the rootless test user: they run plain podman, so they show what the set-up left.
    INNER_PHASES=(--phase root --phase rootless)
    inner_test "host_ready root+rootless" \
        LINPODX_TEST_PATHS=tests/integration/test_host_ready.py
}

# The README's Install section, as written: its console lines, `# ` as root from the clone,
# `$ ` as a new rootless user from their own clone, each line in a new login shell (as a person
# would type them, the user's after logging in again). Then the user's `linpodx` must be their
# pipx one in ~/.local/bin, found through the PATH a login gives.
readme_lines() {
    awk -v p="$1 " '/^## / { sec = ($0 == "## Install") }
        sec && /^```/ { inb = !inb; next }
        sec && inb && index($0, p) == 1 { print substr($0, length(p) + 1) }' README.md
}
# Record a failed part of the inside run and return non-zero.
inner_fail() {
    INNER_RESULTS+=("$1")
    INNER_FAILED=1
    return 1
}

inside_readme() {
    inside_prepare
    local line n=0 m=0 user=lpx-reader home uid found
    banner_inner "readme: the README's Install section, as written, in a bare Debian 12 tree"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq </dev/null || { inner_fail "readme FAIL: apt-get update"; return; }
    while IFS= read -r line; do
        n=$((n + 1))
        printf '# %s\n' "$line"
        bash -c "$line" </dev/null || { inner_fail "readme FAIL: root line $n: $line"; return; }
    done < <(readme_lines '#')
    ((n > 0)) || { inner_fail "readme FAIL: no root lines in the README's Install"; return; }
    useradd -m -s /bin/bash "$user"
    home=$(getent passwd "$user" | cut -d: -f6)
    uid=$(id -u "$user")
    cp -a /root/linpodx "$home/linpodx"
    chown -R "$user:" "$home/linpodx"
    # No logind here: make the runtime dir a login would have.
    install -d -m 0700 -o "$user" -g "$user" "/run/user/$uid"
    while IFS= read -r line; do
        m=$((m + 1))
        printf '$ %s\n' "$line"
        XDG_RUNTIME_DIR=/run/user/$uid runuser -l "$user" -w XDG_RUNTIME_DIR \
            -c "cd ~/linpodx && $line" </dev/null ||
            { inner_fail "readme FAIL: user line $m: $line"; return; }
    done < <(readme_lines '$')
    ((m > 0)) || { inner_fail "readme FAIL: no user lines in the README's Install"; return; }
    found=$(runuser -l "$user" -c 'command -v linpodx' </dev/null)
    [[ $found == "$home/.local/bin/linpodx" ]] || {
        inner_fail "readme FAIL: the user's login PATH finds '${found:-no linpodx}', not pipx's"
        return
    }
    INNER_RESULTS+=("readme ok: $n root and $m user lines; the user's linpodx is $found")
}

inside_podman5() {
    inside_prepare
    local f
    for f in $PODMAN5_ROOT_TESTS $PODMAN5_ROOTLESS_TESTS; do
        [[ -f $f ]] || die "the podman5 phase lists $f, which this checkout lacks" \
            "update PODMAN5_*_TESTS in scripts/tree-phase.sh"
    done
    banner_inner "podman5: set-up on Debian 13 (scripts/test.sh --prepare-only)"
    bash scripts/test.sh --prepare-only </dev/null || {
        INNER_RESULTS+=("prepare FAIL")
        INNER_FAILED=1
        return
    }
    podman version --format 'podman {{.Client.Version}}' || true
    INNER_PHASES=(--phase root)
    inner_test "root" LINPODX_PYTEST_ARGS="-m podman --durations=15" \
        LINPODX_TEST_PATHS="$(echo $PODMAN5_ROOT_TESTS)"
    INNER_PHASES=(--phase rootless)
    inner_test "rootless slirp4netns" LINPODX_EGRESS_HELPER=slirp4netns \
        LINPODX_PYTEST_ARGS="--durations=15" \
        LINPODX_TEST_PATHS="$(echo $PODMAN5_ROOTLESS_TESTS)"
    inner_test "rootless pasta" LINPODX_EGRESS_HELPER=pasta LINPODX_PYTEST_ARGS="--durations=15" \
        LINPODX_TEST_PATHS="$(echo $PODMAN5_ROOTLESS_TESTS)"
}

if [[ ${1:-} == --inside ]]; then
    INNER_PHASES=()
    case ${2:-} in
    pristine) inside_pristine ;;
    readme) inside_readme ;;
    podman5) inside_podman5 ;;
    *) die "unknown phase: ${2:-}" "pristine or podman5" ;;
    esac
    banner_inner "results"
    for r in "${INNER_RESULTS[@]}"; do log "result: $r"; done
    exit "$INNER_FAILED"
fi

# --- on the host ------------------------------------------------------------------------------
(($# == 2)) || die "usage: tree-phase.sh pristine|podman5 SRC" \
    "scripts/test.sh --phase NAME runs it"
NAME=$1
SRC=$2
[[ $(id -u) -eq 0 ]] || die "scripts/tree-phase.sh must run as root" "run scripts/test.sh as root"
[[ -f $SRC/scripts/tree-phase.sh ]] || die "$SRC is not a copy of the checkout" \
    "scripts/test.sh passes its copy"

# The host's test-suite packages, from the one list in setup-host.sh.
host_packages() {
    # shellcheck disable=SC1090
    (eval "$(sed -n '/^PACKAGES=(/,/^)/p' "$HERE/setup-host.sh")" && IFS=, && echo "${PACKAGES[*]}")
}

case $NAME in
pristine)
    SUITE=bookworm
    # Exactly the issue's "pristine machine": a minimal install plus these three.
    INCLUDE=ca-certificates,git,python3
    ;;
podman5)
    SUITE=trixie
    # Cached with the suite's packages already in: this phase is about podman 5, not set-up
    # (the pristine phase proves the set-up installs everything).
    pk=$(host_packages) || die "cannot read PACKAGES from scripts/setup-host.sh"
    INCLUDE=ca-certificates,git,python3,$pk
    ;;
*) die "unknown phase: $NAME" "pristine or podman5" ;;
esac

recipe="v$RECIPE_VERSION mmdebstrap variant=apt suite=$SUITE include=$INCLUDE"
hash=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)
tree_tar=$LINPODX_TEST_CACHE/tree-$NAME-$hash.tar
image=localhost/linpodx-test/tree-$NAME:latest
install -d -m 0755 "$LINPODX_TEST_CACHE"

if [[ ! -s $tree_tar ]]; then
    log "building $tree_tar: mmdebstrap $SUITE --include=$INCLUDE"
    tmp=$(mktemp --suffix=.tar "$LINPODX_TEST_CACHE/.tree-$NAME.XXXXXX")
    # shellcheck disable=SC2064  # expand now: the trap must remove this very file
    trap "rm -f -- '$tmp'" EXIT
    mmdebstrap --quiet --variant=apt --include="$INCLUDE" \
        --customize-hook='rm -rf "$1/var/cache/apt/archives/"*.deb' \
        "$SUITE" "$tmp" </dev/null ||
        die "mmdebstrap of the $NAME tree failed" "Debian's package mirror must be reachable"
    chmod 0644 "$tmp"
    mv -f -- "$tmp" "$tree_tar"
    trap - EXIT
fi
for f in "$LINPODX_TEST_CACHE"/tree-"$NAME"-*.tar; do
    [[ -e $f && $f != "$tree_tar" ]] && rm -f -- "$f"
done
have=$(podman image inspect --format "{{index .Labels \"$LABEL\"}}" "$image" 2>/dev/null || true)
if [[ $have != "$hash" ]]; then
    old_id=$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    log "importing $image ($hash)"
    podman import --quiet --change "LABEL $LABEL=$hash" --change 'CMD ["/bin/bash"]' \
        "$tree_tar" "$image" >/dev/null </dev/null || die "podman import of $image failed"
    [[ -n $old_id ]] && podman rmi "$old_id" >/dev/null 2>&1
fi

# What the container gets from the host (read-only): the checkout copy, the CA bundle, the pip
# configuration and the test image tarballs.
mounts=(-v "$SRC:/run/lpx-host/src:ro"
    -v /etc/ssl/certs/ca-certificates.crt:/run/lpx-host/ca-certificates.crt:ro)
[[ -f /etc/pip.conf ]] && mounts+=(-v /etc/pip.conf:/run/lpx-host/pip.conf:ro)
for f in "$LINPODX_TEST_CACHE"/debian-*.tar "$LINPODX_TEST_CACHE"/busybox-*.tar; do
    [[ -e $f ]] && mounts+=(-v "$f:/run/lpx-host/images/${f##*/}:ro")
done

# in_container PART: one fresh container of the tree running `tree-phase.sh --inside PART`.
# podman's own start failure (exit 125/126 within seconds, e.g. runc's "can't get final child's
# PID from pipe" seen here once under load) is tried once more: nothing of the phase ran yet.
in_container() {
    local rc t0
    t0=$(date +%s)
    start_container "$1"
    rc=$?
    if ((rc == 125 || rc == 126)) && (($(date +%s) - t0 < 20)); then
        log "$1: the container did not start (exit $rc); trying once more"
        sleep 2
        start_container "$1"
        rc=$?
    fi
    return "$rc"
}

start_container() {
    local part=$1 cname=linpodx-tree-$1-$$ rc t0
    t0=$(date +%s)
    log "running $image as $cname (podman $(podman version --format '{{.Client.Version}}') outside)"
    # --network slirp4netns: its own network namespace, so the inner podman's bridges and
    # firewall rules never touch the host's, and the outer run does not itself need netavark.
    # Not slirp4netns's default 10.0.2.0/24: the sandboxes inside get that one from their own
    # slirp4netns, and "this machine's address" (where the tests' servers listen) would then be
    # their own.
    # The inner stores get their own volumes: overlay cannot stack on the container's overlay
    # root. nofile/nproc: inner podman runs many containers, conmons and guards under these.
    # --init: an init as PID 1 that reaps orphans, as on a machine: linpodx and the tests wait
    # for processes (guards, helpers) to be gone, and an orphan nobody reaps never is.
    timeout --kill-after=30 "$LINPODX_TREE_TIMEOUT" \
        podman run --rm --init --name "$cname" --privileged --device /dev/fuse \
        --network slirp4netns:cidr=10.77.0.0/24 \
        --ulimit nofile=16384:16384 --ulimit nproc=16384:16384 \
        -v /var/lib/containers -v /home -v /var/tmp \
        "${mounts[@]}" -e TERM=xterm -e CI="${CI:-}" "${envs[@]}" \
        "$image" bash /run/lpx-host/src/scripts/tree-phase.sh --inside "$part" </dev/null
    rc=$?
    if ((rc == 124 || rc == 137)); then
        log "result: $part timed out after ${LINPODX_TREE_TIMEOUT}s"
        podman rm -f -t 0 "$cname" >/dev/null 2>&1
    fi
    log "$part: exit $rc after $(($(date +%s) - t0))s"
    return "$rc"
}

envs=()
# This host has cgroup v1 (HOST.md), on which podman 5 prints a deprecation warning on every
# call; podman 5's users are on cgroup v2 and never see it. Pristine runs podman 4.3: no warning.
[[ $NAME == podman5 ]] && envs=(-e PODMAN_IGNORE_CGROUPSV1_WARNING=1)

case $NAME in
pristine)
    # Two fresh containers: the set-up scripts and the README's own install commands must each
    # be complete on their own (either one's packages would hide the other's gaps).
    in_container pristine
    rc=$?
    in_container readme || rc=1
    exit "$rc"
    ;;
podman5) in_container podman5 ;;
esac
