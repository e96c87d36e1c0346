"""On-disk cache of valid judge answers, keyed by a hash of the model, the request and the JSON mode.

One small JSON file per answer under `<root>/<key[:2]>/<key>.json`, written atomically (temp file + rename) so a crash
or a concurrent writer never leaves a half-written entry; an unreadable entry is treated as a miss and overwritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the entry layout changes; older entries then read as misses


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

    def put(self, key: str, entry: CachedAnswer) -> bool:
        """Store `entry` under `key` atomically. Returns False (and logs) if the disk refused: a cache write must
        never cost the caller its answer."""
        path = self.path_for(key)
        tmp_name: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # The temp file sits in the same folder so os.replace is an atomic rename on the same filesystem.
            with tempfile.NamedTemporaryFile(
                "w", encoding="utf-8", dir=path.parent, prefix=f".{key[:8]}-", suffix=".tmp", delete=False
            ) as fh:
                tmp_name = fh.name
                fh.write(entry.model_dump_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp_name, path)
            return True
        except OSError as exc:
            logger.warning("judge cache write of %s failed: %s", path.name, exc)
            if tmp_name is not None:
                try:
                    os.unlink(tmp_name)
                except OSError:
                    pass
            return False
