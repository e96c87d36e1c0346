"""Reflection candidates (METHOD D9): each sampled batch with its judge scores, its banked winner, and read-back."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from store.errors import InvalidInput, SessionNotCompleted, SessionStateError
from store.records import FinishReason, PromptRecord, TokenSource
from store.session_log.codec import (
    FINISH_REASONS,
    TOKEN_SOURCES,
    choice_in,
    label_in,
    opt_text_in,
    opt_text_out,
    pack_floats,
    pack_ids,
    text_in,
    text_out,
    unpack_floats,
    unpack_ids,
)
from store.session_log.connection import SessionLogBase


@dataclass(frozen=True, slots=True)
class ReflectionCandidate:
    """One sampled reflection candidate with its judge scores, as handed to `SessionLog.record_reflection_batch`.

    `text`, `token_ids` and `logprobs` are exactly what the policy sampled (`text` spells `token_ids`). `forced_suffix`
    was appended afterwards and never sampled (the closing tag a server dropped), so the trainer gives it no gradient;
    the candidate as validated and judged is `full_text`. Scores are None when invalid or when the judge failed.
    """

    index: int  # position in the batch, 0..m-1
    text: str
    token_ids: tuple[int, ...]
    policy_version: str  # the adapter that sampled it, e.g. "policy@17"
    logprobs: tuple[float, ...] = ()  # one per token id, or empty when the server returned none
    finish_reason: FinishReason = "stop"
    token_source: TokenSource = "server"
    forced_suffix: str = ""
    seed: int | None = None  # the sampling seed of this candidate (None when unseeded)
    valid: bool = False
    validity_error: str | None = None
    diagnostic_accuracy: float | None = None
    specificity: float | None = None
    scope_balance: float | None = None
    u_within: float | None = None
    u_cross: float | None = None
    u: float | None = None
    justification: str = ""
    judge_error: str | None = None

    @property
    def full_text(self) -> str:
        """The candidate as validated, judged and banked: the sampled text plus any forced suffix."""
        return self.text + self.forced_suffix


@dataclass(frozen=True, slots=True)
class ReflectionCandidateRecord:
    """One stored reflection candidate with its batch context, as read back (trainer input, METHOD D9)."""

    batch_id: str
    session_id: str
    prompt: PromptRecord  # the rendered reflection prompt; prompt_sha hashes its templates
    temperature: float
    max_tokens: int
    judge_model: str
    candidate: ReflectionCandidate
    accepted: bool  # written to the bank when its batch ran (a later item for the same question may replace it)
    bank_item_id: str | None
    created_at: str


_SCORE_FIELDS = ("diagnostic_accuracy", "specificity", "scope_balance", "u_within", "u_cross", "u")


def _opt_unit(value: object, what: str) -> float | None:
    """A score in [0, 1] or None (bools are not scores)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be a number in [0, 1] or None, got {value!r:.80}")
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise InvalidInput(f"{what} must be in [0, 1], got {number}")
    return number


def _opt_int(value: object, what: str, *, low: int | None = None) -> int | None:
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, int) or (low is not None and value < low)
            or not -(2**63) <= value < 2**63):  # SQLite INTEGER (PostgreSQL BIGINT) is 64-bit
        raise InvalidInput(f"{what} must be an int{'' if low is None else f' >= {low}'}, got {value!r:.80}")
    return value


def _candidate_row(candidate: object) -> tuple[object, ...]:
    """Validate and encode one candidate, in the column order of the INSERT in `record_reflection_batch`."""
    if not isinstance(candidate, ReflectionCandidate):
        raise InvalidInput(f"expected a ReflectionCandidate, got {type(candidate).__name__}")
    c = candidate
    what = f"reflection candidate {c.index!r:.20}"
    index = _opt_int(c.index, "reflection candidate index", low=0)
    if index is None:
        raise InvalidInput("reflection candidate index must be an int >= 0, got None")
    ids = pack_ids(c.token_ids, what)
    logprobs = pack_floats(c.logprobs, what)
    if logprobs and len(logprobs) // 8 != len(ids) // 4:
        raise InvalidInput(f"{what}: logprobs must be empty or one per token id")
    if not isinstance(c.valid, bool):
        raise InvalidInput(f"{what}: valid must be a bool, got {c.valid!r:.40}")
    scores = [_opt_unit(getattr(c, name), f"{what}: {name}") for name in _SCORE_FIELDS]
    if c.valid and c.validity_error is not None:
        raise InvalidInput(f"{what}: a valid candidate has no validity_error")
    if not c.valid:
        if not isinstance(c.validity_error, str) or not c.validity_error:
            raise InvalidInput(f"{what}: an invalid candidate needs its validity_error")
        if any(score is not None for score in scores):
            raise InvalidInput(f"{what}: an invalid candidate is never scored")
    return (
        index,
        label_in(c.policy_version, f"{what}: policy_version"),
        text_in(c.text, f"{what}: text"),
        text_in(c.forced_suffix, f"{what}: forced_suffix"),
        _opt_int(c.seed, f"{what}: seed"),
        ids,
        logprobs,
        choice_in(c.token_source, TOKEN_SOURCES, f"{what}: token_source"),
        choice_in(c.finish_reason, FINISH_REASONS, f"{what}: finish_reason"),
        int(c.valid),
        opt_text_in(c.validity_error, f"{what}: validity_error"),
        *scores,
        text_in(c.justification, f"{what}: justification"),
        opt_text_in(c.judge_error, f"{what}: judge_error"),
    )


class ReflectionsMixin(SessionLogBase):
    """Reflection batches on judged sessions: stored in one transaction, one candidate per batch accepted."""

    def record_reflection_batch(
        self,
        session_id: str,
        candidates: Sequence[ReflectionCandidate],
        *,
        prompt: PromptRecord,
        judge_model: str,
        temperature: float,
        max_tokens: int,
        batch_id: str | None = None,
    ) -> str:
        """Store every candidate of one reflection run on a session, all in ONE transaction.

        Either the whole batch is written or nothing is: a bad value anywhere (found while encoding, or rejected by
        the database part-way through, e.g. two candidates with the same index) leaves the log as it was.

        Args:
            session_id: A completed session with at least one "ok" judgement (reflections come only from judged,
                completed sessions; METHOD §6.2).
            candidates: The m candidates with their scores; indices unique.
            prompt: The rendered reflection prompt the candidates continue (text, exact token ids, template hash).
            judge_model: The reflection judge that scored them.
            temperature: Sampling temperature (the trainer needs it to compare behaviour logprobs).
            max_tokens: The sampling cap.
            batch_id: The id to use; a uuid4 hex is generated when None.

        Returns:
            The batch id.

        Raises:
            InvalidInput: A value cannot be stored, no candidates, or duplicate indices (nothing was written).
            SessionNotFound: Unknown session.
            SessionNotCompleted: The session is running or failed.
            SessionStateError: The session is completed but has no "ok" judgement.
        """
        bid = uuid.uuid4().hex if batch_id is None else label_in(batch_id, "batch_id")
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence) or not candidates:
            raise InvalidInput("candidates must be a non-empty sequence of ReflectionCandidate")
        if not isinstance(prompt, PromptRecord):
            raise InvalidInput(f"prompt must be a PromptRecord, got {type(prompt).__name__}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0
        ):
            raise InvalidInput(f"temperature must be a finite number >= 0, got {temperature!r:.40}")
        batch = (
            text_in(prompt.text, "prompt.text"),
            pack_ids(prompt.token_ids, "prompt"),
            label_in(prompt.prompt_sha, "prompt.prompt_sha", allow_empty=True),
            float(temperature),
            _opt_int(max_tokens, "max_tokens", low=1),
        )
        if batch[-1] is None:
            raise InvalidInput("max_tokens must be an int >= 1, got None")
        model = label_in(judge_model, "judge_model")
        rows = [_candidate_row(c) for c in candidates]  # validate and encode everything before taking the lock
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            current = self._status(conn, session_id)
            if current != "completed":
                raise SessionNotCompleted(session_id, current, "record reflections")
            if not conn.execute(
                "SELECT 1 FROM judgements WHERE session_id = ? AND status = 'ok' LIMIT 1", (session_id,)
            ).fetchone():
                raise SessionStateError(session_id, "completed but not judged", "record reflections")
            if conn.execute("SELECT 1 FROM reflection_candidates WHERE batch_id = ? LIMIT 1", (bid,)).fetchone():
                raise InvalidInput(f"reflection batch {bid!r} already exists")
            conn.executemany(
                "INSERT INTO reflection_candidates (batch_id, session_id, prompt_text, prompt_token_ids, prompt_sha, "
                "temperature, max_tokens, candidate, policy_version, text, forced_suffix, seed, token_ids, logprobs, "
                "token_source, finish_reason, valid, validity_error, diagnostic_accuracy, specificity, scope_balance, "
                "u_within, u_cross, u, justification, judge_error, judge_model, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(bid, session_id, *batch, *row, model, now) for row in rows],
            )
        return bid

    def mark_reflection_accepted(self, batch_id: str, candidate: int, bank_item_id: str) -> None:
        """Record that a candidate was written to the rubric bank as `bank_item_id`.

        Marking the same candidate again with the same item id is a no-op.

        Raises:
            InvalidInput: No such candidate, it is invalid or unscored, another candidate of the batch is already
                accepted, or it is already accepted under another item id (nothing was written).
        """
        bid = label_in(batch_id, "batch_id")
        index = _opt_int(candidate, "candidate", low=0)
        if index is None:
            raise InvalidInput("candidate must be an int >= 0, got None")
        item = label_in(bank_item_id, "bank_item_id")
        with self._transaction("IMMEDIATE") as conn:
            row = conn.execute(
                "SELECT valid, u, accepted, bank_item_id FROM reflection_candidates "
                "WHERE batch_id = ? AND candidate = ?",
                (bid, index),
            ).fetchone()
            if row is None:
                raise InvalidInput(f"no reflection candidate {index} in batch {bid!r}")
            valid, u, accepted, current = row
            if not valid or u is None:
                raise InvalidInput(f"candidate {index} of batch {bid!r} is invalid or unscored; it cannot be banked")
            if accepted:
                if current == item:
                    return
                raise InvalidInput(f"candidate {index} of batch {bid!r} is already accepted as {current!r}")
            other = conn.execute(
                "SELECT candidate FROM reflection_candidates WHERE batch_id = ? AND accepted = 1", (bid,)
            ).fetchone()
            if other is not None:
                raise InvalidInput(f"batch {bid!r} already has an accepted candidate ({other[0]})")
            conn.execute(
                "UPDATE reflection_candidates SET accepted = 1, bank_item_id = ? WHERE batch_id = ? AND candidate = ?",
                (item, bid, index),
            )

    def reflection_candidates(
        self, session_id: str | None = None, batch_id: str | None = None
    ) -> list[ReflectionCandidateRecord]:
        """Stored reflection candidates, oldest batch first and by index within a batch; token data exact.

        Args:
            session_id: Only this session's candidates (None: every session).
            batch_id: Only this batch (None: every batch). Both filters combine.

        Raises:
            SessionNotFound: `session_id` is given and unknown.
            InvalidInput: A filter is not a valid id.
        """
        where: list[str] = []
        params: list[str] = []
        if session_id is not None:
            where.append("session_id = ?")
            params.append(label_in(session_id, "session_id"))
        if batch_id is not None:
            where.append("batch_id = ?")
            params.append(label_in(batch_id, "batch_id"))
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        with self._transaction("DEFERRED") as conn:
            if session_id is not None:
                self._status(conn, session_id)
            rows = conn.execute(
                "SELECT batch_id, session_id, policy_version, prompt_text, prompt_token_ids, prompt_sha, temperature, "
                "max_tokens, judge_model, accepted, bank_item_id, created_at, candidate, text, forced_suffix, seed, "
                "token_ids, logprobs, token_source, finish_reason, valid, validity_error, diagnostic_accuracy, "
                "specificity, scope_balance, u_within, u_cross, u, justification, judge_error "
                f"FROM reflection_candidates {clause}ORDER BY created_at, batch_id, candidate",
                params,
            ).fetchall()
        return [
            ReflectionCandidateRecord(
                batch_id=r[0], session_id=r[1],
                prompt=PromptRecord(text=text_out(r[3]), token_ids=unpack_ids(r[4]), prompt_sha=r[5]),
                temperature=float(r[6]), max_tokens=int(r[7]), judge_model=r[8], accepted=bool(r[9]),
                bank_item_id=r[10], created_at=r[11],
                candidate=ReflectionCandidate(
                    index=int(r[12]), policy_version=r[2], text=text_out(r[13]), forced_suffix=text_out(r[14]),
                    seed=r[15],
                    token_ids=unpack_ids(r[16]), logprobs=unpack_floats(r[17]), token_source=r[18],
                    finish_reason=r[19], valid=bool(r[20]), validity_error=opt_text_out(r[21]),
                    diagnostic_accuracy=r[22], specificity=r[23], scope_balance=r[24], u_within=r[25],
                    u_cross=r[26], u=r[27], justification=text_out(r[28]), judge_error=opt_text_out(r[29]),
                ),
            )
            for r in rows
        ]

    def sessions_without_reflection(self, limit: int | None = None) -> list[str]:
        """Ids of completed sessions with an "ok" judgement and no reflection batch yet, oldest completion first.

        Sessions with a training opt-out (a user's choice, benchmark runs, gate probes) or of a person who does not
        consent to learning are never reflected.

        A batch counts whatever its outcome (a batch whose judge failed is stored too), so a session is offered once.

        Raises:
            InvalidInput: `limit` < 1.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidInput(f"limit must be None or an int >= 1, got {limit!r}")
        learnable, consent = self.learnable_sql("s")
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                f"SELECT s.session_id FROM sessions s WHERE s.status = 'completed' AND {learnable} "
                "AND EXISTS (SELECT 1 FROM judgements j WHERE j.session_id = s.session_id AND j.status = 'ok') "
                "AND NOT EXISTS (SELECT 1 FROM reflection_candidates c WHERE c.session_id = s.session_id) "
                f"ORDER BY s.finished_at, s.rowid{'' if limit is None else ' LIMIT ?'}",
                (*consent, *(() if limit is None else (limit,))),
            ).fetchall()
        return [str(r[0]) for r in rows]
