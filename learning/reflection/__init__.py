"""The reflection meta-policy, inference side: sample reflections on judged sessions, score them, bank the best.

`writer.write_reflection` handles one session and `writer.reflect_pending` every session still waiting.
"""

from __future__ import annotations

from learning.reflection.writer import (
    DEFAULT_THRESHOLD,
    InvalidReflectionArgs,
    NotReflectable,
    ReflectionError,
    ReflectionOutcome,
    ReflectSummary,
    reflect_pending,
    write_reflection,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "InvalidReflectionArgs",
    "NotReflectable",
    "ReflectSummary",
    "ReflectionError",
    "ReflectionOutcome",
    "reflect_pending",
    "write_reflection",
]
