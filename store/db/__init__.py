"""The database under the store, SQLite (the default) or PostgreSQL, and every difference between the two.

- `dialect`: query text, the migrations' DDL, stored text, dialect-neutral driver connections (pure; no driver import);
- `sqlite`: one connection to a file in WAL mode (PRAGMAs, the retry while another opener switches to WAL, forks);
- `postgres`: a psycopg connection pool, the store-wide write lock, error mapping that never shows the password, and
  the named advisory lock behind the retraining cycle lock (psycopg is imported only when PostgreSQL is used).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import SecretStr

from store.db.dialect import Backend, Connection, Cursor, RawConnection, json_number, raw_connection

__all__ = ["Backend", "Connection", "Cursor", "RawConnection", "advisory_lock", "json_number", "raw_connection"]


@contextmanager
def advisory_lock(database_url: str | SecretStr, name: str) -> Iterator[None]:
    """Hold the named PostgreSQL advisory lock of the database for the block (see `store.db.postgres.advisory_lock`).

    Raises:
        LockHeld: Another session holds it.
    """
    from store.db.postgres import advisory_lock as hold

    with hold(database_url, name):
        yield
