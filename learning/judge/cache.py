"""On-disk cache of valid judge answers, keyed by a hash of the model, the request and the JSON mode.

One small JSON file per answer under `<root>/<key[:2]>/<key>.json`, written atomically (temp file + rename) so a crash
or a concurrent writer never leaves a half-written entry; an unreadable entry is treated as a miss and overwritten.

A deletion empties the folder (`store.deletion.clear_judge_cache`) and gives it a new generation first. A judge call
takes the generation before it asks the endpoint (`JudgeCache.generation`) and hands it to `put`, which renames its
entry into place only while the generation is unchanged, under the folder's lock: an answer that was on its way when a
deletion ran, possibly quoting the deleted person's text, is never written after the clear (issue 65, finding 12).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from store.deletion import judge_cache_generation, judge_cache_lock

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the entry layout changes; older entries then read as misses


class _Now(Enum):
    NOW = "now"


NOW = _Now.NOW  # `put`'s default generation: the folder's as the write happens (no request was in flight)


class CachedAnswer(BaseModel):
    """One cached judge answer: the raw content the endpoint returned and what it cost then."""

    model_config = ConfigDict(frozen=True)

    format: int = CACHE_FORMAT
    model: str
    name: str
    content: str
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)


def canonical_json(value: Any) -> str:
    """Deterministic JSON text (sorted keys, no spaces) of a JSON-like value; used for hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def cache_key(
    *,
    model: str,
    json_mode: str,
    name: str,
    messages: Sequence[Mapping[str, Any]],
    schema: Mapping[str, Any],
    temperature: float,
    max_tokens: int,
) -> str:
    """The sha256 hex key of one judge request.

    Args:
        model: The judge model name sent to the endpoint.
        json_mode: The client's configured JSON mode (not the downgraded one, so keys stay stable across runs).
        name: The schema name of the call.
        messages: The caller's chat messages (before the client adds schema instructions).
        schema: The JSON schema requested.
        temperature: Sampling temperature.
        max_tokens: Completion budget of the call.

    Returns:
        64 lowercase hex characters.
    """
    request = {
        "messages": [dict(m) for m in messages],
        "schema": dict(schema),
        "temperature": float(temperature),
        "max_tokens": int(max_tokens),
    }
    material = "\n".join([model, json_mode, name, canonical_json(request)])
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


class JudgeCache:
    """A folder of cached judge answers. Safe to share between processes (atomic renames, last writer wins)."""

    def __init__(self, root: Path) -> None:
        """Use (and create when first written) the folder `root`."""
        self.root = Path(root)

    def path_for(self, key: str) -> Path:
        """Where the entry of `key` lives."""
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> CachedAnswer | None:
        """The cached answer of `key`, or None when absent, unreadable or corrupt (a corrupt entry is a miss)."""
        path = self.path_for(key)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # ValueError: not UTF-8
            logger.warning("judge cache entry %s unreadable (%s); treating as a miss", path.name, exc)
            return None
        try:
            entry = CachedAnswer.model_validate_json(raw)
        except ValidationError:
            logger.warning("judge cache entry %s is corrupt; treating as a miss", path.name)
            return None
        if entry.format != CACHE_FORMAT:
            return None
        return entry

    def generation(self) -> str | None:
        """The folder's generation now (None: unreadable). Take it before the request whose answer `put` stores."""
        return judge_cache_generation(self.root)

    def put(self, key: str, entry: CachedAnswer, *, generation: str | None | Literal[_Now.NOW] = NOW) -> bool:
        """Store `entry` under `key` atomically, if the folder's generation is still `generation`.

        Args:
            key: The request's cache key.
            entry: The answer.
            generation: What `generation()` returned before the request was sent. The entry is dropped when a clear
                has changed it since (or when either cannot be read): the answer may hold deleted data. `NOW`: the
                folder's generation as the write happens, for an entry no request produced.

        Returns:
            True when the entry was written; False when it was dropped, or the disk refused (logged): a cache write
            must never cost the caller its answer.
        """
        path = self.path_for(key)
        tmp_name: str | None = None
        try:
            if generation is None:
                logger.info("judge cache write of %s skipped: the cache's generation was unreadable", path.name)
                return False
            path.parent.mkdir(parents=True, exist_ok=True)
            # The temp file sits in the same folder so os.replace is an atomic rename on the same filesystem.
            with tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", dir=path.parent, prefix=f".{key[:8]}-", suffix=".tmp", delete=False
            ) as fh:
                tmp_name = fh.name
                fh.write(entry.model_dump_json())
                fh.flush()
                os.fsync(fh.fileno())
            with judge_cache_lock(self.root):  # a clear takes the same lock: it runs wholly before or after this
                now = judge_cache_generation(self.root)
                if now is None or (generation is not NOW and now != generation):
                    logger.info("judge cache write of %s skipped: the cache was cleared while the call ran", path.name)
                    _unlink(tmp_name)
                    return False
                os.replace(tmp_name, path)
            return True
        except OSError as exc:
            logger.warning("judge cache write of %s failed: %s", path.name, exc)
            if tmp_name is not None:
                _unlink(tmp_name)
            return False


def _unlink(name: str) -> None:
    """Remove a temporary file; one already gone (a clear removed it) or not removable is left to the next clear."""
    try:
        os.unlink(name)
    except OSError:
        pass
