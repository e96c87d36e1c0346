"""Numbered, forward-only SQLite migrations: `NNNN_name.sql` files in this folder, applied in order.

Each migration runs in its own `BEGIN IMMEDIATE` transaction together with its row in `schema_migrations` (and
`PRAGMA user_version`), so a failing migration leaves the schema exactly as it was, and two processes opening a new
database at once apply each migration exactly once. Applied migrations must never be edited: their checksum is kept.
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


def applied_migrations(conn: sqlite3.Connection) -> dict[int, str]:
    """Versions already applied to this database, mapped to their recorded checksums (empty for a new file)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if exists is None:
        return {}
    return {int(v): str(c) for v, c in conn.execute("SELECT version, checksum FROM schema_migrations")}


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


def apply_migrations(conn: sqlite3.Connection, migrations: tuple[Migration, ...] | None = None) -> tuple[int, ...]:
    """Bring a database up to date; re-running it is a no-op.

    Args:
        conn: A connection in autocommit mode (`isolation_level=None`) with no open transaction.
        migrations: The migrations to apply; defaults to `load_migrations()`.

    Returns:
        The versions this call applied (empty when the schema was already current).

    Raises:
        MigrationError: A migration failed (it was rolled back, earlier ones stay applied), the files are
            inconsistent, an applied file was edited, or the database is newer than the code.
    """
    if conn.isolation_level is not None or conn.in_transaction:
        raise MigrationError("apply_migrations needs an autocommit connection (isolation_level=None) outside a "
                             "transaction")
    todo = load_migrations() if migrations is None else migrations
    try:
        applied = applied_migrations(conn)
    except sqlite3.Error as exc:
        raise MigrationError(f"cannot read the schema version: {exc}") from exc
    _verify(applied, todo)
    if all(m.version in applied for m in todo):
        return ()  # fast path: no write lock taken when the schema is current
    done: list[int] = []
    for migration in todo:
        if _apply_one(conn, migration, todo):
            done.append(migration.version)
    return tuple(done)


def _apply_one(conn: sqlite3.Connection, migration: Migration, todo: tuple[Migration, ...]) -> bool:
    try:
        # IMMEDIATE takes the write lock before re-reading the version, so a concurrent opener waits, then skips.
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_BOOTSTRAP)
        applied = applied_migrations(conn)
        _verify(applied, todo)
        if migration.version in applied:
            conn.execute("COMMIT")
            return False
        for statement in split_statements(migration.sql):
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations (version, name, checksum, applied_at) VALUES (?, ?, ?, ?)",
            (migration.version, migration.name, migration.checksum,
             datetime.now(UTC).isoformat(timespec="microseconds")),
        )
        # Mirror the version for tools that only know PRAGMA user_version (it is transactional in SQLite).
        conn.execute(f"PRAGMA user_version = {int(migration.version)}")
        conn.execute("COMMIT")
        return True
    except (sqlite3.Error, MigrationError) as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if isinstance(exc, MigrationError):
            raise
        raise MigrationError(f"migration {migration.name} failed and was rolled back: {exc}") from exc
