"""The session log: research sessions written turn by turn as they happen (crash-safe), read back as records, in a
SQLite file (WAL) or a PostgreSQL database (`store.db`).

Every write is its own committed transaction, so a crash loses nothing already appended. `SessionLog` is composed of
one mixin per concern over a shared database:

- `connection`: opening and migrating the database, transactions, lifecycle (`SessionLogBase`);
- `codec`: storage encodings (token ids, logprobs, text, JSON, timestamps) and input checks;
- `sessions`: sessions, turns and tool calls, leases and the crash sweep, reads (`SessionSummary`);
- `judgements`: judgements, the unjudged queue and rubric buffers (`JudgementRecord`);
- `feedback`: user feedback (`FeedbackRecord`);
- `reflections`: reflection candidate batches (`ReflectionCandidate`, `ReflectionCandidateRecord`);
- `usage`: token counts per session, policy per stage and judge per judgement (`SessionTokens`).
"""

from __future__ import annotations

from store.session_log.feedback import FEEDBACK_RATINGS, MAX_FEEDBACK_NOTE, FeedbackMixin, FeedbackRecord
from store.session_log.judgements import JudgementRecord, JudgementsMixin
from store.session_log.reflections import ReflectionCandidate, ReflectionCandidateRecord, ReflectionsMixin
from store.session_log.sessions import (
    DEFAULT_LEASE_S,
    LeaseSweep,
    SessionLease,
    SessionsMixin,
    SessionSummary,
    process_lease_owner,
)
from store.session_log.usage import JudgeTokens, SessionTokens, StageTokens, UsageMixin

__all__ = [
    "DEFAULT_LEASE_S",
    "FEEDBACK_RATINGS",
    "MAX_FEEDBACK_NOTE",
    "FeedbackRecord",
    "JudgeTokens",
    "JudgementRecord",
    "LeaseSweep",
    "ReflectionCandidate",
    "ReflectionCandidateRecord",
    "SessionLease",
    "SessionLog",
    "SessionSummary",
    "SessionTokens",
    "StageTokens",
    "process_lease_owner",
]


class SessionLog(SessionsMixin, JudgementsMixin, FeedbackMixin, ReflectionsMixin, UsageMixin):
    """Append-as-you-go log of research sessions over one SQLite file or one PostgreSQL database.

    Safe to share between threads (SQLite: one connection guarded by a lock; PostgreSQL: a connection pool; asyncio
    code calls it via `asyncio.to_thread`) and between processes and hosts (one writer at a time, waiting up to
    `busy_timeout`). Each public write commits before it returns.
    """
