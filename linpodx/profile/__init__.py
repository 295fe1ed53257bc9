"""Sandbox profiles: JSON Schema, YAML loader, frozen model, and the store of applied revisions."""
