"""Token counts per session, read from the log (issue 36): what the policy read and sampled per stage, and what each
stored judgement says its judge calls used. Pricing them is `agent.accounting`'s job; this module only counts.

- Policy, per stage: the sampled turns (each one policy call that left a turn), the prompt tokens those calls read
  (`turns.prompt_tokens`, migration 0012) and the tokens they sampled (the turns' token ids). A sampled turn logged
  before migration 0012 has no prompt count; its call read the whole context so far (`SequenceWriter.context`: the
  rendered prompt plus every earlier turn), so the count is rebuilt from those token ids and the turn is counted in
  `reconstructed`. Samples the graph dropped and the clarify decision left no turn and are not counted.
- Judge, per judgement (failed attempts included, since their calls were billed too): the `usage` object the judge
  writes into its payload (`learning.judge.types.Usage`: calls, cached_calls, prompt_tokens, completion_tokens,
  cost_usd). A payload without one (a judge that crashed before answering) counts nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from store.db import json_number
from store.errors import InvalidInput
from store.records import STAGES, Stage
from store.session_log.connection import SessionLogBase

_CHUNK = 500  # ids per query: well under SQLite's and PostgreSQL's bound-parameter limits
_JUDGE_USAGE = ("calls", "cached_calls", "prompt_tokens", "completion_tokens", "cost_usd")


@dataclass(frozen=True, slots=True)
class StageTokens:
    """The policy's sampled turns of one stage of a session."""

    stage: Stage
    calls: int = 0  # sampled turns
    prompt_tokens: int = 0  # recorded at the call, or rebuilt from the context for `reconstructed` turns
    reconstructed: int = 0  # sampled turns logged without a prompt count (before migration 0012)
    sampled_tokens: int = 0


@dataclass(frozen=True, slots=True)
class JudgeTokens:
    """What one stored judgement of a session says its judge calls used."""

    judgement_id: int
    judge_model: str
    judge_kind: str  # "llm" | "offline"
    status: str  # "ok" | "failed"
    calls: int = 0
    cached_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    recorded_cost_usd: float | None = None  # the judge client's own figure (legacy per-judge prices), if any


@dataclass(frozen=True, slots=True)
class SessionTokens:
    """Every token count the log holds for one session."""

    session_id: str
    policy_model: str | None  # None for sessions logged before migration 0012
    stages: tuple[StageTokens, ...]  # one per stage, in STAGES order
    judgements: tuple[JudgeTokens, ...] = ()  # oldest first


def _int(value: object) -> int:
    """A stored count (PostgreSQL sums come back as Decimal; JSON may hold a float or nothing)."""
    if value is None or isinstance(value, bool):
        return 0
    try:
        return max(0, int(value))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def _float(value: object) -> float | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class UsageMixin(SessionLogBase):
    """Token counts of sessions, for the cost views (`agent.accounting.session_usage`)."""

    def token_counts(self, session_ids: Sequence[str]) -> dict[str, SessionTokens]:
        """The token counts of each of these sessions (unknown ids are left out of the answer).

        Reads aggregates only (no token ids leave the database): one query for the sessions, one for the turns
        grouped by stage, one for the judgements' usage, per 500 ids, in one read transaction per 500.

        Raises:
            InvalidInput: `session_ids` is a bare str or holds a non-str.
        """
        if isinstance(session_ids, str) or not all(isinstance(s, str) for s in session_ids):
            raise InvalidInput("session_ids must be a sequence of str ids")
        ids = list(dict.fromkeys(session_ids))
        found: dict[str, SessionTokens] = {}
        for start in range(0, len(ids), _CHUNK):
            found.update(self._token_counts(ids[start : start + _CHUNK]))
        return {sid: found[sid] for sid in ids if sid in found}

    def _token_counts(self, ids: list[str]) -> dict[str, SessionTokens]:
        marks = ", ".join("?" * len(ids))
        usage = ", ".join(json_number(self.backend, "payload_json", "usage", k) for k in _JUDGE_USAGE)
        with self._transaction("DEFERRED") as conn:
            sessions = conn.execute(
                f"SELECT session_id, policy_model FROM sessions WHERE session_id IN ({marks})", ids).fetchall()
            # LENGTH of a BLOB (SQLite) or BYTEA (PostgreSQL) is its size in bytes: 4 per int32 token id. `context`
            # is what a turn's call read: the prompt's ids and those of every earlier turn.
            turns = conn.execute(
                "SELECT session_id, stage, COUNT(*), SUM(COALESCE(prompt_tokens, context)), "
                "SUM(CASE WHEN prompt_tokens IS NULL THEN 1 ELSE 0 END), SUM(size) / 4 FROM ("
                "SELECT t.session_id, t.stage, t.kind, t.prompt_tokens, LENGTH(t.token_ids) AS size, "
                "(LENGTH(s.prompt_token_ids) + COALESCE(SUM(LENGTH(t.token_ids)) OVER (PARTITION BY t.session_id "
                "ORDER BY t.idx ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)) / 4 AS context "
                f"FROM turns t JOIN sessions s ON s.session_id = t.session_id WHERE t.session_id IN ({marks})"
                ") x WHERE kind = 'sampled' GROUP BY session_id, stage", ids).fetchall()
            judged = conn.execute(
                f"SELECT session_id, judgement_id, judge_model, judge_kind, status, {usage} FROM judgements "
                f"WHERE session_id IN ({marks}) ORDER BY judgement_id", ids).fetchall()
        stages: dict[str, dict[str, StageTokens]] = {}
        for sid, stage, calls, prompt, rebuilt, sampled in turns:
            stages.setdefault(sid, {})[stage] = StageTokens(
                stage=stage, calls=_int(calls), prompt_tokens=_int(prompt), reconstructed=_int(rebuilt),
                sampled_tokens=_int(sampled))
        judges: dict[str, list[JudgeTokens]] = {}
        for r in judged:
            judges.setdefault(r[0], []).append(JudgeTokens(
                judgement_id=int(r[1]), judge_model=str(r[2]), judge_kind=str(r[3]), status=str(r[4]),
                calls=_int(r[5]), cached_calls=_int(r[6]), prompt_tokens=_int(r[7]), completion_tokens=_int(r[8]),
                recorded_cost_usd=_float(r[9])))
        return {
            str(sid): SessionTokens(
                session_id=str(sid), policy_model=model,
                stages=tuple(stages.get(sid, {}).get(s, StageTokens(s)) for s in STAGES),
                judgements=tuple(judges.get(sid, ())))
            for sid, model in sessions
        }
