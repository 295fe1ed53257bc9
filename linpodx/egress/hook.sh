#!/bin/sh
# OCI `createRuntime` hook of a guarded one-call run (`podman --hooks-dir=… run`).
#
#     sh hook.sh STATE_FIFO ANSWER_FIFO     (the OCI state JSON on stdin)
#
# The OCI runtime runs this after it has made the container's namespaces and before the
# container's command starts; its exit status decides whether the command ever starts. It
# hands the OCI state, unread, to `linpodx run` through STATE_FIFO (`guard.hook_pid` parses it
# and checks it is this container's), then waits for `linpodx run`'s answer on ANSWER_FIFO,
# which comes once the egress guard is ready for exactly that container's pid
# (`guard.hook_release`). Exit 0 only on the answer `ready`: a failure said there, no answer
# (`linpodx run` is gone: end of file), or runc's hook timeout all keep the command from ever
# starting, so the filter is in place before the agent's first packet or the agent never runs.
#
# A POSIX shell script rather than Python: it is on the critical path of every filtered run,
# and needs no parsing of its own (Python with its json module took ~25 ms to start here).
# Only `podman run` passes the hooks dir: a plain `podman start` of the container later runs no
# hook and no guard, and the container keeps `--network=none`.
[ "$#" -eq 2 ] || { echo "linpodx egress hook: usage: hook.sh STATE_FIFO ANSWER_FIFO" >&2; exit 2; }
cat > "$1" || exit 1
answer=
IFS= read -r answer < "$2" || [ -n "$answer" ] || {
    echo "linpodx egress hook: no answer from linpodx run" >&2
    exit 1
}
[ "$answer" = ready ] && exit 0
printf 'linpodx egress hook: %s\n' "$answer" >&2
exit 1
