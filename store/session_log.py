"""SQLite session log: research sessions written turn by turn as they happen (WAL, crash-safe), read back as records.

Every write is its own committed transaction, so a crash loses nothing already appended. Storage encodings:
token ids are little-endian int32 BLOBs and logprobs little-endian float64 BLOBs (exact, NaN payloads included);
options, metrics, attrs and judge payloads are JSON text; timestamps are fixed-width UTC ISO-8601 strings.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import sys
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, get_args

from store.errors import (
    DuplicateSession,
    InvalidInput,
    SessionNotCompleted,
    SessionNotFound,
    SessionNotRunning,
    SessionStateError,
    StorageError,
    StoreBusy,
    StoreClosed,
)
from store.migrations import apply_migrations
from store.records import (
    STAGES,
    FinishReason,
    PromptRecord,
    SessionRecord,
    SessionStatus,
    Snippet,
    TokenSource,
    ToolCallRecord,
    Trajectory,
    Turn,
    TurnKind,
    normalise_question,
)

__all__ = ["FeedbackRecord", "ReflectionCandidate", "ReflectionCandidateRecord", "SessionLog", "SessionSummary"]

_STATUSES: tuple[str, ...] = get_args(SessionStatus)
_KINDS: tuple[str, ...] = get_args(TurnKind)
_SOURCES: tuple[str, ...] = get_args(TokenSource)
_FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)
_MAX_ID_LEN = 200
_INT32_MAX = 2**31 - 1
# array's "i" is a C int; pick whichever typecode is 4 bytes here so the on-disk format is the same everywhere.
_I32 = next(code for code in ("i", "l") if array(code).itemsize == 4)
_BIG_ENDIAN = sys.byteorder == "big"
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_STALE_ERROR = "marked failed by crash recovery: still 'running' with no write for longer than {older_than}"
FEEDBACK_RATINGS: tuple[str, ...] = ("up", "down")
MAX_FEEDBACK_NOTE = 2000  # characters, after stripping


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One row of `list_sessions`: enough for a listing, without turns or token data."""

    session_id: str
    question: str
    status: SessionStatus
    created_at: str
    finished_at: str | None
    policy_version: str
    n_turns: int
    n_tool_calls: int
    malformed: bool
    error: str | None


@dataclass(frozen=True, slots=True)
class JudgementRecord:
    """One stored judgement (or recorded judging failure) of a session."""

    judgement_id: int
    session_id: str
    judge_model: str
    payload: dict[str, Any]
    status: str  # "ok" | "failed"
    error: str | None
    judge_kind: str
    rubric_version: str
    created_at: str


@dataclass(frozen=True, slots=True)
class FeedbackRecord:
    """One piece of user feedback on a session's answer: a thumbs up/down and/or a note."""

    feedback_id: int
    session_id: str
    question: str  # the session's question, verbatim
    rating: Literal["up", "down"] | None
    note: str  # stripped; "" when only a rating was given
    created_at: str


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


_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


# --- encoding helpers -------------------------------------------------------------------------------------------


def _pack_ids(ids: Sequence[int], what: str) -> bytes:
    try:
        arr = array(_I32, ids)
    except (OverflowError, TypeError) as exc:
        raise InvalidInput(f"{what}: token ids must be integers in [0, 2**31): {exc}") from exc
    if arr and min(arr) < 0:
        raise InvalidInput(f"{what}: token ids must be integers in [0, 2**31); got {min(arr)}")
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def _unpack_ids(blob: bytes) -> tuple[int, ...]:
    arr = array(_I32)
    arr.frombytes(blob)
    if _BIG_ENDIAN:
        arr.byteswap()
    return tuple(arr)


def _pack_floats(values: Sequence[float], what: str) -> bytes:
    try:
        arr = array("d", values)
    except TypeError as exc:
        raise InvalidInput(f"{what}: logprobs must be floats: {exc}") from exc
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tobytes()


def _unpack_floats(blob: bytes) -> tuple[float, ...]:
    arr = array("d")
    arr.frombytes(blob)
    if _BIG_ENDIAN:
        arr.byteswap()
    return tuple(arr)


def _text_in(value: object, what: str) -> str | bytes:
    """Free text goes in as TEXT; a str with lone surrogates (not valid Unicode) as a UTF-8 BLOB, so nothing is lost."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")
    return value


def _text_out(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _opt_text_in(value: object, what: str) -> str | bytes | None:
    return None if value is None else _text_in(value, what)


def _opt_text_out(value: str | bytes | None) -> str | None:
    return None if value is None else _text_out(value)


def _label_in(value: object, what: str, *, allow_empty: bool = False) -> str:
    """Identifiers (ids, versions, hashes, model names): short valid-Unicode str, non-empty unless allowed."""
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > _MAX_ID_LEN:
        raise InvalidInput(f"{what} must be a non-empty str of at most {_MAX_ID_LEN} characters, got {value!r:.80}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} is not valid Unicode: {value!r:.80}") from exc
    return value


def _json_in(value: object, what: str) -> str:
    # ASCII-escaped, so any str (lone surrogates included) survives; NaN/inf rejected because they are not JSON.
    try:
        return json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"{what} must be JSON-serialisable (str keys, no NaN/inf): {exc}") from exc


def _mapping_in(value: object, what: str) -> str:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{what} must be a mapping, got {type(value).__name__}")
    return _json_in(dict(value), what)


def _choice(value: object, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise InvalidInput(f"{what} must be one of {allowed}, got {value!r:.80}")
    return value


def _iso(moment: datetime) -> str:
    """Fixed-width UTC ISO-8601 (naive datetimes are taken as UTC), so that text order is time order."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


@dataclass(frozen=True, slots=True)
class _TurnRow:
    stage: str
    kind: str
    text: str | bytes
    token_ids: bytes
    logprobs: bytes
    policy_version: str
    prompt_sha: str
    token_source: str
    finish_reason: str | None


def _turn_row(turn: object) -> _TurnRow:
    if not isinstance(turn, Turn):
        raise InvalidInput(f"expected a Turn, got {type(turn).__name__}")
    ids = _pack_ids(turn.token_ids, "turn")
    logprobs = _pack_floats(turn.logprobs, "turn")
    # Turn checks alignment in __post_init__, but a store must not trust that the caller did not bypass it.
    if logprobs and len(logprobs) // 8 != len(ids) // 4:
        raise InvalidInput("turn: logprobs must be empty or one per token id")
    return _TurnRow(
        stage=_choice(turn.stage, STAGES, "turn.stage"),
        kind=_choice(turn.kind, _KINDS, "turn.kind"),
        text=_text_in(turn.text, "turn.text"),
        token_ids=ids,
        logprobs=logprobs,
        policy_version=_label_in(turn.policy_version, "turn.policy_version"),
        prompt_sha=_label_in(turn.prompt_sha, "turn.prompt_sha", allow_empty=True),
        token_source=_choice(turn.token_source, _SOURCES, "turn.token_source"),
        finish_reason=None if turn.finish_reason is None else _choice(
            turn.finish_reason, _FINISH_REASONS, "turn.finish_reason"),
    )


@dataclass(frozen=True, slots=True)
class _CallRow:
    tool: str | bytes
    query: str | bytes
    attrs_json: str
    error: str | bytes | None
    seconds: float
    snippets: tuple[tuple[str | bytes, str | bytes, str | bytes, str | bytes, str | bytes], ...]


def _call_row(call: object) -> _CallRow:
    if not isinstance(call, ToolCallRecord):
        raise InvalidInput(f"expected a ToolCallRecord, got {type(call).__name__}")
    if not isinstance(call.attrs, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in call.attrs.items()
    ):
        raise InvalidInput("tool call attrs must map str to str")
    try:
        seconds = float(call.seconds)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"tool call seconds must be a number: {exc}") from exc
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"tool call seconds must be finite and >= 0, got {seconds}")
    snippets = []
    for snippet in call.snippets:
        if not isinstance(snippet, Snippet):
            raise InvalidInput(f"expected a Snippet, got {type(snippet).__name__}")
        snippets.append((
            _text_in(snippet.id, "snippet.id"), _text_in(snippet.tool, "snippet.tool"),
            _text_in(snippet.title, "snippet.title"), _text_in(snippet.text, "snippet.text"),
            _text_in(snippet.url, "snippet.url"),
        ))
    return _CallRow(
        tool=_text_in(call.tool, "tool call tool"),
        query=_text_in(call.query, "tool call query"),
        attrs_json=_json_in(dict(call.attrs), "tool call attrs"),
        error=_opt_text_in(call.error, "tool call error"),
        seconds=seconds,
        snippets=tuple(snippets),
    )


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
            or not -(2**63) <= value < 2**63):  # SQLite INTEGER is 64-bit
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
    ids = _pack_ids(c.token_ids, what)
    logprobs = _pack_floats(c.logprobs, what)
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
        _label_in(c.policy_version, f"{what}: policy_version"),
        _text_in(c.text, f"{what}: text"),
        _text_in(c.forced_suffix, f"{what}: forced_suffix"),
        _opt_int(c.seed, f"{what}: seed"),
        ids,
        logprobs,
        _choice(c.token_source, _SOURCES, f"{what}: token_source"),
        _choice(c.finish_reason, _FINISH_REASONS, f"{what}: finish_reason"),
        int(c.valid),
        _opt_text_in(c.validity_error, f"{what}: validity_error"),
        *scores,
        _text_in(c.justification, f"{what}: justification"),
        _opt_text_in(c.judge_error, f"{what}: judge_error"),
    )


@contextmanager
def _mapped_errors() -> Iterator[None]:
    """Translate sqlite3 exceptions into the store hierarchy, by type and SQLite error code."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        raise InvalidInput(f"the database rejected the value: {exc}") from exc
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED):
            raise StoreBusy(f"the session log stayed locked past busy_timeout: {exc}") from exc
        raise StorageError(f"SQLite error: {exc}") from exc


def _feedback_record(row: Sequence[Any]) -> FeedbackRecord:
    return FeedbackRecord(feedback_id=int(row[0]), session_id=row[1], question=_text_out(row[2]), rating=row[3],
                          note=_text_out(row[4]), created_at=row[5])


# --- the log ----------------------------------------------------------------------------------------------------


class SessionLog:
    """Append-as-you-go log of research sessions over one SQLite file.

    Safe to share between threads (one connection guarded by a lock; asyncio code calls it via `asyncio.to_thread`)
    and between processes (WAL mode plus `busy_timeout`). Each public write commits before it returns.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        busy_timeout_s: float = 10.0,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """Open (creating the parent folder and the file if needed) and migrate the database.

        Args:
            path: The SQLite file, e.g. `StoreConfig().sqlite_path`.
            busy_timeout_s: How long a write waits for another process's lock before `StoreBusy`.
            synchronous: FULL (default) fsyncs every commit, so even an OS crash keeps every appended turn; NORMAL
                is faster and still survives a crash of the process.
            clock: Returns "now" (tests pass a fixed clock); defaults to the UTC wall clock.

        Raises:
            StorageError: The file cannot be opened, is not a database, or cannot use WAL mode.
            MigrationError: The schema could not be brought up to date.
        """
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidInput(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self._path = Path(path)
        self._busy_ms = max(0, int(busy_timeout_s * 1000))
        self._synchronous = synchronous
        self._clock = clock if clock is not None else (lambda: datetime.now(UTC))
        self._lock = threading.Lock()
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the folder for {self._path}: {exc}") from exc
        self._conn: sqlite3.Connection | None = self._connect()
        self._pid = os.getpid()
        try:
            apply_migrations(self._conn)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _connect(self) -> sqlite3.Connection:
        with _mapped_errors():
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so every write is exactly one transaction.
            conn = sqlite3.connect(
                self._path, timeout=self._busy_ms / 1000, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
                mode = self._enable_wal(conn)
                if str(mode).lower() != "wal":
                    raise StorageError(f"{self._path} cannot use WAL mode (journal_mode={mode}); use a local disk")
                conn.execute("PRAGMA foreign_keys = ON")
                conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            except BaseException:
                conn.close()
                raise
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> str:
        """Switch to WAL, retrying while another connection holds the lock.

        Changing the journal mode needs an exclusive lock and SQLite does not call the busy handler for it, so
        several processes opening a new database at once would otherwise fail at once with "database is locked".
        """
        deadline = time.monotonic() + self._busy_ms / 1000
        while True:
            try:
                return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", None) not in _BUSY_CODES or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    # -- plumbing --

    def _live(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreClosed()
        if self._pid != os.getpid():
            # A forked child must not touch the parent's connection (SQLite forbids it); open its own. The
            # inherited handle is deliberately not closed: closing it could disturb the parent's locks.
            self._conn = self._connect()
            self._pid = os.getpid()
        return self._conn

    @contextmanager
    def _transaction(self, mode: Literal["DEFERRED", "IMMEDIATE"]) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE for writes: take the write lock up front (waiting up to busy_timeout) instead of failing on a
        # read-to-write upgrade. DEFERRED for reads: one consistent snapshot across several SELECTs.
        with self._lock, _mapped_errors():
            conn = self._live()
            conn.execute(f"BEGIN {mode}")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def transaction(self, write: bool) -> AbstractContextManager[sqlite3.Connection]:
        """A transaction on this database for stores that share the file (the policy registry): IMMEDIATE when
        `write`, else DEFERRED; sqlite errors come out as store errors."""
        return self._transaction("IMMEDIATE" if write else "DEFERRED")

    def now(self) -> str:
        """The log's clock as an ISO-8601 UTC string."""
        return _iso(self._clock())

    def _now(self) -> str:
        return _iso(self._clock())

    @staticmethod
    def _status(conn: sqlite3.Connection, session_id: str) -> str:
        row = conn.execute("SELECT status FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        return str(row[0])

    def _require_running(self, conn: sqlite3.Connection, session_id: str, action: str) -> None:
        status = self._status(conn, session_id)
        if status != "running":
            raise SessionNotRunning(session_id, status, action)

    # -- writes --

    def create_session(
        self,
        question: str,
        prompt: PromptRecord,
        options: Mapping[str, object],
        policy_version: str,
        session_id: str | None = None,
    ) -> str:
        """Start a session with status "running".

        Args:
            question: The user's question, verbatim.
            prompt: The rendered prompt the assistant sequence continues.
            options: The run options as JSON-serialisable data, e.g. `RunOptions.model_dump(mode="json")`; never
                secrets. Read back as plain JSON (tuples become lists).
            policy_version: The adapter serving this run, e.g. "policy@17".
            session_id: The id to use; a uuid4 hex is generated when None.

        Returns:
            The session id.

        Raises:
            InvalidInput: A value cannot be stored (nothing was written).
            DuplicateSession: `session_id` is already taken.
        """
        sid = uuid.uuid4().hex if session_id is None else _label_in(session_id, "session_id")
        if not isinstance(prompt, PromptRecord):
            raise InvalidInput(f"prompt must be a PromptRecord, got {type(prompt).__name__}")
        values = (
            sid, _text_in(question, "question"), _label_in(policy_version, "policy_version"),
            _mapping_in(options, "options"), _text_in(prompt.text, "prompt.text"),
            _pack_ids(prompt.token_ids, "prompt"), _label_in(prompt.prompt_sha, "prompt.prompt_sha", allow_empty=True),
        )
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            if conn.execute("SELECT 1 FROM sessions WHERE session_id = ?", (sid,)).fetchone():
                raise DuplicateSession(sid)
            conn.execute(
                "INSERT INTO sessions (session_id, question, policy_version, options_json, prompt_text, "
                "prompt_token_ids, prompt_sha, status, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (*values, now, now),
            )
        return sid

    def append_turn(self, session_id: str, turn: Turn) -> int:
        """Append the next turn of a running session and commit it at once.

        Args:
            session_id: A running session.
            turn: The turn, exactly as produced.

        Returns:
            The turn's 0-based index in the assistant sequence.

        Raises:
            InvalidInput: The turn cannot be stored (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished.
        """
        row = _turn_row(turn)  # validate and encode before taking the lock
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._require_running(conn, session_id, "append a turn")
            idx = int(conn.execute(
                "SELECT COALESCE(MAX(idx) + 1, 0) FROM turns WHERE session_id = ?", (session_id,)
            ).fetchone()[0])
            conn.execute(
                "INSERT INTO turns (session_id, idx, stage, kind, text, token_ids, logprobs, policy_version, "
                "prompt_sha, token_source, finish_reason, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, idx, row.stage, row.kind, row.text, row.token_ids, row.logprobs, row.policy_version,
                 row.prompt_sha, row.token_source, row.finish_reason, now),
            )
            conn.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (now, session_id))
        return idx

    def append_tool_call(self, session_id: str, call: ToolCallRecord) -> int:
        """Record an executed (or refused) tool call with its snippets, committed at once.

        Args:
            session_id: A running session.
            call: The call and what came back.

        Returns:
            The call's 0-based index within the session.

        Raises:
            InvalidInput: The call cannot be stored (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished.
        """
        row = _call_row(call)
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._require_running(conn, session_id, "append a tool call")
            idx = int(conn.execute(
                "SELECT COALESCE(MAX(idx) + 1, 0) FROM tool_calls WHERE session_id = ?", (session_id,)
            ).fetchone()[0])
            conn.execute(
                "INSERT INTO tool_calls (session_id, idx, tool, query, attrs_json, error, seconds, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, idx, row.tool, row.query, row.attrs_json, row.error, row.seconds, now),
            )
            conn.executemany(
                "INSERT INTO snippets (session_id, call_idx, position, snippet_id, tool, title, text, url) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(session_id, idx, pos, *snippet) for pos, snippet in enumerate(row.snippets)],
            )
            conn.execute("UPDATE sessions SET updated_at = ? WHERE session_id = ?", (now, session_id))
        return idx

    def set_flags(
        self,
        session_id: str,
        *,
        malformed: bool | None = None,
        max_consecutive_tool_errors: int | None = None,
        injected_bank_items: Sequence[str] | None = None,
    ) -> None:
        """Update trajectory-level flags of a running session; None leaves a flag unchanged.

        Raises:
            InvalidInput: A flag has the wrong type or range (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished.
        """
        updates: dict[str, object] = {}
        if malformed is not None:
            if not isinstance(malformed, bool):
                raise InvalidInput(f"malformed must be a bool, got {malformed!r}")
            updates["malformed"] = int(malformed)
        if max_consecutive_tool_errors is not None:
            n_errors = max_consecutive_tool_errors
            if isinstance(n_errors, bool) or not isinstance(n_errors, int) or n_errors < 0:
                raise InvalidInput(f"max_consecutive_tool_errors must be an int >= 0, got {n_errors!r}")
            updates["max_consecutive_tool_errors"] = n_errors
        if injected_bank_items is not None:
            # A bare str is a Sequence[str] too; storing its characters as ids would be a silent bug.
            if isinstance(injected_bank_items, str) or not all(isinstance(i, str) for i in injected_bank_items):
                raise InvalidInput("injected_bank_items must be a sequence of str ids")
            updates["injected_bank_items_json"] = _json_in(list(injected_bank_items), "injected_bank_items")
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._require_running(conn, session_id, "set flags")
            assignments = ", ".join(f"{column} = ?" for column in updates)  # column names are ours, not input
            conn.execute(
                f"UPDATE sessions SET {assignments + ', ' if assignments else ''}updated_at = ? WHERE session_id = ?",
                (*updates.values(), now, session_id),
            )

    def finish(
        self,
        session_id: str,
        status: Literal["completed", "failed"],
        *,
        report: str | None = None,
        error: str | None = None,
        metrics: Mapping[str, object] | None = None,
    ) -> None:
        """Close a running session as completed or failed; afterwards it is immutable.

        Args:
            session_id: A running session.
            status: "completed" (eligible for judging and training) or "failed" (never trained on).
            report: The final Markdown report.
            error: Why the run failed.
            metrics: JSON-serialisable run metrics (timings, counts).

        Raises:
            InvalidInput: Bad status or values (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotRunning: The session already finished (e.g. finishing twice).
        """
        final = _choice(status, ("completed", "failed"), "status")
        values = (
            _opt_text_in(report, "report"), _opt_text_in(error, "error"),
            _mapping_in({} if metrics is None else metrics, "metrics"),
        )
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._require_running(conn, session_id, f"finish as {final}")
            conn.execute(
                "UPDATE sessions SET status = ?, report = ?, error = ?, metrics_json = ?, finished_at = ?, "
                "updated_at = ? WHERE session_id = ?",
                (final, *values, now, now, session_id),
            )

    def record_judgement(
        self,
        session_id: str,
        judge_model: str,
        payload: Mapping[str, object],
        *,
        status: Literal["ok", "failed"] = "ok",
        error: str | None = None,
        judge_kind: str = "llm",
        rubric_version: str = "",
    ) -> int:
        """Store a judgement of a completed session; returns its id.

        An "ok" judgement takes the session out of `completed_unjudged`; a "failed" one is a recorded failure (with
        its error), and the session is offered for judging again.

        Raises:
            InvalidInput: Bad model name, payload, status or kind (nothing was written).
            SessionNotFound: Unknown id.
            SessionNotCompleted: The session is running or failed.
        """
        if status not in ("ok", "failed"):
            raise InvalidInput(f"judgement status must be 'ok' or 'failed', got {status!r}")
        if status == "failed" and not error:
            raise InvalidInput("a failed judgement needs an error message")
        values = (
            _label_in(judge_model, "judge_model"),
            _mapping_in(payload, "payload"),
            status,
            error,
            _label_in(judge_kind, "judge_kind"),
            _label_in(rubric_version, "rubric_version", allow_empty=True),
        )
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            current = self._status(conn, session_id)
            if current != "completed":
                raise SessionNotCompleted(session_id, current, "record a judgement")
            cursor = conn.execute(
                "INSERT INTO judgements (session_id, judge_model, payload_json, status, error, judge_kind, "
                "rubric_version, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, *values, now),
            )
            return int(cursor.lastrowid or 0)

    def judgements(self, session_id: str) -> list[JudgementRecord]:
        """Every judgement of a session, oldest first (failed attempts included)."""
        with self._transaction("DEFERRED") as conn:
            self._status(conn, session_id)
            rows = conn.execute(
                "SELECT judgement_id, judge_model, payload_json, status, error, judge_kind, rubric_version, created_at "
                "FROM judgements WHERE session_id = ? ORDER BY judgement_id",
                (session_id,),
            ).fetchall()
        return [
            JudgementRecord(int(r[0]), session_id, r[1], json.loads(r[2]), r[3], r[4], r[5], r[6], r[7]) for r in rows
        ]

    def add_feedback(self, session_id: str, rating: str | None, note: str) -> int:
        """Store a user's feedback on a session (any status); a session may collect several. Returns its id.

        Args:
            session_id: The session the feedback is about.
            rating: "up", "down" or None (a note without a thumb).
            note: Free text, "what was missing or wrong"; stripped, at most MAX_FEEDBACK_NOTE characters, may be
                empty when a rating is given.

        Raises:
            InvalidInput: Unknown rating, a note that is not a str or too long, or neither a rating nor a note
                (nothing was written).
            SessionNotFound: Unknown id.
        """
        if rating is not None and rating not in FEEDBACK_RATINGS:
            raise InvalidInput(f"feedback rating must be 'up', 'down' or None, got {rating!r:.80}")
        if not isinstance(note, str):
            raise InvalidInput(f"feedback note must be a str, got {type(note).__name__}")
        text = note.strip()
        if len(text) > MAX_FEEDBACK_NOTE:
            raise InvalidInput(f"feedback note is {len(text):,} characters long; at most {MAX_FEEDBACK_NOTE:,} allowed")
        if rating is None and not text:
            raise InvalidInput("feedback needs a rating ('up' or 'down') or a note")
        stored = _text_in(text, "feedback note")
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            self._status(conn, session_id)
            cursor = conn.execute(
                "INSERT INTO feedback (session_id, rating, note, created_at) VALUES (?, ?, ?, ?)",
                (session_id, rating, stored, now),
            )
            return int(cursor.lastrowid or 0)

    def feedback(self, session_id: str) -> list[FeedbackRecord]:
        """Every piece of feedback on a session, oldest first.

        Raises:
            SessionNotFound: Unknown id.
        """
        with self._transaction("DEFERRED") as conn:
            self._status(conn, session_id)
            rows = conn.execute(
                "SELECT f.feedback_id, f.session_id, s.question, f.rating, f.note, f.created_at FROM feedback f "
                "JOIN sessions s ON s.session_id = f.session_id WHERE f.session_id = ? ORDER BY f.feedback_id",
                (session_id,),
            ).fetchall()
        return [_feedback_record(r) for r in rows]

    def feedback_for_question(self, question: str) -> list[FeedbackRecord]:
        """Feedback on every session whose question is the same after normalisation (`normalise_question`),
        oldest first.

        The sessions table keeps no question hash, so sessions with feedback are matched here in Python: feedback
        rows are few (one per user action), so this stays cheap.

        Raises:
            InvalidInput: `question` is not a str.
        """
        if not isinstance(question, str):
            raise InvalidInput(f"question must be a str, got {type(question).__name__}")
        key = normalise_question(question)
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                "SELECT f.feedback_id, f.session_id, s.question, f.rating, f.note, f.created_at FROM feedback f "
                "JOIN sessions s ON s.session_id = f.session_id ORDER BY f.feedback_id"
            ).fetchall()
        return [_feedback_record(r) for r in rows if normalise_question(_text_out(r[2])) == key]

    def save_rubric_buffer(self, question_sha: str, question: str, payload: Mapping[str, object]) -> int:
        """Insert or replace the rubric buffer of a question; returns its new version (1, 2, ...)."""
        values = (_label_in(question_sha, "question_sha"), _mapping_in(payload, "payload"))
        now = self._now()
        with self._transaction("IMMEDIATE") as conn:
            row = conn.execute("SELECT version FROM rubric_buffers WHERE question_sha = ?", (values[0],)).fetchone()
            version = int(row[0]) + 1 if row else 1
            conn.execute(
                "INSERT OR REPLACE INTO rubric_buffers (question_sha, question, payload_json, version, updated_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (values[0], question, values[1], version, now),
            )
            return version

    def load_rubric_buffer(self, question_sha: str) -> tuple[dict[str, Any], int] | None:
        """The saved buffer payload of a question and its version, or None."""
        with self._transaction("DEFERRED") as conn:
            row = conn.execute(
                "SELECT payload_json, version FROM rubric_buffers WHERE question_sha = ?", (question_sha,)
            ).fetchone()
        return (json.loads(row[0]), int(row[1])) if row else None

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
        bid = uuid.uuid4().hex if batch_id is None else _label_in(batch_id, "batch_id")
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Sequence) or not candidates:
            raise InvalidInput("candidates must be a non-empty sequence of ReflectionCandidate")
        if not isinstance(prompt, PromptRecord):
            raise InvalidInput(f"prompt must be a PromptRecord, got {type(prompt).__name__}")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
            math.isfinite(temperature) and temperature >= 0
        ):
            raise InvalidInput(f"temperature must be a finite number >= 0, got {temperature!r:.40}")
        batch = (
            _text_in(prompt.text, "prompt.text"),
            _pack_ids(prompt.token_ids, "prompt"),
            _label_in(prompt.prompt_sha, "prompt.prompt_sha", allow_empty=True),
            float(temperature),
            _opt_int(max_tokens, "max_tokens", low=1),
        )
        if batch[-1] is None:
            raise InvalidInput("max_tokens must be an int >= 1, got None")
        model = _label_in(judge_model, "judge_model")
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
        bid = _label_in(batch_id, "batch_id")
        index = _opt_int(candidate, "candidate", low=0)
        if index is None:
            raise InvalidInput("candidate must be an int >= 0, got None")
        item = _label_in(bank_item_id, "bank_item_id")
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

    def mark_stale_running_failed(self, older_than: timedelta) -> int:
        """Crash recovery: fail sessions still "running" whose last write is at least `older_than` ago.

        A process that died mid-run leaves its session running forever; call this at start-up with a margin larger
        than any live run's gap between writes. The turns already written are kept.

        Returns:
            How many sessions were marked failed.
        """
        if not isinstance(older_than, timedelta) or older_than < timedelta(0):
            raise InvalidInput(f"older_than must be a timedelta >= 0, got {older_than!r}")
        now_dt = self._clock()
        now, cutoff = _iso(now_dt), _iso(now_dt - older_than)
        with self._transaction("IMMEDIATE") as conn:
            cursor = conn.execute(
                "UPDATE sessions SET status = 'failed', finished_at = ?, updated_at = ?, "
                "error = COALESCE(error, ?) WHERE status = 'running' AND updated_at <= ?",
                (now, now, _STALE_ERROR.format(older_than=older_than), cutoff),
            )
            return cursor.rowcount

    # -- reads --

    def get(self, session_id: str) -> SessionRecord:
        """Read a session back with its full trajectory (turns and tool calls in order, token data exact).

        Raises:
            SessionNotFound: Unknown id.
        """
        with self._transaction("DEFERRED") as conn:
            s = conn.execute(
                "SELECT question, status, created_at, finished_at, policy_version, options_json, prompt_text, "
                "prompt_token_ids, prompt_sha, malformed, max_consecutive_tool_errors, injected_bank_items_json, "
                "report, error, metrics_json FROM sessions WHERE session_id = ?",
                (session_id,),
            ).fetchone()
            if s is None:
                raise SessionNotFound(session_id)
            turn_rows = conn.execute(
                "SELECT stage, kind, text, token_ids, logprobs, policy_version, prompt_sha, token_source, "
                "finish_reason FROM turns WHERE session_id = ? ORDER BY idx",
                (session_id,),
            ).fetchall()
            call_rows = conn.execute(
                "SELECT idx, tool, query, attrs_json, error, seconds FROM tool_calls WHERE session_id = ? ORDER BY idx",
                (session_id,),
            ).fetchall()
            snippet_rows = conn.execute(
                "SELECT call_idx, snippet_id, tool, title, text, url FROM snippets WHERE session_id = ? "
                "ORDER BY call_idx, position",
                (session_id,),
            ).fetchall()
        turns = tuple(
            Turn(stage=r[0], kind=r[1], text=_text_out(r[2]), token_ids=_unpack_ids(r[3]),
                 logprobs=_unpack_floats(r[4]), policy_version=r[5], prompt_sha=r[6],
                 token_source=r[7], finish_reason=r[8])
            for r in turn_rows
        )
        by_call: dict[int, list[Snippet]] = {}
        for r in snippet_rows:
            by_call.setdefault(r[0], []).append(Snippet(
                id=_text_out(r[1]), tool=_text_out(r[2]), title=_text_out(r[3]), text=_text_out(r[4]),
                url=_text_out(r[5])))
        calls = tuple(
            ToolCallRecord(tool=_text_out(r[1]), query=_text_out(r[2]), attrs=json.loads(r[3]),
                           snippets=tuple(by_call.get(r[0], ())), error=_opt_text_out(r[4]), seconds=r[5])
            for r in call_rows
        )
        trajectory = Trajectory(
            session_id=session_id,
            question=_text_out(s[0]),
            prompt=PromptRecord(text=_text_out(s[6]), token_ids=_unpack_ids(s[7]), prompt_sha=s[8]),
            turns=turns,
            tool_calls=calls,
            malformed=bool(s[9]),
            max_consecutive_tool_errors=int(s[10]),
            injected_bank_items=tuple(json.loads(s[11])),
        )
        return SessionRecord(
            session_id=session_id, question=trajectory.question, status=s[1], created_at=s[2], finished_at=s[3],
            policy_version=s[4], options=json.loads(s[5]), trajectory=trajectory, report=_opt_text_out(s[12]),
            error=_opt_text_out(s[13]), metrics=json.loads(s[14]),
        )

    def list_sessions(self, limit: int = 50, status: str | None = None) -> list[SessionSummary]:
        """Newest sessions first (by creation), optionally only those with `status`.

        Raises:
            InvalidInput: `limit` < 1 or an unknown status.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput(f"limit must be an int >= 1, got {limit!r}")
        where, params = "", []
        if status is not None:
            where, params = "WHERE s.status = ?", [_choice(status, _STATUSES, "status")]
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                "SELECT s.session_id, s.question, s.status, s.created_at, s.finished_at, s.policy_version, "
                "(SELECT COUNT(*) FROM turns t WHERE t.session_id = s.session_id), "
                "(SELECT COUNT(*) FROM tool_calls c WHERE c.session_id = s.session_id), s.malformed, s.error "
                f"FROM sessions s {where} ORDER BY s.created_at DESC, s.rowid DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [
            SessionSummary(session_id=r[0], question=_text_out(r[1]), status=r[2], created_at=r[3], finished_at=r[4],
                           policy_version=r[5], n_turns=int(r[6]), n_tool_calls=int(r[7]), malformed=bool(r[8]),
                           error=_opt_text_out(r[9]))
            for r in rows
        ]

    def completed_unjudged(self, since: datetime | None = None, limit: int | None = None) -> list[str]:
        """Ids of completed sessions without any judgement, oldest completion first.

        Args:
            since: Only sessions that finished at or after this moment (naive datetimes are taken as UTC).
            limit: At most this many ids; None for all.

        Raises:
            InvalidInput: `limit` < 1 or `since` not a datetime.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidInput(f"limit must be None or an int >= 1, got {limit!r}")
        if since is not None and not isinstance(since, datetime):
            raise InvalidInput(f"since must be a datetime, got {type(since).__name__}")
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                "SELECT s.session_id FROM sessions s WHERE s.status = 'completed' AND s.finished_at >= ? "
                "AND NOT EXISTS (SELECT 1 FROM judgements j WHERE j.session_id = s.session_id AND j.status = 'ok') "
                "ORDER BY s.finished_at, s.rowid LIMIT ?",
                ("" if since is None else _iso(since), -1 if limit is None else limit),
            ).fetchall()
        return [str(r[0]) for r in rows]

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
            params.append(_label_in(session_id, "session_id"))
        if batch_id is not None:
            where.append("batch_id = ?")
            params.append(_label_in(batch_id, "batch_id"))
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
                prompt=PromptRecord(text=_text_out(r[3]), token_ids=_unpack_ids(r[4]), prompt_sha=r[5]),
                temperature=float(r[6]), max_tokens=int(r[7]), judge_model=r[8], accepted=bool(r[9]),
                bank_item_id=r[10], created_at=r[11],
                candidate=ReflectionCandidate(
                    index=int(r[12]), policy_version=r[2], text=_text_out(r[13]), forced_suffix=_text_out(r[14]),
                    seed=r[15],
                    token_ids=_unpack_ids(r[16]), logprobs=_unpack_floats(r[17]), token_source=r[18],
                    finish_reason=r[19], valid=bool(r[20]), validity_error=_opt_text_out(r[21]),
                    diagnostic_accuracy=r[22], specificity=r[23], scope_balance=r[24], u_within=r[25],
                    u_cross=r[26], u=r[27], justification=_text_out(r[28]), judge_error=_opt_text_out(r[29]),
                ),
            )
            for r in rows
        ]

    def sessions_without_reflection(self, limit: int | None = None) -> list[str]:
        """Ids of completed sessions with an "ok" judgement and no reflection batch yet, oldest completion first.

        A batch counts whatever its outcome (a batch whose judge failed is stored too), so a session is offered once.

        Raises:
            InvalidInput: `limit` < 1.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise InvalidInput(f"limit must be None or an int >= 1, got {limit!r}")
        with self._transaction("DEFERRED") as conn:
            rows = conn.execute(
                "SELECT s.session_id FROM sessions s WHERE s.status = 'completed' "
                "AND EXISTS (SELECT 1 FROM judgements j WHERE j.session_id = s.session_id AND j.status = 'ok') "
                "AND NOT EXISTS (SELECT 1 FROM reflection_candidates c WHERE c.session_id = s.session_id) "
                "ORDER BY s.finished_at, s.rowid LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        return [str(r[0]) for r in rows]

    def pragmas(self) -> dict[str, object]:
        """The connection's effective settings (journal_mode, foreign_keys, busy_timeout, synchronous, user_version).

        Useful for diagnostics (`rubricem doctor`) and tests.
        """
        names = ("journal_mode", "foreign_keys", "busy_timeout", "synchronous", "user_version")
        with self._lock, _mapped_errors():
            conn = self._live()
            return {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in names}

    # -- lifecycle --

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self._path

    def close(self) -> None:
        """Close the connection; idempotent. Later calls raise `StoreClosed`."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                with _mapped_errors():
                    conn.close()

    def __enter__(self) -> SessionLog:
        """Use the log as a context manager that closes it."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the log."""
        self.close()
