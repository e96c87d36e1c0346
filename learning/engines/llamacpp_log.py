"""llama.cpp's own log lines, routed to Python logging (debug), with its recent errors kept for our messages.

Its own module because both the CPU-variant loader (`cpu_backend`, which must install the callback before the
"loaded CPU backend" line) and the engine (`llamacpp_engine`) need it: it used to live in the engine, which imported
the loader, which imported the engine back.

Without a callback llama.cpp prints every load detail to stderr, and the adapter loader reports why it refused a
file only there.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
from typing import Any

log = logging.getLogger("learning.engines.llamacpp")

_lock = threading.Lock()
_recent_errors: collections.deque[str] = collections.deque(maxlen=20)
_callback: Any = None  # the installed ctypes callback (kept alive for as long as llama.cpp may call it)


def install_log_callback() -> None:
    """Install the callback once per process (later calls do nothing)."""
    global _callback
    import llama_cpp.llama_cpp as lc

    with _lock:
        if _callback is not None:
            return

        @lc.llama_log_callback  # type: ignore[misc]
        def callback(level: int, text: bytes, _user: Any) -> None:
            line = text.decode("utf-8", "replace").rstrip()
            if level == 3 and line:  # GGML_LOG_LEVEL_ERROR
                _recent_errors.append(line)
            if line:
                log.debug("llama.cpp: %s", line)

        _callback = callback
        lc.llama_log_set(callback, ctypes.c_void_p(0))


def last_errors() -> str:
    """llama.cpp's last three error lines, or "no reason logged"."""
    return "; ".join(list(_recent_errors)[-3:]) or "no reason logged"
