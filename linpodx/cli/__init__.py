"""Command-line interface: one typer sub-app (or command set) per module."""
