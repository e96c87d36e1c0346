"""Where SQLite and PostgreSQL differ, in one place: query text, the migrations' DDL, stored text, transactions.

The store's queries and migration files are written once, in SQLite's dialect (`?` placeholders, SQLite type names),
and translated here for PostgreSQL. Migrations are translated rather than kept twice because the differences are
mechanical and a parallel copy of every file would drift; the checksum stays that of the one file, so both backends
agree on what migration N is. The translation (`postgres_ddl`):

- `INTEGER PRIMARY KEY [AUTOINCREMENT]` (SQLite's rowid alias) -> a `BIGINT` identity primary key;
- `INTEGER` -> `BIGINT` (SQLite integers are 64-bit), `REAL` -> `DOUBLE PRECISION` (PostgreSQL's REAL is 32-bit),
  `BLOB` -> `BYTEA`, `TEXT` -> `TEXT COLLATE "C"` (byte order, as SQLite compares: ISO timestamps and ids sort the same
  whatever the server's locale);
- `WITHOUT ROWID` is dropped; every other table that has no integer primary key gets an explicit `rowid` identity
  column, because queries break ties by SQLite's implicit insertion-ordered `rowid`.

Migration files therefore write type names in upper case and column names in lower case (a column called `text`
stays a column). Queries avoid SQLite-only syntax where a portable form exists (`ON CONFLICT ... DO UPDATE` instead of
`INSERT OR REPLACE`, `RETURNING` instead of `lastrowid`, no `LIMIT -1`); timestamps are computed in Python, so no
date functions differ. What is left is translated by `postgres_query` (placeholders) and `json_number` (JSON paths).

PostgreSQL TEXT cannot hold NUL characters or lone surrogates, which SQLite keeps (the latter as a UTF-8 BLOB,
`RawText`). Such strings, and strings that begin with the escape mark, are stored as the mark followed by their JSON
form (`postgres_text`); the PostgreSQL backend applies this to every string it sends and reads, so round trips are
exact and equal strings still compare equal.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal, Protocol

Backend = Literal["sqlite", "postgresql"]

# Session advisory-lock keys are per database; the store-wide write lock and named locks (the retraining cycle) must
# not collide, so each is a 64-bit hash of its own name.
WRITE_LOCK_NAME = "rubricem.store.write"


def advisory_key(name: str) -> int:
    """The signed 64-bit PostgreSQL advisory-lock key of a lock name."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big", signed=True)


class Cursor(Protocol):
    """What the store reads from an executed statement (sqlite3 and psycopg cursors both fit)."""

    @property
    def rowcount(self) -> int:
        """Rows changed by an UPDATE/DELETE/INSERT."""

    def fetchone(self) -> Any:
        """The next row or None."""

    def fetchall(self) -> list[Any]:
        """The remaining rows."""

    def __iter__(self) -> Iterator[Any]:
        """Iterate over the remaining rows."""


class Connection(Protocol):
    """A connection inside a store transaction, driven with SQLite-dialect SQL (`?` placeholders)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor:
        """Run one statement."""

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> Cursor:
        """Run one statement once per parameter row."""


# --- query text -------------------------------------------------------------------------------------------------

# Quoted strings, quoted identifiers and comments: placeholders are never translated inside them.
_QUOTED_OR_COMMENT = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*"|--[^\n]*|/\*.*?\*/)""", re.DOTALL)


@functools.lru_cache(maxsize=2048)
def postgres_query(sql: str) -> str:
    """A SQLite-dialect query for psycopg: `?` placeholders become `%s` and a literal `%` becomes `%%`."""
    parts = _QUOTED_OR_COMMENT.split(sql)
    out = []
    for i, part in enumerate(parts):
        part = part.replace("%", "%%")  # psycopg reads % anywhere in the text, even inside quotes
        out.append(part.replace("?", "%s") if i % 2 == 0 else part)
    return "".join(out)


def json_number(backend: Backend, column: str, *keys: str) -> str:
    """An SQL expression reading the JSON value at `keys` of a JSON text column (a number comes back as a number).

    Raises:
        ValueError: A key is not a plain identifier (keys are ours, never user input).
    """
    if not keys or not all(re.fullmatch(r"\w+", k) for k in keys):
        raise ValueError(f"JSON path keys must be identifiers, got {keys!r}")
    if backend == "sqlite":
        return f"json_extract({column}, '$.{'.'.join(keys)}')"
    return f"(({column})::jsonb #> '{{{','.join(keys)}}}')"


# --- migrations' DDL ----------------------------------------------------------------------------------------------

_INT_PK = re.compile(r"\bINTEGER\s+PRIMARY\s+KEY(?:\s+AUTOINCREMENT)?\b")
_TYPES = (
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
)
_WITHOUT_ROWID = re.compile(r"\)\s*WITHOUT\s+ROWID\s*(;?)\s*$")
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\w+\s*\(")
_SQLITE_ONLY = re.compile(r"\b(AUTOINCREMENT|WITHOUT\s+ROWID|PRAGMA)\b", re.IGNORECASE)


def postgres_ddl(statement: str) -> str:
    """One statement of a (SQLite-dialect) migration file, as PostgreSQL runs it; see the module docstring.

    Raises:
        ValueError: The statement keeps SQLite-only syntax this translation does not know.
    """
    # Even items are code, odd ones quoted text or comments (comments blanked, so the alternation is kept).
    parts = [" " if p.startswith(("--", "/*")) else p for p in _QUOTED_OR_COMMENT.split(statement)]
    code = " ".join(parts[0::2])
    without_rowid = _WITHOUT_ROWID.search(code) is not None
    needs_rowid = _CREATE_TABLE.match(code) is not None and not without_rowid and _INT_PK.search(code) is None
    out: list[str] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = _INT_PK.sub("BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", part)
            for pattern, replacement in _TYPES:
                part = pattern.sub(replacement, part)
            if without_rowid and i == len(parts) - 1:
                part = _WITHOUT_ROWID.sub(r")\1", part)
        out.append(part)
    translated = "".join(out).strip()
    if needs_rowid:
        translated = _CREATE_TABLE.sub(lambda m: m.group(0) + "rowid BIGINT GENERATED ALWAYS AS IDENTITY, ",
                                       translated, count=1)
    leftover = _SQLITE_ONLY.search(" ".join(_QUOTED_OR_COMMENT.split(translated)[0::2]))
    if leftover:
        raise ValueError(f"{leftover.group(1)} has no PostgreSQL translation")
    return translated


# --- stored text ----------------------------------------------------------------------------------------------------

class RawText(bytes):
    """A str that is not valid Unicode (lone surrogates), as UTF-8 with surrogatepass.

    SQLite stores it as a BLOB in the TEXT column (a bytes subclass binds as a BLOB); the PostgreSQL backend sends
    it as `postgres_text` of the decoded string. Readers turn either back into the original str.
    """


_TEXT_MARK = "\ufdd0"  # a Unicode noncharacter ("for internal use"), never expected at the start of real text


def postgres_text(value: str) -> str:
    """The form of `value` PostgreSQL TEXT can hold: itself, or the mark plus its ASCII JSON when it holds NUL or lone
    surrogates or starts with the mark (so every string has exactly one stored form)."""
    if "\x00" not in value and not value.startswith(_TEXT_MARK):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            pass
    return _TEXT_MARK + json.dumps(value, ensure_ascii=True)


def from_postgres_text(stored: str) -> str:
    """Inverse of `postgres_text`."""
    return json.loads(stored[1:]) if stored.startswith(_TEXT_MARK) else stored


# --- driver connections outside the store's transactions (migrations, tests) ----------------------------------------

class RawConnection:
    """A driver connection in autocommit mode, driven with SQLite-dialect SQL: what the migration runner needs.

    Use `raw_connection(conn)` to wrap a `sqlite3.Connection` or a `psycopg.Connection`.
    """

    backend: Backend
    errors: tuple[type[BaseException], ...]

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Cursor:
        """Run one SQLite-dialect statement."""
        raise NotImplementedError

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor:
        """Run one SQLite-dialect statement per parameter row."""
        raise NotImplementedError

    @property
    def autocommit(self) -> bool:
        """Whether the driver leaves transactions to us (BEGIN/COMMIT issued explicitly)."""
        raise NotImplementedError

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (or failed and not yet rolled back)."""
        raise NotImplementedError

    def begin_write(self) -> None:
        """Open a transaction holding the database's single write lock (waiting for it up to the busy timeout)."""
        raise NotImplementedError

    def commit(self) -> None:
        """Commit the open transaction."""
        self.execute("COMMIT")

    def rollback(self) -> None:
        """Roll the open transaction back."""
        self.execute("ROLLBACK")

    def table_exists(self, name: str) -> bool:
        """Whether a table of that name exists (in the current schema)."""
        raise NotImplementedError

    def ddl(self, statement: str) -> str:
        """A migration statement in this backend's dialect."""
        raise NotImplementedError

    def mark_schema_version(self, version: int) -> None:
        """Mirror the schema version where the backend has a place for it (SQLite's user_version)."""


class SqliteConnection(RawConnection):
    """`RawConnection` over sqlite3: the SQL is already in its dialect."""

    backend: Backend = "sqlite"
    errors = (sqlite3.Error,)

    def __init__(self, conn: sqlite3.Connection) -> None:
        """Wrap an open connection."""
        self.conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Cursor:
        """Run one statement."""
        return self.conn.execute(sql, parameters)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor:
        """Run one statement per row."""
        return self.conn.executemany(sql, rows)

    @property
    def autocommit(self) -> bool:
        """isolation_level None: sqlite3 opens no implicit transactions."""
        return self.conn.isolation_level is None

    @property
    def in_transaction(self) -> bool:
        """sqlite3's own flag."""
        return self.conn.in_transaction

    def begin_write(self) -> None:
        """IMMEDIATE takes the write lock up front (busy_timeout applies) instead of on the first write."""
        self.conn.execute("BEGIN IMMEDIATE")

    def table_exists(self, name: str) -> bool:
        """Look the table up in sqlite_schema."""
        return self.conn.execute("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?",
                                 (name,)).fetchone() is not None

    def ddl(self, statement: str) -> str:
        """Unchanged: the files are written for SQLite."""
        return statement

    def mark_schema_version(self, version: int) -> None:
        """For tools that only know PRAGMA user_version (it is transactional in SQLite)."""
        self.conn.execute(f"PRAGMA user_version = {int(version)}")


class PostgresConnection(RawConnection):
    """`RawConnection` over psycopg: placeholders and DDL translated, writes serialised by an advisory lock."""

    backend: Backend = "postgresql"

    def __init__(self, conn: Any) -> None:
        """Wrap an open psycopg connection."""
        import psycopg

        self.conn = conn
        self.errors = (psycopg.Error,)

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> Cursor:
        """Run one statement (always with parameters, so `%` is read the same way every time)."""
        return self.conn.execute(postgres_query(sql), tuple(parameters))  # type: ignore[no-any-return]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Cursor:
        """Run one statement per row."""
        cursor = self.conn.cursor()
        cursor.executemany(postgres_query(sql), [tuple(r) for r in rows])
        return cursor  # type: ignore[no-any-return]

    @property
    def autocommit(self) -> bool:
        """psycopg's autocommit flag."""
        return bool(self.conn.autocommit)

    @property
    def in_transaction(self) -> bool:
        """Anything but IDLE: a transaction is open, failed, or the connection is in an unknown state."""
        from psycopg.pq import TransactionStatus

        return bool(self.conn.info.transaction_status != TransactionStatus.IDLE)

    def begin_write(self) -> None:
        """SQLite lets one writer at a time in; the same transaction-scoped advisory lock on every write gives
        PostgreSQL that rule, so read-then-write code (next index, next version number) stays race-free. The wait is
        bounded by the connection's lock_timeout (the busy timeout)."""
        self.conn.execute("BEGIN")
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(WRITE_LOCK_NAME),))

    def begin_read(self) -> None:
        """One snapshot for every SELECT of the transaction, as SQLite's deferred read transaction gives."""
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")

    def table_exists(self, name: str) -> bool:
        """Look the table up in the connection's current schema."""
        row = self.conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = %s",
            (name,)).fetchone()
        return row is not None

    def ddl(self, statement: str) -> str:
        """See `postgres_ddl`."""
        return postgres_ddl(statement)


def raw_connection(conn: object) -> RawConnection:
    """Wrap a sqlite3 or psycopg connection for dialect-neutral use (a `RawConnection` is returned as it is).

    Raises:
        TypeError: Neither a sqlite3 nor a psycopg connection.
    """
    if isinstance(conn, RawConnection):
        return conn
    if isinstance(conn, sqlite3.Connection):
        return SqliteConnection(conn)
    if type(conn).__module__.split(".")[0] == "psycopg":
        return PostgresConnection(conn)
    raise TypeError(f"expected a sqlite3 or psycopg connection, got {type(conn).__name__}")
