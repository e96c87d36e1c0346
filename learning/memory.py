"""Hand memory that an update freed back to the operating system.

A policy update on CPU peaks at several GB (logits over the vocabulary, attention activations), and glibc's malloc
keeps most freed heap pages for reuse instead of returning them. In a long-lived trainer or scheduler process the
resident set then ratchets up to the largest update seen and beyond (fragmentation): measured on SmolLM2 with 8
sequences of ~1,250 tokens in micro-batches of <= 4,096 tokens, 8.8 GB after one update and 9.6 GB after three without a
trim, 0.8-1.0 GB with one (`tests/benchmarks/update_memory.py --updates 3 --token-budget 4096`; with one 16k-token
micro-batch the untrimmed process reached 15 GB after one update and 20 GB after five). `malloc_trim(0)` itself takes
milliseconds, but the next update faults the returned pages back in: updates ran up to 15% slower in that benchmark,
the price of not being OOM-killed. Elsewhere (macOS, musl) it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Return freed heap pages to the OS (glibc `malloc_trim(0)`); True when something was trimmed."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False
