"""The session log's SQLite connection: opening and migrating the file (WAL), transactions, error mapping, closing.

`SessionLogBase` holds the one connection and its lock; the concern mixins of `store.session_log` build on it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from store.errors import (
    InvalidInput,
    SessionNotFound,
    SessionNotRunning,
    StorageError,
    StoreBusy,
    StoreClosed,
)
from store.migrations import apply_migrations
from store.session_log.codec import iso

_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


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


class SessionLogBase:
    """One SQLite connection guarded by a lock: open and migrate, run transactions, close.

    The concern mixins (sessions, judgements, feedback, reflections) use `_transaction`, `_now`, `_status` and
    `_require_running` from here.
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
        return iso(self._clock())

    def _now(self) -> str:
        return iso(self._clock())

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

    def __enter__(self) -> Self:
        """Use the log as a context manager that closes it."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the log."""
        self.close()
