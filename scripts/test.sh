#!/usr/bin/env bash
# linpodx's one test command, for a Debian 12 machine, as root:
#
#     bash scripts/test.sh [--prepare-only] [--phase NAME]...
#
# It sets the machine up (scripts/setup-host.sh: packages, containers.conf, the rootless test
# user), copies this checkout to a place that user can read, makes a venv from Debian's python3
# with the project and its test extras, builds and imports the test images
# (scripts/build-images.sh), then runs:
#     lint       ruff check linpodx tests bench; mypy (strict, on linpodx/)
#     root       pytest tests                                    (unit, integration, e2e)
#     rootless   pytest -m podman tests/integration tests/e2e    (as the rootless test user)
#     pristine   set-up + walk-through in a container made from a bare Debian 12 tree
#     podman5    podman tests in a container made from a Debian 13 tree (podman 5), root and
#                rootless with slirp4netns and with pasta            (scripts/tree-phase.sh)
# Each step skips what is already in place (hashes, labels, stamps), so a re-run is fast.
# --prepare-only stops after the images: the machine, the venv (with the `linpodx` command in
# $LINPODX_TEST_ROOT/venv/bin) and the images are ready, no lint or test runs.
# --phase NAME (repeatable) runs only the named phases (lint, root, rootless, pristine, podman5)
# after the set-up ones (setup, python, images); without it every phase runs.
#
# Environment:
#     LINPODX_PYTEST_ARGS   extra pytest arguments for both pytest phases (split on spaces)
#     LINPODX_TEST_PATHS    test paths for both pytest phases instead of their defaults (split on
#                           spaces; the podman5 phase uses it inside its container)
#     LINPODX_EGRESS_HELPER passed to the rootless phase too (slirp4netns or pasta)
#     LINPODX_TEST_IMAGE    Debian test image (default localhost/linpodx-test/debian:12)
#     LINPODX_TEST_BUSYBOX  busybox test image (default localhost/linpodx-test/busybox:latest)
#     LINPODX_TEST_USER     rootless test user (default linpodx-test)
#     LINPODX_TEST_ROOT     where the venv and the source copy live (default /opt/linpodx-test)
# Exit status: 0 only when every phase passed and both pytest phases ran tests.
set -uo pipefail
umask 022

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
: "${LINPODX_TEST_USER:=linpodx-test}"
: "${LINPODX_TEST_ROOT:=/opt/linpodx-test}"
: "${LINPODX_TEST_IMAGE:=localhost/linpodx-test/debian:12}"
: "${LINPODX_TEST_BUSYBOX:=localhost/linpodx-test/busybox:latest}"
export LINPODX_TEST_USER LINPODX_TEST_ROOT LINPODX_TEST_IMAGE LINPODX_TEST_BUSYBOX
VENV=$LINPODX_TEST_ROOT/venv
SRC=$LINPODX_TEST_ROOT/src
LOGS=$LINPODX_TEST_ROOT/logs
# Pinned so a new ruff release cannot turn a green tree red overnight; bump on purpose.
RUFF_SPEC="ruff==0.17.6"
MYPY_SPEC="mypy==2.4.1"
# Bump to force a venv rebuild when the way it is built changes.
VENV_RECIPE=1

# The suite must run its podman tests here; this variable exists only for laptops without podman.
unset LINPODX_SKIP_PODMAN PYTHONPATH PYTHONHOME
export DEBIAN_FRONTEND=noninteractive

START=$(date +%s)
PHASES=()
RESULTS=()
TIMES=()
NOTES=()
FAILED=0

banner() { printf '\n======== %s ========\n' "$*"; }
die() {
    printf 'error: %s\n' "$1" >&2
    [[ $# -gt 1 ]] && printf 'hint: %s\n' "$2" >&2
    exit 1
}

# record NAME RESULT SECONDS NOTE
record() {
    PHASES+=("$1")
    RESULTS+=("$2")
    TIMES+=("$3")
    NOTES+=("$4")
    [[ $2 == ok ]] || FAILED=1
}

summary() {
    banner "summary"
    local i
    for i in "${!PHASES[@]}"; do
        printf '  %-10s %-6s %5ss  %s\n' "${PHASES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}" "${NOTES[$i]}"
    done
    printf '  total: %ss\n' "$(($(date +%s) - START))"
    if ((FAILED)); then
        printf 'test.sh: FAILED\n'
    else
        printf 'test.sh: all phases passed\n'
    fi
}

# A setup phase that must work for anything after it to mean something.
setup_phase() {
    local name=$1 t0 rc
    shift
    banner "$name"
    t0=$(date +%s)
    "$@" 9>&-
    rc=$?
    if ((rc != 0)); then
        record "$name" FAIL "$(($(date +%s) - t0))" "exit $rc; later phases not run"
        summary
        exit 1
    fi
    record "$name" ok "$(($(date +%s) - t0))" ""
}

PREPARE_ONLY=0
ALL_PHASES=(lint root rootless pristine podman5)
WANT=()
want() {
    local p
    ((${#WANT[@]})) || return 0
    for p in "${WANT[@]}"; do [[ $p == "$1" ]] && return 0; done
    return 1
}
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    arg=${args[$i]}
    case $arg in
    --prepare-only) PREPARE_ONLY=1 ;;
    --phase | --phase=*)
        if [[ $arg == --phase ]]; then
            i=$((i + 1))
            arg=${args[$i]:-}
        else
            arg=${arg#--phase=}
        fi
        [[ " ${ALL_PHASES[*]} " == *" $arg "* ]] ||
            die "unknown phase: '$arg'" "phases: ${ALL_PHASES[*]} (setup, python, images always run)"
        WANT+=("$arg")
        ;;
    -h | --help)
        sed -n '2,/^set -uo pipefail/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument: $arg" \
        "pytest arguments go in LINPODX_PYTEST_ARGS, e.g. LINPODX_PYTEST_ARGS='-x -k audit'" ;;
    esac
done

[[ $(id -u) -eq 0 ]] || die "scripts/test.sh must run as root (it installs packages and runs the \
suite as root and as a rootless user)" "run it as root: sudo bash scripts/test.sh"

# Two runs at once would copy over each other's source tree and images. fd 9 holds the lock;
# every child gets it closed (9>&-) so that nothing podman leaves running (its rootless pause
# process, conmon) could keep the lock after this run ends.
install -d -m 0755 /run/lock
exec 9>/run/lock/linpodx-test.lock
if ! flock -n 9; then
    echo "test.sh: another run holds /run/lock/linpodx-test.lock" \
        "($(cat /run/lock/linpodx-test.owner 2>/dev/null || echo 'owner unknown')); waiting"
    flock 9
fi
echo "pid $$ from $REPO since $(date -u +%H:%M:%SZ)" >/run/lock/linpodx-test.owner

# --- setup ----------------------------------------------------------------------------------
setup_phase setup bash "$REPO/scripts/setup-host.sh"

USER_UID=$(id -u "$LINPODX_TEST_USER")
USER_HOME=$(getent passwd "$LINPODX_TEST_USER" | cut -d: -f6)

# Copy the checkout (tracked files and untracked ones that are not ignored) to a world-readable
# place: the checkout may sit under /root (mode 0700), which the rootless user cannot enter.
sync_src() {
    local new=$LINPODX_TEST_ROOT/src.new
    install -d -m 0755 "$LINPODX_TEST_ROOT"
    rm -rf -- "$new"
    install -d -m 0755 "$new"
    if git -c safe.directory="$REPO" -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git -c safe.directory="$REPO" -C "$REPO" ls-files -z --cached --others --exclude-standard |
            while IFS= read -r -d '' f; do
                case /$f in
                */__pycache__/* | */.pytest_cache/* | */*.egg-info/* | */.venv/*) continue ;;
                esac
                # Tracked files deleted in the work tree are still listed: skip them.
                [[ -e $REPO/$f || -L $REPO/$f ]] && printf '%s\0' "$f"
            done |
            tar -C "$REPO" --null --no-recursion -T - -cf - | tar -C "$new" -xf - || return 1
    else
        tar -C "$REPO" --exclude=.git --exclude=__pycache__ --exclude=.pytest_cache \
            --exclude='*.egg-info' --exclude=.venv -cf - . | tar -C "$new" -xf - || return 1
    fi
    [[ -f $new/pyproject.toml && -d $new/linpodx && -d $new/tests ]] || {
        echo "test.sh: the copy of $REPO lacks pyproject.toml, linpodx/ or tests/" >&2
        return 1
    }
    chmod -R u+rwX,go+rX,go-w "$new"
    rm -rf -- "$SRC"
    mv -- "$new" "$SRC"
    echo "test.sh: copied $(find "$SRC" -type f | wc -l) files to $SRC"
}

# Cheap proof the venv is whole: linpodx imports from the source copy and the test
# dependencies are installed (importing mcp itself takes seconds on a loaded machine).
VENV_CHECK='
import importlib.metadata as m, linpodx
for dist in ("linpodx", "pytest", "pexpect", "mcp", "ruff", "mypy"):
    m.version(dist)
'

# The venv is made from Debian's python3 (a pyenv python under /root is unreadable for the
# rootless user). pip runs only when pyproject.toml, the python or this recipe changed.
ensure_venv() {
    local pyver want have
    pyver=$(/usr/bin/python3 -c 'import sys; print(sys.version)') || return 1
    # Only the parts of pyproject.toml that change what pip installs: editing the pytest or
    # ruff settings must not cost a reinstall.
    want=$( (
        /usr/bin/python3 - "$SRC/pyproject.toml" <<'PY' || exit 1
import json, sys, tomllib
with open(sys.argv[1], "rb") as f:
    doc = tomllib.load(f)
keep = {
    "build-system": doc.get("build-system"),
    "project": doc.get("project"),
    "setuptools": doc.get("tool", {}).get("setuptools"),
}
print(json.dumps(keep, sort_keys=True))
PY
        printf '%s\n%s\n%s\n%s\n' "$pyver" "$RUFF_SPEC" "$MYPY_SPEC" "$VENV_RECIPE"
    ) | sha256sum | cut -d' ' -f1) || return 1
    have=$(cat "$VENV/.linpodx-stamp" 2>/dev/null || true)
    if [[ $have == "$want" ]] &&
        "$VENV/bin/python" -c "$VENV_CHECK" 2>/dev/null &&
        [[ -x $VENV/bin/ruff ]]; then
        echo "test.sh: venv $VENV up to date"
        return 0
    fi
    if [[ ! -x $VENV/bin/python ]] ||
        [[ $("$VENV/bin/python" -c 'import sys; print(sys.version)' 2>/dev/null) != "$pyver" ]]; then
        echo "test.sh: creating venv $VENV from /usr/bin/python3"
        rm -rf -- "$VENV"
        /usr/bin/python3 -m venv "$VENV" || return 1
    fi
    rm -f -- "$VENV/.linpodx-stamp"
    echo "test.sh: pip install -e $SRC[test] $RUFF_SPEC $MYPY_SPEC"
    # This machine's pip configuration may name local wheel dirs that do not exist; pip warns
    # once per package about them. Drop only those lines.
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -e "$SRC[test]" "$RUFF_SPEC" "$MYPY_SPEC" \
        </dev/null 2>&1 | grep -v -E "^WARNING: Location '[^']*' is ignored" >&2
    ((PIPESTATUS[0] == 0)) || return 1
    "$VENV/bin/python" -c "$VENV_CHECK" || return 1
    printf '%s\n' "$want" >"$VENV/.linpodx-stamp"
}

python_setup() { sync_src && ensure_venv && chmod -R go+rX,go-w "$VENV"; }
setup_phase python python_setup
setup_phase images bash "$REPO/scripts/build-images.sh" "$VENV"

if ((PREPARE_ONLY)); then
    summary
    echo "test.sh: prepared (--prepare-only): venv $VENV, source copy $SRC; no lint or tests run"
    exit "$FAILED"
fi

install -d -m 0755 "$LOGS"
read -ra EXTRA <<<"${LINPODX_PYTEST_ARGS:-}"
read -ra TEST_PATHS <<<"${LINPODX_TEST_PATHS:-}"

# Last pytest summary line of a log ("=== 12 passed, 1 skipped in 3.21s ===" -> the inside).
pytest_tail() {
    grep -E '^=+ .* in [0-9.]+s.* =+$' "$1" | tail -n1 | sed -E 's/^=+ //; s/ =+$//'
}

# --- lint -----------------------------------------------------------------------------------
lint_phase() {
    banner "lint: ruff check"
    t0=$(date +%s)
    lint_paths=()
    for p in linpodx tests bench; do [[ -e $SRC/$p ]] && lint_paths+=("$p"); done
    (cd "$SRC" && "$VENV/bin/ruff" check --no-cache "${lint_paths[@]}") 9>&-
    rc=$?
    # mypy strict on the package (settings in pyproject.toml); no cache, so a stale one never hides
    # an error.
    (cd "$SRC" && "$VENV/bin/mypy" --cache-dir=/dev/null) 9>&-
    mrc=$?
    if ((rc == 0 && mrc == 0)); then
        record lint ok "$(($(date +%s) - t0))" "ruff check ${lint_paths[*]}; mypy linpodx"
    else
        record lint FAIL "$(($(date +%s) - t0))" "ruff exit $rc, mypy exit $mrc"
    fi
}

# --- pytest as root -------------------------------------------------------------------------
root_phase() {
    local root_paths=(tests)
    ((${#TEST_PATHS[@]})) && root_paths=("${TEST_PATHS[@]}")
    banner "pytest as root: ${root_paths[*]}"
    t0=$(date +%s)
    root_log=$LOGS/pytest-root.log
    (
        cd "$SRC" &&
            PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV" \
                "$VENV/bin/python" -m pytest -p no:cacheprovider --durations=20 "${root_paths[@]}" "${EXTRA[@]}" </dev/null
    ) 2>&1 9>&- | tee "$root_log"
    rc=${PIPESTATUS[0]}
    tail_line=$(pytest_tail "$root_log")
    case $rc in
    0) record root ok "$(($(date +%s) - t0))" "$tail_line" ;;
    5) record root FAIL "$(($(date +%s) - t0))" "NO TESTS COLLECTED (pytest exit 5)" ;;
    *) record root FAIL "$(($(date +%s) - t0))" "pytest exit $rc: $tail_line" ;;
    esac
}

# --- pytest as the rootless user ------------------------------------------------------------
rootless_phase() {
    local user_paths=() p
    if ((${#TEST_PATHS[@]})); then
        user_paths=("${TEST_PATHS[@]}")
    else
        for p in tests/integration tests/e2e; do [[ -d $SRC/$p ]] && user_paths+=("$p"); done
    fi
    banner "pytest as $LINPODX_TEST_USER (rootless${LINPODX_EGRESS_HELPER:+, $LINPODX_EGRESS_HELPER}): -m podman ${user_paths[*]}"
    t0=$(date +%s)
    user_log=$LOGS/pytest-rootless.log
    # What else runs as the test user shares its rootless user namespace (and so its
    # RLIMIT_NPROC count and its podman) with the tests: said, so a failure it causes is read
    # for what it is.
    local others
    others=$(pgrep -c -u "$LINPODX_TEST_USER" || true)
    if ((others > 0)); then
        echo "test.sh: note: $others processes of $LINPODX_TEST_USER were running when this phase started:"
        ps -o pid=,etime=,args= -u "$LINPODX_TEST_USER" | head -n 20
    fi
    # basetemp in the user's own home: tmp_path dirs are then the user's, and bind mounts of them
    # into rootless containers behave as they would for a person.
    basetemp=$USER_HOME/.cache/linpodx-tests/basetemp
    runuser -u "$LINPODX_TEST_USER" -- install -d -m 0700 "$USER_HOME/.cache" \
        "$USER_HOME/.cache/linpodx-tests"
    user_env=(
        HOME="$USER_HOME" USER="$LINPODX_TEST_USER" LOGNAME="$LINPODX_TEST_USER"
        PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin" VIRTUAL_ENV="$VENV" LANG=C.UTF-8
        XDG_RUNTIME_DIR="/run/user/$USER_UID"
        CONTAINERS_STORAGE_CONF="$USER_HOME/.config/containers/storage.conf"
        LINPODX_TEST_IMAGE="$LINPODX_TEST_IMAGE" LINPODX_TEST_BUSYBOX="$LINPODX_TEST_BUSYBOX"
    )
    [[ -n ${CI:-} ]] && user_env+=(CI="$CI")
    [[ -n ${TERM:-} ]] && user_env+=(TERM="$TERM")
    [[ -n ${LINPODX_EGRESS_HELPER:-} ]] && user_env+=(LINPODX_EGRESS_HELPER="$LINPODX_EGRESS_HELPER")
    # Set by the podman5 phase: podman 5 warns about cgroup v1 hosts (this CI's) on every call.
    [[ -n ${PODMAN_IGNORE_CGROUPSV1_WARNING:-} ]] &&
        user_env+=(PODMAN_IGNORE_CGROUPSV1_WARNING="$PODMAN_IGNORE_CGROUPSV1_WARNING")
    if ((${#user_paths[@]} == 0)); then
        echo "test.sh: no tests/integration or tests/e2e directory" | tee "$user_log"
        rc=4
    else
        runuser -u "$LINPODX_TEST_USER" -- env -i --chdir="$SRC" "${user_env[@]}" \
            "$VENV/bin/python" -m pytest -p no:cacheprovider --durations=20 --basetemp="$basetemp" \
            -m podman "${user_paths[@]}" "${EXTRA[@]}" </dev/null 2>&1 9>&- | tee "$user_log"
        rc=${PIPESTATUS[0]}
    fi
    tail_line=$(pytest_tail "$user_log")
    if ((rc == 5)); then
        # Acceptable only when the tree truly has no podman test yet: count them as root.
        n=$(cd "$SRC" && "$VENV/bin/python" -m pytest -p no:cacheprovider --collect-only -q \
            -m podman "${user_paths[@]}" 2>/dev/null | grep -c '::' || true)
        if [[ $n == 0 ]]; then
            printf '\n!!!!!!!! NO PODMAN TESTS EXIST: the rootless phase ran nothing !!!!!!!!\n\n'
            record rootless ok "$(($(date +%s) - t0))" "NO PODMAN TESTS EXIST (nothing ran)"
        else
            record rootless FAIL "$(($(date +%s) - t0))" \
                "collected nothing as $LINPODX_TEST_USER, but root sees $n podman tests"
        fi
    elif ((rc == 0)); then
        record rootless ok "$(($(date +%s) - t0))" "$tail_line"
    else
        record rootless FAIL "$(($(date +%s) - t0))" "pytest exit $rc: $tail_line"
    fi
}

# --- phases in containers made from fresh Debian trees (scripts/tree-phase.sh) ---------------
tree_phase() {
    local name=$1 log=$LOGS/$1.log note
    banner "$name: in a container made from a fresh Debian tree (scripts/tree-phase.sh $name)"
    t0=$(date +%s)
    bash "$REPO/scripts/tree-phase.sh" "$name" "$SRC" 2>&1 9>&- | tee "$log"
    rc=${PIPESTATUS[0]}
    note=$(grep -E '^tree-phase: result: ' "$log" | sed -E 's/^tree-phase: result: //' |
        paste -sd '|' | sed 's/|/ | /g')
    if ((rc == 0)) && [[ -n $note ]]; then
        record "$name" ok "$(($(date +%s) - t0))" "$note"
    else
        record "$name" FAIL "$(($(date +%s) - t0))" "exit $rc: ${note:-no result line}"
    fi
}

want lint && lint_phase
want root && root_phase
want rootless && rootless_phase
want pristine && tree_phase pristine
want podman5 && tree_phase podman5

summary
echo "test.sh: logs in $LOGS"
exit "$FAILED"
