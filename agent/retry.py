"""Retry timing shared by the HTTP clients (policy and judge): jittered exponential backoff and Retry-After."""

from __future__ import annotations

import email.utils
import random
import time


def jittered_backoff(attempt: int, base_s: float, max_s: float) -> float:
    """Pause before retry `attempt` (from 0): the doubling delay capped at `max_s`, "equal jitter" in [cap/2, cap].

    Never zero, and spread out, so clients that failed together do not retry together.
    """
    cap = min(max_s, base_s * (2**attempt))
    return cap * random.uniform(0.5, 1.0)


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds asked for by a Retry-After header (delta-seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
