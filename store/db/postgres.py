"""The PostgreSQL backend: a psycopg connection pool, the store's write lock, error mapping that never shows the
password, and the named advisory lock that keeps one retraining cycle at a time across hosts.

Opening checks the URL, connects once on its own (so a wrong password, an unknown database or an unreachable server
is a clear `StoreUnreachable` before anything is written) and migrates; then the pool serves the transactions.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import errors as pg_errors
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout
from pydantic import SecretStr

from store.db.dialect import Backend, PostgresConnection, RawText, advisory_key, from_postgres_text, postgres_text
from store.errors import (
    ConnectionLost,
    InvalidInput,
    LockHeld,
    StorageError,
    StoreBusy,
    StoreClosed,
    StoreUnreachable,
)
from store.migrations import apply_migrations

_SCHEMES = ("postgresql://", "postgres://")
# libpq options we set unless the URL sets them. Keepalives make a dead peer visible on an idle connection: the pool's
# check discards it, and a lock held by a crashed host is released by the server within about a minute.
_CONNECT_DEFAULTS = {"application_name": "rubricem", "connect_timeout": "10", "keepalives": "1",
                     "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}
_SERVER_KEEPALIVES = ("SET tcp_keepalives_idle = 30", "SET tcp_keepalives_interval = 10",
                      "SET tcp_keepalives_count = 3", "SET tcp_user_timeout = 60000")


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    """A checked database URL: the conninfo to connect with, and what may be shown of it."""

    conninfo: SecretStr
    location: str  # postgresql://user@host:port/dbname, never the password
    secrets: tuple[str, ...]  # the password as written and as decoded, blanked from every message

    @classmethod
    def parse(cls, url: str | SecretStr) -> PostgresTarget:
        """Check a `postgresql://` URL without ever echoing it.

        Raises:
            InvalidInput: Not a postgresql:// URL, or libpq cannot parse it.
        """
        text = url.get_secret_value() if isinstance(url, SecretStr) else url
        if not isinstance(text, str) or not text.startswith(_SCHEMES):
            raise InvalidInput("the database URL must start with postgresql:// (e.g. "
                               "postgresql://user:password@host:5432/rubricem); the value given does not")
        written = _written_password(text)
        try:
            parts = conninfo_to_dict(text)
        except psycopg.ProgrammingError as exc:
            # libpq's message quotes the whole URL, password included: keep the reason, not the URL.
            reason = str(exc).replace(text, "<the URL>").strip()
            raise InvalidInput("the database URL is not a valid postgresql:// URL: "
                               f"{reason.replace(written, '***') if written else reason}") from None
        password = str(parts.get("password") or "")
        secrets = tuple(s for s in {password, written, quote(password, safe="")} if s)
        host = str(parts.get("host") or "localhost")
        port = f":{parts['port']}" if parts.get("port") else ""
        user = f"{parts['user']}@" if parts.get("user") else ""
        location = f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"
        return cls(SecretStr(text), location, secrets)

    def redact(self, message: str) -> str:
        """`message` with the password blanked."""
        for secret in self.secrets:
            message = message.replace(secret, "***")
        return message

    def connect_kwargs(self) -> dict[str, Any]:
        """`_CONNECT_DEFAULTS` the URL does not set, plus autocommit (the store issues BEGIN/COMMIT itself)."""
        given = conninfo_to_dict(self.conninfo.get_secret_value())
        return {k: v for k, v in _CONNECT_DEFAULTS.items() if k not in given} | {"autocommit": True}

    def connect(self) -> psycopg.Connection[Any]:
        """One connection of its own.

        Raises:
            StoreUnreachable: The server is down or unreachable, refuses the login, or has no such database.
        """
        try:
            return psycopg.connect(self.conninfo.get_secret_value(), **self.connect_kwargs())
        except psycopg.Error as exc:
            # `from None`: the driver's exception stays out of tracebacks, so only the redacted text is ever shown.
            raise StoreUnreachable(f"cannot connect to the PostgreSQL store at {self.location}: "
                                   f"{self.redact(str(exc)).strip()}") from None


def _written_password(url: str) -> str:
    """The password as written in a URL's user-info (`scheme://user:password@host...`), or ""."""
    userinfo = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
    return userinfo.partition(":")[2]


class _TextDumper(Dumper):
    """Sends every str as `postgres_text` (NUL and lone surrogates survive); oid 0 lets the server infer the type,
    as psycopg's own text dumper does."""

    def dump(self, obj: str) -> bytes:
        return postgres_text(obj).encode("utf-8")


class _RawTextDumper(Dumper):
    """`RawText` (a str that is not valid Unicode, as SQLite stores it) goes to TEXT columns like any other str."""

    def dump(self, obj: bytes) -> bytes:
        return postgres_text(bytes(obj).decode("utf-8", "surrogatepass")).encode("utf-8")


class _TextLoader(Loader):
    """Reads TEXT back through `from_postgres_text`."""

    def load(self, data: Buffer) -> str:
        return from_postgres_text(bytes(data).decode("utf-8"))


@contextmanager
def _mapped_errors(redact: Callable[[str], str]) -> Iterator[None]:
    """Translate psycopg exceptions into the store hierarchy, by exception class (SQLSTATE), password blanked."""
    try:
        yield
    except PoolTimeout as exc:
        raise StorageError(redact(f"no connection to the PostgreSQL store within the busy timeout (server "
                                  f"unreachable, or every pooled connection in use): {exc}")) from exc
    except (pg_errors.LockNotAvailable, pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as exc:
        raise StoreBusy(redact(f"the store stayed locked past busy_timeout: {exc}")) from exc
    except (psycopg.IntegrityError, psycopg.DataError) as exc:
        raise InvalidInput(redact(f"the database rejected the value: {exc}")) from exc
    except psycopg.OperationalError as exc:  # after the lock errors above, which are operational too
        raise ConnectionLost(redact(f"the connection to PostgreSQL broke: {exc}")) from exc
    except psycopg.Error as exc:
        raise StorageError(redact(f"PostgreSQL error: {exc}")) from exc


class PostgresDatabase:
    """A PostgreSQL database as the store: migrated on construction, then transactions from a connection pool."""

    backend: Backend = "postgresql"
    path = None  # nothing on the local disk

    def __init__(self, url: str | SecretStr, *, busy_timeout_s: float, max_connections: int = 8) -> None:
        """Check the URL, connect, migrate, open the pool.

        Args:
            url: postgresql://user:password@host:port/dbname (libpq query options allowed).
            busy_timeout_s: How long a write waits for another writer's lock, and a transaction for a free pooled
                connection, before `StoreBusy` / `StorageError`.
            max_connections: The pool's upper bound (transactions of one process in parallel).

        Raises:
            InvalidInput: The URL is malformed.
            StoreUnreachable: The server cannot be reached or refuses the connection.
            MigrationError: The schema could not be brought up to date (or is newer than this code).
        """
        self._target = PostgresTarget.parse(url)
        self._busy_ms = max(1, int(busy_timeout_s * 1000))  # lock_timeout 0 would mean "wait forever"
        self._max = max_connections
        conn = self._target.connect()
        try:
            self._configure(conn)
            apply_migrations(conn)
        finally:
            conn.close()
        self._lock = threading.Lock()
        self._inherited: list[ConnectionPool[Any]] = []
        self._pool: ConnectionPool[Any] | None = self._open_pool()
        self._pid = os.getpid()

    @property
    def location(self) -> str:
        """The URL without its password."""
        return self._target.location

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(f"SET lock_timeout = {self._busy_ms}")
        conn.adapters.register_dumper(str, _TextDumper)
        conn.adapters.register_dumper(RawText, _RawTextDumper)
        conn.adapters.register_loader("text", _TextLoader)

    def _open_pool(self) -> ConnectionPool[Any]:
        pool: ConnectionPool[Any] = ConnectionPool(
            self._target.conninfo.get_secret_value(), kwargs=self._target.connect_kwargs(), min_size=1,
            max_size=self._max, open=False, configure=self._configure, check=ConnectionPool.check_connection,
            timeout=self._busy_ms / 1000, num_workers=1, name="rubricem-store")
        try:
            pool.open(wait=True, timeout=10.0)
        except PoolTimeout:
            pool.close()
            raise StoreUnreachable(f"cannot open connections to the PostgreSQL store at {self.location}") from None
        return pool

    def _live(self) -> ConnectionPool[Any]:
        with self._lock:
            if self._pool is None:
                raise StoreClosed()
            if self._pid != os.getpid():
                # A forked child gets a pool of its own. The inherited one stays referenced and unclosed: closing
                # (or collecting) it would end the parent's server sessions.
                self._inherited.append(self._pool)
                self._pool = self._open_pool()
                self._pid = os.getpid()
            return self._pool

    @contextmanager
    def transaction(self, write: bool) -> Iterator[PostgresConnection]:
        """Writes hold the store's advisory write lock (one writer at a time, as in SQLite); reads see one
        snapshot (REPEATABLE READ, READ ONLY)."""
        pool = self._live()
        with _mapped_errors(self._target.redact), pool.connection() as conn:
            db = PostgresConnection(conn)
            if write:
                db.begin_write()
            else:
                db.begin_read()
            try:
                yield db
                conn.execute("COMMIT")
            except BaseException:
                status = conn.info.transaction_status
                if not conn.broken and status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                    conn.execute("ROLLBACK")
                raise

    def diagnostics(self) -> dict[str, object]:
        """Backend, location, server version, schema version and the lock timeout in effect."""
        with self.transaction(write=False) as conn:
            server = conn.execute("SHOW server_version").fetchone()[0]
            lock_timeout = conn.execute("SHOW lock_timeout").fetchone()[0]
            schema = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0]
        return {"backend": self.backend, "location": self.location, "server_version": server,
                "schema_version": schema, "lock_timeout": lock_timeout}

    def close(self) -> None:
        """Close the pool (its connections end); idempotent."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()


@contextmanager
def advisory_lock(url: str | SecretStr, name: str) -> Iterator[None]:
    """Hold the named advisory lock of the database for the block, on a connection of its own.

    The lock belongs to that server session, so it is released when the block ends and whenever the holder dies: at
    once when its process dies (the OS closes the socket and the server ends the session), within about a minute
    when its host dies or the network goes (TCP keepalives and tcp_user_timeout on the session). The connection must
    reach the server directly, not through a transaction-pooling proxy, which would hand the session to others, and
    the role must not have an idle_session_timeout, which would end the session (and the lock) mid-cycle.

    Raises:
        LockHeld: Another session holds the lock now (nothing waits).
        InvalidInput, StoreUnreachable: As for opening the store.
    """
    target = PostgresTarget.parse(url)
    conn = target.connect()
    try:
        with _mapped_errors(target.redact):
            for statement in _SERVER_KEEPALIVES:
                conn.execute(statement)
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", (advisory_key(name),)).fetchone()
        if not got or not got[0]:
            raise LockHeld(f"the lock {name!r} is held by another session of {target.location}")
        yield
    finally:
        conn.close()  # ends the session, which releases the lock
