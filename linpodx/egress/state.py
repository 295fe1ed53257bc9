"""Where one container's egress files live (under the container's state dir)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from linpodx.egress import launch as names
from linpodx.paths import containers_dir, ensure_dir
from linpodx.podman.runline import INIT_PIDFILE


@dataclass(frozen=True)
class EgressState:
    """Paths of one container's egress guard files."""

    name: str

    @property
    def dir(self) -> Path:
        return containers_dir() / self.name / names.EGRESS_DIR

    def ensure(self) -> Path:
        ensure_dir(self.dir.parent)
        return ensure_dir(self.dir)

    @property
    def resolv_conf(self) -> Path:
        """Bind-mounted over the container's /etc/resolv.conf; names only our resolver."""
        return self.dir / names.RESOLV_CONF_FILE

    @property
    def policy_file(self) -> Path:
        """What the guard enforces; rewritten atomically by a re-apply."""
        return self.dir / names.POLICY_FILE

    @property
    def init_pidfile(self) -> Path:
        """The container's init pid, written by `podman init` (see INIT_PIDFILE)."""
        return self.dir / INIT_PIDFILE

    @property
    def hooks_dir(self) -> Path:
        """OCI hooks dir of a one-call run (`podman --hooks-dir`); see guard.hook_setup."""
        return self.dir / names.HOOKS_DIR

    @property
    def hook_fifo(self) -> Path:
        """FIFO through which the createRuntime hook hands over the OCI state (with the pid)."""
        return self.dir / names.HOOK_FIFO

    @property
    def hook_answer_fifo(self) -> Path:
        """FIFO on which `linpodx run` answers the hook (see guard.hook_release)."""
        return self.dir / names.HOOK_ANSWER_FIFO

    @property
    def guard_file(self) -> Path:
        """The guard's own state: pid, container pid, helper, applied revision."""
        return self.dir / names.GUARD_FILE

    @property
    def guard_log(self) -> Path:
        return self.dir / names.GUARD_LOG

    @property
    def helper_log(self) -> Path:
        return self.dir / names.HELPER_LOG

    @property
    def pasta_pidfile(self) -> Path:
        """pasta's pid, written by the pasta keeper it runs under."""
        return self.dir / names.PASTA_PIDFILE

    @property
    def pasta_netns(self) -> Path:
        """Rootful pasta: an empty file the keeper binds the container's netns onto, in a
        mount namespace only the keeper and pasta see."""
        return self.dir / names.PASTA_NETNS
