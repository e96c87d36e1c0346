"""Composition root and user-facing entry points (CLI, later the UI and scheduler); the only package that reads
the environment."""
