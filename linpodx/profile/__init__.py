"""Sandbox profiles: JSON Schema, YAML loader, frozen model, and the store of applied revisions."""

HOME_DIR = "/home/agent"
"""The agent's `$HOME` inside every linpodx container: a rule of the profile language (mount
targets and the default workdir are checked against it) that the podman layer applies. Here,
in the package's face, because the fast run path loads the package anyway."""
