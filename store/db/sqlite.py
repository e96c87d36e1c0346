"""The SQLite backend: one connection to a file in WAL mode, guarded by a lock; PRAGMAs, busy retries, fork safety.

Every write is one `BEGIN IMMEDIATE` transaction, so a crash loses nothing already committed and writers from other
processes queue on the file's lock for up to busy_timeout.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from store.db.dialect import Backend
from store.errors import InvalidInput, StorageError, StoreBusy, StoreClosed
from store.migrations import apply_migrations

_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def is_busy(exc: sqlite3.Error) -> bool:
    """Another connection holds the lock: worth retrying a journal-mode switch, which SQLite never retries itself."""
    return getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES


@contextmanager
def mapped_errors() -> Iterator[None]:
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


class SqliteDatabase:
    """One SQLite file: opened (folder and file created if needed) and migrated on construction."""

    backend: Backend = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_s: float,
                 synchronous: Literal["NORMAL", "FULL"] = "FULL") -> None:
        """Open and migrate the file.

        Raises:
            InvalidInput: `synchronous` is neither NORMAL nor FULL.
            StorageError: The file cannot be opened, is not a database, or cannot use WAL mode.
            MigrationError: The schema could not be brought up to date.
        """
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidInput(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self.path = Path(path)
        self._busy_ms = max(0, int(busy_timeout_s * 1000))
        self._synchronous = synchronous
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the folder for {self.path}: {exc}") from exc
        self._conn: sqlite3.Connection | None = self._connect()
        self._pid = os.getpid()
        try:
            apply_migrations(self._conn)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    @property
    def location(self) -> str:
        """Where the database is, for messages."""
        return str(self.path)

    def _connect(self) -> sqlite3.Connection:
        with mapped_errors():
            # isolation_level=None: we issue BEGIN/COMMIT ourselves, so every write is exactly one transaction.
            conn = sqlite3.connect(
                self.path, timeout=self._busy_ms / 1000, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
                mode = self._enable_wal(conn)
                if str(mode).lower() != "wal":
                    raise StorageError(f"{self.path} cannot use WAL mode (journal_mode={mode}); use a local disk")
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
                if not is_busy(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

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
    def transaction(self, write: bool) -> Iterator[sqlite3.Connection]:
        """IMMEDIATE for writes: take the write lock up front (waiting up to busy_timeout) instead of failing on a
        read-to-write upgrade. DEFERRED for reads: one consistent snapshot across several SELECTs."""
        with self._lock, mapped_errors():
            conn = self._live()
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def diagnostics(self) -> dict[str, object]:
        """The connection's effective PRAGMAs (journal_mode, foreign_keys, busy_timeout, synchronous, user_version)."""
        names = ("journal_mode", "foreign_keys", "busy_timeout", "synchronous", "user_version")
        with self._lock, mapped_errors():
            conn = self._live()
            return {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in names}

    def close(self) -> None:
        """Close the connection; idempotent."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                with mapped_errors():
                    conn.close()
