"""The session log's database: opening and migrating it (a SQLite file or a PostgreSQL server), transactions, closing.

`SessionLogBase` holds the one database (`store.db`) the concern mixins of `store.session_log` build on; they write
their SQL once, in SQLite's dialect, and `store.db` runs it on either backend.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Self

from pydantic import SecretStr

from store.db.dialect import Backend, Connection
from store.db.sqlite import SqliteDatabase
from store.errors import InvalidInput, SessionNotFound, SessionNotRunning
from store.session_log.codec import iso

if TYPE_CHECKING:
    from store.config import StoreConfig
    from store.db.postgres import PostgresDatabase


class SessionLogBase:
    """One database (SQLite file or PostgreSQL server): open and migrate, run transactions, close.

    The concern mixins (sessions, judgements, feedback, reflections) use `_transaction`, `_now`, `_status` and
    `_require_running` from here.
    """

    def __init__(
        self,
        path: Path | str | None = None,
        *,
        database_url: str | SecretStr | None = None,
        busy_timeout_s: float = 10.0,
        synchronous: Literal["NORMAL", "FULL"] = "FULL",
        clock: Callable[[], datetime] | None = None,
        consent_default: bool = True,
    ) -> None:
        """Open (creating what is missing) and migrate the database: a SQLite file at `path`, or the PostgreSQL
        database at `database_url`; exactly one of the two.

        Args:
            path: The SQLite file, e.g. `StoreConfig().sqlite_path`.
            database_url: postgresql://user:password@host:port/dbname (see `SessionLog.from_config`).
            busy_timeout_s: How long a write waits for another writer's lock before `StoreBusy`.
            synchronous: SQLite only. FULL (default) fsyncs every commit, so even an OS crash keeps every appended
                turn; NORMAL is faster and still survives a crash of the process. (PostgreSQL commits are as durable
                as the server's synchronous_commit makes them; on by default.)
            clock: Returns "now" (tests pass a fixed clock); defaults to the UTC wall clock.
            consent_default: Whether the sessions of people who have not chosen (no `users.consent`) may be judged,
                trained on and reflected into the bank (the deployment setting `StoreConfig.consent_default`).

        Raises:
            InvalidInput: Both or neither of `path` and `database_url`, a malformed URL, or a bad `synchronous`.
            StorageError: The SQLite file cannot be opened, is not a database, or cannot use WAL mode.
            StoreUnreachable: The PostgreSQL server cannot be reached or refuses the connection.
            MigrationError: The schema could not be brought up to date, or is newer than this code.
        """
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidInput(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        self._clock = clock if clock is not None else (lambda: datetime.now(UTC))
        self.consent_default = bool(consent_default)
        self._db: SqliteDatabase | PostgresDatabase
        if database_url is not None and path is None:
            from store.db.postgres import PostgresDatabase  # psycopg is imported only when PostgreSQL is used

            self._db = PostgresDatabase(database_url, busy_timeout_s=busy_timeout_s)
        elif path is not None and database_url is None:
            self._db = SqliteDatabase(Path(path), busy_timeout_s=busy_timeout_s, synchronous=synchronous)
        else:
            raise InvalidInput("open the session log with a SQLite path or a database_url (exactly one)")

    @classmethod
    def from_config(cls, config: StoreConfig, *, clock: Callable[[], datetime] | None = None) -> Self:
        """The store's session log: PostgreSQL when `config.database_url` is set, else the SQLite file in data_dir."""
        if config.database_url is not None:
            return cls(database_url=config.database_url, clock=clock, consent_default=config.consent_default)
        return cls(config.sqlite_path, clock=clock, consent_default=config.consent_default)

    # -- plumbing --

    def _transaction(self, mode: Literal["DEFERRED", "IMMEDIATE"]) -> AbstractContextManager[Connection]:
        # IMMEDIATE: a write, holding the database's single write lock from the start; DEFERRED: a read of one snapshot.
        return self._db.transaction(write=mode == "IMMEDIATE")

    def transaction(self, write: bool) -> AbstractContextManager[Connection]:
        """A transaction on this database for stores that share it (the policy registry, chat threads): holding the
        write lock when `write`, else one read snapshot. SQL is written in SQLite's dialect (`?` placeholders);
        driver errors come out as store errors."""
        return self._db.transaction(write=write)

    def learnable_sql(self, alias: str = "s") -> tuple[str, tuple[object, ...]]:
        """A WHERE fragment (and its parameter) true for sessions that may be judged, trained on and reflected into
        the bank: no per-session opt-out, and the owner consents (their own choice, else the deployment default).
        Checked at use, not at creation, so withdrawing consent also covers sessions already logged."""
        return (f"{alias}.training_opt_out = 0 AND COALESCE((SELECT u.consent FROM users u "
                f"WHERE u.user_id = {alias}.owner), ?) = 1", (int(self.consent_default),))

    def now(self) -> str:
        """The log's clock as an ISO-8601 UTC string."""
        return iso(self._clock())

    def _now(self) -> str:
        return iso(self._clock())

    def clock(self) -> datetime:
        """The log's clock as a datetime (UTC): leases are compared with it."""
        return self._clock()

    @staticmethod
    def _status(conn: Connection, session_id: str) -> str:
        row = conn.execute("SELECT status FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        return str(row[0])

    def _require_running(self, conn: Connection, session_id: str, action: str) -> None:
        status = self._status(conn, session_id)
        if status != "running":
            raise SessionNotRunning(session_id, status, action)

    def pragmas(self) -> dict[str, object]:
        """The database's effective settings, for diagnostics (`rubricem doctor`) and tests.

        SQLite: journal_mode, foreign_keys, busy_timeout, synchronous, user_version. PostgreSQL: backend, location
        (no password), server_version, schema_version, lock_timeout.
        """
        return self._db.diagnostics()

    # -- lifecycle --

    @property
    def backend(self) -> Backend:
        """"sqlite" or "postgresql"."""
        return self._db.backend

    @property
    def path(self) -> Path | None:
        """The SQLite file; None on PostgreSQL."""
        return self._db.path

    @property
    def location(self) -> str:
        """Where the log is, safe to show: the SQLite file, or the PostgreSQL URL without its password."""
        return self._db.location

    def __repr__(self) -> str:
        """The backend and location, never a password."""
        return f"{type(self).__name__}({self.backend}: {self.location})"

    def close(self) -> None:
        """Close the connection(s); idempotent. Later calls raise `StoreClosed`."""
        self._db.close()

    def __enter__(self) -> Self:
        """Use the log as a context manager that closes it."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Close the log."""
        self.close()
