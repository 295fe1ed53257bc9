#!/bin/sh
# OCI `createRuntime` hook: every bind mount of the container is the very directory (or file)
# linpodx checked.
#
#     sh mountcheck.sh EXPECT_FILE GATE     (the OCI state JSON on stdin)
#
# linpodx checks each mount source on the host before a run or a start (not sensitive, not a
# symlink into a sensitive path) and notes the device and inode of what it checked, one line
# per mount in EXPECT_FILE: `DEV INO DESTINATION`. runc then mounts the source again by its
# path, moments later; an agent with a writable mount over the source's parent could have
# swapped it for a symlink to `~/.ssh` in between. runc runs this hook after it has made the
# mounts and before the container's command starts, so it compares what is really mounted
# (seen through the container's init process: /proc/PID/root + the rootfs path + the
# destination) with what was checked. Any difference, or anything it cannot read, exits 1:
# runc then never starts the command.
#
# First of all it closes the gate: GATE is an empty file the container bind-mounts, which
# linpodx creates just before each start it makes. Removed here (runc has mounted it by now),
# it makes any later plain `podman start`/`restart` outside linpodx fail in runc before the
# command runs, instead of mounting the sources unchecked (see linpodx/podman/mountpin.py).
#
# POSIX sh with `stat` only (no Python start-up on every run). The OCI state (from runc) and
# config.json (from podman) are compact single-line JSON with `pid` and `bundle` before any
# annotation and `"root":{"path":…}` in the config; anything else fails closed.
PATH=/usr/local/bin:/usr/bin:/bin  # runc gives hooks an empty environment
fail() { printf 'linpodx mount check: %s\n' "$1" >&2; exit 1; }
[ "$#" -eq 2 ] || { echo "linpodx mount check: usage: mountcheck.sh EXPECT_FILE GATE" >&2; exit 2; }
rm -f -- "$2" 2>/dev/null
[ ! -e "$2" ] && [ ! -L "$2" ] || fail "cannot close the start gate $2"
state=
IFS= read -r state || [ -n "$state" ] || fail "no OCI state on stdin"
case $state in *'"pid":'*'"bundle":"'*) ;; *) fail "no pid or bundle in the OCI state" ;; esac
pid=${state#*\"pid\":}
pid=${pid%%[!0-9]*}
bundle=${state#*\"bundle\":\"}
bundle=${bundle%%\"*}
[ -n "$pid" ] && [ "$pid" -gt 1 ] || fail "no usable pid in the OCI state"
# grep, not the shell's `read`: config.json is one line of ~20 kB, which `read` takes a byte
# per system call (~14 ms per start here).
root=$(grep -o -m 1 '"root":{"path":"[^"]*"' "$bundle/config.json") ||
    fail "no root path in $bundle/config.json"
root=${root#\"root\":\{\"path\":\"}
root=${root%\"}
case $root in /*) ;; *) fail "the rootfs path is not absolute" ;; esac
# Where runc mounted DEST: DEST resolved inside the rootfs R the way runc resolves it
# (securejoin), each symlink followed with R as its root and `..` never above R. The agent owns
# its rootfs and may have made a parent of DEST an absolute symlink to a host directory: the
# kernel would resolve `/proc/PID/root$root$dest` from the host's root, so a plain stat there
# would look at the host path, not at the mount. The container's command has not started, so
# nothing in it can change these links while this runs. Prints the path below R (`/…`).
resolve() {
    r=$1 rest=$2 cur= links=0
    while :; do
        while case $rest in /*) true ;; *) false ;; esac; do rest=${rest#/}; done
        [ -n "$rest" ] || break
        comp=${rest%%/*}
        case $rest in */*) rest=${rest#*/} ;; *) rest= ;; esac
        case $comp in
            .) continue ;;
            ..) cur=${cur%/*}; continue ;;
        esac
        if [ -L "$r$cur/$comp" ]; then
            links=$((links + 1))
            [ "$links" -le 40 ] || return 1
            link=$(readlink -- "$r$cur/$comp") && [ -n "$link" ] || return 1
            case $link in /*) cur= ;; esac
            rest=$link/$rest
        else
            cur=$cur/$comp
        fi
    done
    printf '%s\n' "${cur:-/}"
}
checked=0
while IFS=' ' read -r dev ino dest; do
    [ -n "$dev" ] || continue
    at=$(resolve "/proc/$pid/root$root" "$dest") || fail "cannot resolve $dest in the rootfs"
    got=$(stat -c '%d %i' -- "/proc/$pid/root$root$at" 2>/dev/null) ||
        fail "cannot see the mount at $dest"
    [ "$got" = "$dev $ino" ] ||
        fail "the mount at $dest is not the directory linpodx checked (it changed since)"
    checked=$((checked + 1))
done < "$1" || fail "cannot read $1"
[ "$checked" -gt 0 ] || fail "nothing to check in $1"
exit 0
