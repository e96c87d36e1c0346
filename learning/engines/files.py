"""The file helpers every engine uses: a cross-process lock, keyed JSON records, a file's SHA-256.

One room for them (they were spread over `threads.py`, `gguf_lora.py`, `llamacpp_build.py` and `grpo.py`, the
hash written three times). Standard library only: `llamacpp_build` runs during `make install`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHUNK = 1 << 20  # files are hashed in 1 MiB pieces: a GGUF is hundreds of MB


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path`: a second process converting or measuring the same cache waits here."""
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def store_keyed(path: Path, key: str, entry: object) -> None:
    """Store `entry` under `key` in the JSON object file `path`, keeping the other keys' entries (atomic replace).
    The per-machine records beside the model (thread plans, llama.cpp CPU variant probes) are such files."""
    path = Path(path)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = entry
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()  # gone after the replace; left only by a failed write


def hash_into(h: Any, fd: int) -> None:
    """Feed the open file `fd` to the hash `h` in CHUNK pieces, and close it."""
    with open(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)


def sha256_file(path: Path, *, follow_links: bool = True) -> str:
    """The hex SHA-256 of a file, read in pieces. With `follow_links=False` a link is refused (O_NOFOLLOW raises
    OSError), so a cache entry swapped for a link to another file is never vouched for."""
    h = hashlib.sha256()
    hash_into(h, os.open(path, os.O_RDONLY | (0 if follow_links else os.O_NOFOLLOW)))
    return h.hexdigest()
