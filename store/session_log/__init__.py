"""SQLite session log: research sessions written turn by turn as they happen (WAL, crash-safe), read back as records.

Every write is its own committed transaction, so a crash loses nothing already appended. `SessionLog` is composed of
one mixin per concern over a shared connection:

- `connection`: opening and migrating the file, transactions, error mapping, lifecycle (`SessionLogBase`);
- `codec`: storage encodings (token ids, logprobs, text, JSON, timestamps) and input checks;
- `sessions`: sessions, turns and tool calls, crash recovery, reads (`SessionSummary`);
- `judgements`: judgements, the unjudged queue and rubric buffers (`JudgementRecord`);
- `feedback`: user feedback (`FeedbackRecord`);
- `reflections`: reflection candidate batches (`ReflectionCandidate`, `ReflectionCandidateRecord`).
"""

from __future__ import annotations

from store.session_log.feedback import FEEDBACK_RATINGS, MAX_FEEDBACK_NOTE, FeedbackMixin, FeedbackRecord
from store.session_log.judgements import JudgementRecord, JudgementsMixin
from store.session_log.reflections import ReflectionCandidate, ReflectionCandidateRecord, ReflectionsMixin
from store.session_log.sessions import SessionsMixin, SessionSummary

__all__ = [
    "FEEDBACK_RATINGS",
    "MAX_FEEDBACK_NOTE",
    "FeedbackRecord",
    "JudgementRecord",
    "ReflectionCandidate",
    "ReflectionCandidateRecord",
    "SessionLog",
    "SessionSummary",
]


class SessionLog(SessionsMixin, JudgementsMixin, FeedbackMixin, ReflectionsMixin):
    """Append-as-you-go log of research sessions over one SQLite file.

    Safe to share between threads (one connection guarded by a lock; asyncio code calls it via `asyncio.to_thread`)
    and between processes (WAL mode plus `busy_timeout`). Each public write commits before it returns.
    """
