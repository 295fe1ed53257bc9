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
checked=0
while IFS=' ' read -r dev ino dest; do
    [ -n "$dev" ] || continue
    got=$(stat -c '%d %i' -- "/proc/$pid/root$root$dest" 2>/dev/null) ||
        fail "cannot see the mount at $dest"
    [ "$got" = "$dev $ino" ] ||
        fail "the mount at $dest is not the directory linpodx checked (it changed since)"
    checked=$((checked + 1))
done < "$1" || fail "cannot read $1"
[ "$checked" -gt 0 ] || fail "nothing to check in $1"
exit 0
