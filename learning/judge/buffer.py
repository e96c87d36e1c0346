"""The per-question rubric buffer of the stagewise judge (METHOD §5.2 C.1, §12.2): persistent + capped active rubrics.

A `RubricBuffer` is immutable: `add`, `with_persistent` and `prune` return new buffers. It persists as JSON through a
`RubricBufferStore` (the SessionLog) keyed by the SHA-256 of the normalised question.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from learning.errors import LearningError
from learning.judge.types import Rubric, RubricBufferStore
from store.deletion import FEEDBACK_RUBRIC_TITLE
from store.errors import DeletedMeanwhile
from store.records import STAGES, Stage, question_sha, sha256_text

CAPS: Mapping[Stage, int] = MappingProxyType({"plan": 3, "research": 2, "review": 2, "answer": 3})
"""Active-rubric capacity per stage, C = (3, 2, 2, 3) (METHOD §5.2 C.1). Persistent rubrics do not count."""

RETIRED_KEEP = 200  # retired rubrics kept for the record (judgements refer to them by id); oldest dropped first
PAYLOAD_FORMAT = 1
_STAGE_PREFIX: Mapping[Stage, str] = MappingProxyType({"plan": "s1", "research": "s2", "review": "s3", "answer": "s4"})
_NON_WORD = re.compile(r"[^\w]+")
_log = logging.getLogger(__name__)


class BufferPayloadError(LearningError):
    """A stored rubric-buffer payload is not in the expected format."""


def normalise_title(title: str) -> str:
    """A rubric title for de-duplication: lower case, punctuation folded to spaces, whitespace collapsed."""
    return " ".join(_NON_WORD.sub(" ", title.lower()).split())


def rubric_id(stage: Stage, title: str, *, persistent: bool = False) -> str:
    """A stable id from the stage and the normalised title, e.g. "s2-1f0c3a9b2e" (persistent: "p4-...")."""
    prefix = "p4" if persistent else _STAGE_PREFIX[stage]
    return f"{prefix}-{sha256_text(stage + chr(0) + normalise_title(title))[:10]}"


def _variance(values: Sequence[int]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)  # population variance, like the std of D4


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What one `prune` did: rubric ids retired for zero variance, and ids pruned to respect the caps."""

    zero_variance: tuple[str, ...] = ()
    over_cap: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RubricBuffer:
    """Rubrics of one question: persistent (Answer stage, never pruned) and active per stage (capped).

    Attributes:
        question: The question as first seen.
        persistent: Ground-truth rubrics given with the question; Answer stage only.
        active: Adaptive rubrics per stage, oldest first (every stage key present). Treat as read-only.
        retired: Rubrics taken out of the active set (zero variance or over cap), newest last.
        version: The store's version of this buffer ("" when never saved; "mem-N" for a judge without a store).
        deletions_seen: The store's deletion epoch read before this buffer and the sessions judged with it were
            (None: not loaded from a store). A save after a deletion was recorded writes nothing (issue 46).
    """

    question: str
    persistent: tuple[Rubric, ...] = ()
    active: Mapping[Stage, tuple[Rubric, ...]] = field(default_factory=lambda: {s: () for s in STAGES})
    retired: tuple[Rubric, ...] = ()
    version: str = ""
    deletions_seen: int | None = field(default=None, compare=False)  # bookkeeping, not content

    @classmethod
    def empty(cls, question: str) -> RubricBuffer:
        """A buffer with no rubrics."""
        return cls(question=question)

    @property
    def key(self) -> str:
        """The store key (SHA-256 of the normalised question)."""
        return question_sha(self.question)

    def stage_rubrics(self, stage: Stage) -> tuple[Rubric, ...]:
        """Every rubric a trajectory is scored on for `stage`: persistent ones first (Answer only), then active."""
        extra = self.persistent if stage == "answer" else ()
        return extra + tuple(self.active.get(stage, ()))

    def all_rubrics(self) -> tuple[Rubric, ...]:
        """Persistent plus active rubrics, in stage order."""
        return tuple(r for s in STAGES for r in self.stage_rubrics(s))

    def size(self, stage: Stage) -> int:
        """Number of ACTIVE rubrics of a stage (what the cap bounds)."""
        return len(self.active.get(stage, ()))

    def _titles(self, stage: Stage) -> set[str]:
        return {normalise_title(r.title) for r in self.stage_rubrics(stage)}

    def with_persistent(self, rubrics: Iterable[Rubric]) -> RubricBuffer:
        """Add persistent rubrics (given with the question), skipping titles already present.

        Persistent rubrics are Answer-stage rubrics by definition (METHOD §5.2 C.1), so each is stored with
        stage="answer" and persistent=True whatever it said.
        """
        persistent = list(self.persistent)
        titles = {normalise_title(r.title) for r in persistent}
        ids = {r.id for r in persistent}
        for r in rubrics:
            norm = normalise_title(r.title)
            if not norm or norm in titles:
                continue
            rid = r.id if r.id and r.id not in ids else rubric_id("answer", r.title, persistent=True)
            persistent.append(r.model_copy(update={"stage": "answer", "persistent": True, "id": rid}))
            titles.add(norm)
            ids.add(rid)
        if len(persistent) == len(self.persistent):
            return self
        return replace(self, persistent=tuple(persistent))

    def add(self, rubrics: Iterable[Rubric]) -> tuple[RubricBuffer, tuple[Rubric, ...]]:
        """Add new active rubrics, skipping any whose normalised title its stage already has (including new ones).

        The buffer may go over its caps here; `prune` brings it back after the group is scored (METHOD: add, score,
        prune). A re-proposed title that had been retired becomes active again.

        Returns:
            (the new buffer, the rubrics actually added)
        """
        active = {s: list(self.active.get(s, ())) for s in STAGES}
        titles = {s: self._titles(s) for s in STAGES}
        added: list[Rubric] = []
        for r in rubrics:
            norm = normalise_title(r.title)
            if not norm or norm in titles[r.stage]:
                continue
            rubric = r.model_copy(update={"persistent": False}) if r.persistent else r
            active[r.stage].append(rubric)
            titles[r.stage].add(norm)
            added.append(rubric)
        if not added:
            return self, ()
        revived = {(r.stage, normalise_title(r.title)) for r in added}
        retired = tuple(r for r in self.retired if (r.stage, normalise_title(r.title)) not in revived)
        new = replace(self, active={s: tuple(v) for s, v in active.items()}, retired=retired)
        return new, tuple(added)

    def prune(
        self, scores: Mapping[str, Sequence[int | None]], caps: Mapping[Stage, int] = CAPS
    ) -> tuple[RubricBuffer, PruneResult]:
        """After scoring a group: retire zero-variance rubrics, then cut each stage over its cap.

        1. An active rubric with at least two valid scores across the group, all equal, does not discriminate and is
           retired (DR Tulu's zero-std rule).
        2. A stage still over its cap keeps the rubrics with the highest score variance across the group (METHOD
           §5.2 C.1: prune the lowest discrimination). A rubric with fewer than two valid scores has unknown variance
           and ranks below every known one; ties keep the newer rubric, so rubrics from an improved policy can
           displace stale ones.
        Persistent rubrics are never touched.

        Args:
            scores: rubric id -> its scores (0/1/2 or None for failed) over the group's trajectories.
            caps: per-stage capacity (default C = (3, 2, 2, 3)).

        Returns:
            (the new buffer, what was retired)
        """
        zero: list[Rubric] = []
        over: list[Rubric] = []
        active: dict[Stage, tuple[Rubric, ...]] = {}
        for stage in STAGES:
            kept: list[Rubric] = []
            for r in self.active.get(stage, ()):
                valid = [s for s in scores.get(r.id, ()) if s is not None]
                if len(valid) >= 2 and len(set(valid)) == 1:
                    zero.append(r)
                else:
                    kept.append(r)
            cap = max(0, caps.get(stage, 0))
            if len(kept) > cap:

                def rank(item: tuple[int, Rubric]) -> tuple[bool, float, int]:
                    position, rubric = item
                    valid = [s for s in scores.get(rubric.id, ()) if s is not None]
                    known = len(valid) >= 2
                    return (known, _variance(valid) if known else 0.0, position)

                ranked = sorted(enumerate(kept), key=rank, reverse=True)
                keep = {pos for pos, _ in ranked[:cap]}
                over.extend(r for pos, r in enumerate(kept) if pos not in keep)
                kept = [r for pos, r in enumerate(kept) if pos in keep]
            active[stage] = tuple(kept)
        if not zero and not over:
            return self, PruneResult()
        retired = (self.retired + tuple(zero) + tuple(over))[-RETIRED_KEEP:]
        new = replace(self, active=active, retired=retired)
        return new, PruneResult(tuple(r.id for r in zero), tuple(r.id for r in over))

    def to_payload(self) -> dict[str, Any]:
        """The JSON-ready form saved in the store (the version is the store's, not part of the payload)."""
        return {
            "format": PAYLOAD_FORMAT,
            "question": self.question,
            "persistent": [r.model_dump(mode="json") for r in self.persistent],
            "active": {s: [r.model_dump(mode="json") for r in self.active.get(s, ())] for s in STAGES},
            "retired": [r.model_dump(mode="json") for r in self.retired],
        }

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], version: str = "") -> RubricBuffer:
        """Rebuild a buffer from `to_payload()` output.

        Raises:
            BufferPayloadError: unknown format, missing keys or malformed rubrics.
        """
        if not isinstance(payload, Mapping) or payload.get("format") != PAYLOAD_FORMAT:
            raise BufferPayloadError(f"rubric buffer payload must be a mapping with format {PAYLOAD_FORMAT}")
        try:
            question = payload["question"]
            active_raw = payload.get("active", {})
            if not isinstance(question, str) or not isinstance(active_raw, Mapping):
                raise BufferPayloadError("rubric buffer payload: 'question' must be text and 'active' a mapping")
            unknown = set(active_raw) - set(STAGES)
            if unknown:
                raise BufferPayloadError(f"rubric buffer payload: unknown stages {sorted(unknown)}")
            persistent = tuple(Rubric.model_validate(r) for r in payload.get("persistent", []))
            active = {s: tuple(Rubric.model_validate(r) for r in active_raw.get(s, [])) for s in STAGES}
            retired = tuple(Rubric.model_validate(r) for r in payload.get("retired", []))
        except (KeyError, TypeError, ValidationError) as exc:
            raise BufferPayloadError(f"rubric buffer payload is malformed: {exc}") from exc
        for stage, rubrics in active.items():
            if any(r.stage != stage for r in rubrics):
                raise BufferPayloadError(f"rubric buffer payload: a rubric under {stage!r} names another stage")
        return cls(question=question, persistent=persistent, active=active, retired=retired, version=version)


def load_buffer(store: RubricBufferStore, question: str, deletions_seen: int | None = None) -> RubricBuffer:
    """The saved buffer of a question (version = the store's version), or an empty one.

    Rubrics made from feedback notes that judges saved in the shared buffer before issue 34 are left out: a note now
    judges only its giver's own sessions (`learning.judge.feedback`), handed over per group and never saved, so an
    old buffer must not go on applying one person's notes to everyone's sessions. The next save drops them for good.

    `deletions_seen`: the store's deletion epoch the caller read before it read the sessions to judge; None reads it
    now, before the buffer. `save_buffer` then refuses to save over a deletion made since (issue 46).

    Raises:
        BufferPayloadError: the stored payload is malformed.
    """
    seen = store.deletion_epoch() if deletions_seen is None else deletions_seen
    found = store.load_rubric_buffer(question_sha(question))
    if found is None:
        return replace(RubricBuffer.empty(question), deletions_seen=seen)
    payload, version = found
    buffer = RubricBuffer.from_payload(payload, version=str(version))
    shared = tuple(r for r in buffer.persistent if not r.title.startswith(FEEDBACK_RUBRIC_TITLE))
    return replace(buffer, persistent=shared, deletions_seen=seen)


def save_buffer(store: RubricBufferStore, buffer: RubricBuffer) -> RubricBuffer:
    """Save a buffer; returns it with the store's new version.

    Raises:
        DeletedMeanwhile: a deletion was recorded since the buffer's `deletions_seen` (nothing was written).
    """
    version = store.save_rubric_buffer(buffer.key, buffer.question, buffer.to_payload(),
                                       deletions_seen=buffer.deletions_seen)
    return replace(buffer, version=str(version))


def save_unless_deleted(store: RubricBufferStore, buffer: RubricBuffer) -> RubricBuffer:
    """`save_buffer`, except that a deletion made since the buffer was read wins: nothing is saved and the buffer
    comes back unsaved (version ""), for this round's judgements only; the next round starts from what is stored."""
    try:
        return save_buffer(store, buffer)
    except DeletedMeanwhile as exc:
        _log.warning("rubric buffer not saved: %s", exc)
        return replace(buffer, version="")
