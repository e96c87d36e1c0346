"""Numbered, forward-only migrations: `NNNN_name.sql` files in this folder, applied in order, on SQLite or PostgreSQL.

The files are written in SQLite's dialect (type names in upper case, column names in lower case) and translated for
PostgreSQL by `store.db.dialect.postgres_ddl`. Each migration runs in its own transaction holding the database's
write lock (SQLite `BEGIN IMMEDIATE`, PostgreSQL the store's advisory write lock; DDL is transactional in both)
together with its row in `schema_migrations` (and SQLite's `PRAGMA user_version`), so a failing migration leaves the
schema exactly as it was, and two processes opening a new database at once apply each migration exactly once.
Applied migrations must never be edited: their checksum (of the one file, whichever backend ran it) is kept.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from store.db.dialect import RawConnection, raw_connection
from store.errors import MigrationError

__all__ = ["Migration", "apply_migrations", "applied_migrations", "load_migrations", "split_statements"]

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Statements that would break the one-transaction-per-migration rule (or cannot run inside a transaction).
_FORBIDDEN_FIRST_WORDS = frozenset({"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA", "VACUUM",
                                    "ATTACH", "DETACH"})
_BOOTSTRAP = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    checksum   TEXT NOT NULL,
    applied_at TEXT NOT NULL
)
"""


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema change: version N comes from the `NNNN_` file-name prefix."""

    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        """SHA-256 of the SQL with line endings normalised (a git autocrlf checkout must not look like an edit)."""
        return hashlib.sha256(self.sql.replace("\r\n", "\n").encode("utf-8")).hexdigest()


def split_statements(sql: str) -> list[str]:
    """Split a SQL script into single statements, respecting string literals, comments and trigger bodies.

    Args:
        sql: The script.

    Returns:
        The statements in order; comment-only or blank remainders are dropped.
    """
    statements: list[str] = []
    start = 0
    for pos, char in enumerate(sql):
        # sqlite3.complete_statement knows about quotes, comments and CREATE TRIGGER ... END, so a ';' only ends a
        # statement when the text up to it is complete.
        if char == ";" and sqlite3.complete_statement(sql[start : pos + 1]):
            statements.append(sql[start : pos + 1].strip())
            start = pos + 1
    rest = sql[start:]
    if _strip_comments(rest).strip():
        statements.append(rest.strip())
    return statements


def _strip_comments(sql: str) -> str:
    without_block = re.sub(r"/\*.*?\*/", " ", sql, flags=re.DOTALL)
    return re.sub(r"--[^\n]*", " ", without_block)


def _check_statements(name: str, sql: str) -> None:
    for statement in split_statements(sql):
        words = _strip_comments(statement).split()
        first = words[0].upper().rstrip(";") if words else ""
        if first in _FORBIDDEN_FIRST_WORDS:
            raise MigrationError(f"migration {name}: {first} statements are not allowed (each migration already runs "
                                 "in one transaction; connection PRAGMAs belong in the store's connect code)")


def load_migrations(directory: Path | Traversable | None = None) -> tuple[Migration, ...]:
    """Read and validate the migration files.

    Args:
        directory: Folder of `NNNN_name.sql` files; defaults to the ones shipped in this package.

    Returns:
        The migrations ordered by version.

    Raises:
        MigrationError: A `.sql` file is misnamed, versions are not 1..N without gaps or duplicates, or a file uses
            a statement that cannot run inside the migration's transaction.
    """
    folder: Path | Traversable = directory if directory is not None else resources.files(__name__)
    found: dict[int, Migration] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.match(entry.name)
        if match is None:
            raise MigrationError(f"migration file {entry.name!r} must be named NNNN_lower_snake.sql")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"two migration files share version {version}: {found[version].name}, {entry.name}")
        sql = entry.read_text(encoding="utf-8")
        _check_statements(entry.name, sql)
        found[version] = Migration(version=version, name=entry.name, sql=sql)
    versions = sorted(found)
    if versions != list(range(1, len(versions) + 1)):
        raise MigrationError(f"migration versions must be 1..N without gaps; found {versions}")
    return tuple(found[v] for v in versions)


def applied_migrations(conn: object) -> dict[int, str]:
    """Versions already applied to this database, mapped to their recorded checksums (empty for a new database).

    Args:
        conn: A `sqlite3.Connection` or `psycopg.Connection` (or a `RawConnection` wrapping one).
    """
    db = raw_connection(conn)
    if not db.table_exists("schema_migrations"):
        return {}
    return {int(v): str(c) for v, c in db.execute("SELECT version, checksum FROM schema_migrations")}


def _verify(applied: dict[int, str], migrations: tuple[Migration, ...]) -> None:
    known = {m.version: m for m in migrations}
    newer = sorted(v for v in applied if v not in known)
    if newer:
        raise MigrationError(
            f"the database has schema version(s) {newer} that this code does not know (it knows up to "
            f"{len(migrations)}); it was written by a newer rubricem - upgrade instead of downgrading"
        )
    for version, checksum in applied.items():
        if known[version].checksum != checksum:
            raise MigrationError(
                f"migration {known[version].name} was edited after it was applied; migrations are forward-only, "
                "add a new numbered file instead"
            )


def apply_migrations(conn: object, migrations: tuple[Migration, ...] | None = None) -> tuple[int, ...]:
    """Bring a database up to date; re-running it is a no-op.

    Args:
        conn: A `sqlite3.Connection` in autocommit mode (`isolation_level=None`) or a `psycopg.Connection` with
            `autocommit=True` (or a `RawConnection` wrapping one), with no open transaction.
        migrations: The migrations to apply; defaults to `load_migrations()`.

    Returns:
        The versions this call applied (empty when the schema was already current).

    Raises:
        MigrationError: A migration failed (it was rolled back, earlier ones stay applied), the files are
            inconsistent, an applied file was edited, or the database is newer than the code.
    """
    try:
        db = raw_connection(conn)
    except TypeError as exc:
        raise MigrationError(str(exc)) from exc
    if not db.autocommit or db.in_transaction:
        raise MigrationError("apply_migrations needs an autocommit connection (sqlite3: isolation_level=None; "
                             "psycopg: autocommit=True) outside a transaction")
    todo = load_migrations() if migrations is None else migrations
    try:
        applied = applied_migrations(db)
    except db.errors as exc:
        raise MigrationError(f"cannot read the schema version: {exc}") from exc
    _verify(applied, todo)
    if all(m.version in applied for m in todo):
        return ()  # fast path: no write lock taken when the schema is current
    done: list[int] = []
    for migration in todo:
        if _apply_one(db, migration, todo):
            done.append(migration.version)
    return tuple(done)


def _apply_one(db: RawConnection, migration: Migration, todo: tuple[Migration, ...]) -> bool:
    try:
        # The write lock is taken before re-reading the version, so a concurrent opener waits, then skips.
        db.begin_write()
        db.execute(db.ddl(_BOOTSTRAP))
        applied = applied_migrations(db)
        _verify(applied, todo)
        if migration.version in applied:
            db.commit()
            return False
        for statement in split_statements(migration.sql):
            db.execute(db.ddl(statement))
        db.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
            (migration.version, migration.name, migration.checksum,
             datetime.now(UTC).isoformat(timespec="microseconds")),
        )
        db.mark_schema_version(migration.version)
        db.commit()
        return True
    except (*db.errors, MigrationError, ValueError) as exc:
        if db.in_transaction:
            db.rollback()
        if isinstance(exc, MigrationError):
            raise
        raise MigrationError(f"migration {migration.name} failed and was rolled back: {exc}") from exc
