"""Tool-call and snippet ids (METHOD D2).

Call ids are 8 lowercase hex characters unique per trajectory; snippet ids are `{call_id}-{index}`, so a
`<cite id=...>` resolves to exactly one retrieved snippet.
"""

from __future__ import annotations

import random
import re
import uuid

CALL_ID_RE = re.compile(r"^[0-9a-f]{8}$")
SNIPPET_ID_RE = re.compile(r"^([0-9a-f]{8})-(0|[1-9][0-9]*)$")


def snippet_id(call_id: str, index: int) -> str:
    """The id of result `index` (from 0) of call `call_id`."""
    if not CALL_ID_RE.match(call_id):
        raise ValueError(f"call id must be 8 lowercase hex characters, got {call_id!r}")
    if index < 0:
        raise ValueError("snippet index must be >= 0")
    return f"{call_id}-{index}"


def is_snippet_id(text: str) -> bool:
    """Whether `text` has the `{call_id}-{index}` form."""
    return SNIPPET_ID_RE.match(text) is not None


class CallIdFactory:
    """Issues call ids for ONE trajectory, never the same id twice.

    Random by default (first 8 hex characters of a uuid4, as DR Tulu does); pass `seed` for a reproducible
    sequence, or use `CounterCallIds` for readable ids in tests.
    """

    def __init__(self, seed: int | None = None) -> None:
        """Start a fresh id space; `seed` makes the sequence reproducible."""
        self._rng = random.Random(seed) if seed is not None else None
        self._issued: set[str] = set()

    def _candidate(self) -> str:
        if self._rng is None:
            return uuid.uuid4().hex[:8]
        return f"{self._rng.getrandbits(32):08x}"

    def __call__(self) -> str:
        """A new call id, distinct from every id this factory issued before."""
        while True:  # a collision among 2**32 values is rare; just draw again
            cid = self._candidate()
            if cid not in self._issued:
                self._issued.add(cid)
                return cid

    @property
    def issued(self) -> frozenset[str]:
        """Every id issued so far."""
        return frozenset(self._issued)


class CounterCallIds(CallIdFactory):
    """Deterministic call ids 00000000, 00000001, ... (tests and golden files)."""

    def __init__(self, start: int = 0) -> None:
        """Count from `start`."""
        super().__init__()
        self._next = start

    def _candidate(self) -> str:
        cid = f"{self._next % 2**32:08x}"
        self._next += 1
        return cid
