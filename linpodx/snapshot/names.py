"""Snapshot names, image references and where snapshot files live (pure functions)."""

from __future__ import annotations

import re
from pathlib import Path

from linpodx.errors import InvalidInput
from linpodx.paths import snapshots_dir
from linpodx.podman.runline import validate_name

# podman/OCI tag grammar: what `podman tag` accepts after the colon.
LABEL_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
# One path component of an image repository: lower-case only (OCI distribution grammar).
REPO_COMPONENT_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")
JOB_RE = re.compile(r"^snap-[0-9A-HJKMNP-TV-Z]{26}\Z")

IMAGE_REPO_PREFIX = "localhost/linpodx/snapshot"


def check_label(label: str) -> str:
    """Return `label` if it is a valid podman tag, else raise InvalidInput."""
    if not LABEL_RE.match(label):
        raise InvalidInput(
            f"invalid snapshot label: {label!r}",
            "use 1-128 characters from A-Z a-z 0-9 _ . - (not starting with . or -)",
        )
    return label


def check_container_name(name: str) -> str:
    """Return `name` if it can name both a container and an image repository component.

    Image repositories are lower-case only, so a container called `Agent` cannot be snapshotted
    under its own name; mapping it to lower case could collide with a container `agent`.
    """
    # The rule (and the message) every other command uses: only linpodx containers can be
    # snapshotted, and `linpodx run` names none longer than 63 characters.
    validate_name(name)
    if not REPO_COMPONENT_RE.match(name):
        raise InvalidInput(
            f"container name {name!r} cannot be used in an image reference",
            "snapshots need a lower-case container name made of a-z 0-9 with single . or _ "
            "or runs of - between them",
        )
    return name


def check_job_id(job_id: str) -> str:
    """Return `job_id` if it looks like `snap-<ULID>`, else raise InvalidInput."""
    if not JOB_RE.match(job_id):
        raise InvalidInput(
            f"invalid job id: {job_id!r}",
            "job ids look like snap-01J… (printed by `linpodx snapshot create`)",
        )
    return job_id


def image_ref(name: str, label: str) -> str:
    """The full image reference a snapshot is tagged with."""
    return f"{IMAGE_REPO_PREFIX}/{name}:{label}"


def container_root(name: str) -> Path:
    """Directory holding every snapshot of container `name`."""
    return snapshots_dir() / name


def snapshot_dir(name: str, label: str) -> Path:
    """Directory holding one snapshot's manifest and workspace archives."""
    return container_root(name) / label


def jobs_dir() -> Path:
    """Directory of job files (`snap-<ULID>.json`) and worker logs.

    `.jobs`, not `jobs`: container names cannot start with a dot, so a container called `jobs`
    never shares a directory with the job files.
    """
    return snapshots_dir() / ".jobs"


def job_file(job_id: str) -> Path:
    return jobs_dir() / f"{job_id}.json"


def job_log(job_id: str) -> Path:
    return jobs_dir() / f"{job_id}.log"
