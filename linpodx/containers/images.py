"""`run --pull`: an image is pulled by linpodx before `podman create`, not by create itself.

A pull inside `podman create` would be silent (create's output is captured for its error
message) and bounded by create's timeout; a pull of its own shows podman's progress on stderr
as it comes, and has no timeout but Ctrl-C. So, before anything is created:

- `never`: nothing; a missing image fails the create with podman's words and our hint;
- `missing` (the default): `podman image exists`, and a pull only when the image is not there;
- `always` and `newer`: a pull (podman's own pull asks the registry and fetches only what
  changed, which is what both mean).

The create then gets `--pull=never` for `never`, `--pull=missing` otherwise
(`runline.create_pull`): it pulls only if the image was removed in between. Every pull is
recorded (`image.pull`) before it starts.
"""

from __future__ import annotations

from linpodx import proc
from linpodx.containers.record import audit
from linpodx.errors import EngineError
from linpodx.output import note, safe_text
from linpodx.podman import engine
from linpodx.podman.hints import PODMAN_HINT


def pull_needed(image: str, policy: str) -> bool:
    """Whether a run of `image` under `policy` pulls first (`missing`: asks podman)."""
    if policy == "never":
        return False
    if policy == "missing":
        return not engine.image_exists(image)
    return True


def pull_argv(image: str) -> tuple[str, ...]:
    """`podman pull IMAGE` (without the podman binary)."""
    return ("pull", image)


def ensure(image: str, policy: str) -> None:
    """Pull `image` if `policy` says so: a note and podman's progress on stderr (never on
    stdout: podman prints the image id there, which goes to stderr too). EngineError with
    podman's exit status if the pull fails."""
    if not pull_needed(image, policy):
        return
    audit("image.pull", {"image": image, "policy": policy})
    note(f"note: pulling {safe_text(image)} (--pull={policy})")
    argv = (engine.podman_bin(), *pull_argv(image))
    try:
        child = proc.popen(argv, stdout=2)
    except OSError as exc:
        raise EngineError(
            f"podman pull could not be started: {exc}", PODMAN_HINT, argv=argv
        ) from None
    try:
        rc = child.wait()
    except BaseException:
        # Ctrl-C reached podman too (same process group); SIGTERM did not: end it, then go.
        child.terminate()
        child.wait()
        raise
    if rc != 0:
        raise EngineError(
            f"podman pull {safe_text(image)} failed (exit {rc})",
            "see podman's message above; check the image name, the registry and "
            "`podman login`, or use --pull=never for an image already in this user's store",
            argv=argv,
            returncode=rc,
        )
