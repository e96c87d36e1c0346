"""Store tests run on both backends: `store_target` is a fresh SQLite file or a fresh database on the real PostgreSQL
test server (tests/postgres.py), and a test opens as many `SessionLog`s on it as it needs."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from store.db import Backend, RawConnection, raw_connection
from store.session_log import SessionLog

BACKENDS: tuple[Backend, ...] = ("sqlite", "postgresql")


@dataclass(frozen=True)
class StoreTarget:
    """Where a test's store lives: a SQLite file, or a PostgreSQL database URL."""

    backend: Backend
    sqlite_path: Path | None = None
    database_url: str | None = None

    def open(self, **kwargs: Any) -> SessionLog:
        """A new SessionLog on this store (each call opens its own connection or pool)."""
        if self.database_url is not None:
            return SessionLog(database_url=self.database_url, **kwargs)
        return SessionLog(self.sqlite_path, **kwargs)

    @property
    def env(self) -> dict[str, str]:
        """How a child process finds the store (`open_target_from_env` in its code); the URL never goes in argv."""
        return {"STORE_TARGET": self.database_url or str(self.sqlite_path)}


# For child processes: `exec(OPEN_FROM_ENV)` defines `open_target(**kwargs) -> SessionLog` from STORE_TARGET.
OPEN_FROM_ENV = """
import os
from store import SessionLog
def open_target(**kwargs):
    target = os.environ["STORE_TARGET"]
    if target.startswith("postgresql://"):
        return SessionLog(database_url=target, **kwargs)
    return SessionLog(target, **kwargs)
"""


def make_target(request: pytest.FixtureRequest, backend: Backend, folder: Path) -> StoreTarget:
    """A fresh store of `backend`: a file under `folder`, or a new database (the server starts on first use)."""
    if backend == "sqlite":
        return StoreTarget("sqlite", sqlite_path=folder / "data" / "rubricem.sqlite3")
    return StoreTarget("postgresql", database_url=request.getfixturevalue("postgres_url"))


@pytest.fixture(params=BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    """A fresh, empty store of each backend in turn."""
    return make_target(request, request.param, tmp_path)


@pytest.fixture(scope="module", params=BACKENDS)
def module_store_target(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreTarget]:
    """A store shared by one module's tests (hypothesis runs many examples against one log)."""
    if request.param == "sqlite":
        yield StoreTarget("sqlite", sqlite_path=tmp_path_factory.mktemp("shared") / "log.sqlite3")
        return
    server = request.getfixturevalue("postgres_server")
    name = server.create_database()
    yield StoreTarget("postgresql", database_url=server.url(name))
    server.drop_database(name)


def count_rows(log: SessionLog, table: str) -> int:
    """Rows in a table of the log's database (table names are the test's own)."""
    with log.transaction(write=False) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


@contextmanager
def raw_connect(target: StoreTarget) -> Iterator[RawConnection]:
    """A plain driver connection to the store in autocommit mode (sqlite3, or psycopg), outside any SessionLog, wrapped
    so the test's SQL is written once (`?` placeholders) for both backends."""
    if target.database_url is not None:
        import psycopg

        pg = psycopg.connect(target.database_url, autocommit=True)
        try:
            yield raw_connection(pg)
        finally:
            pg.close()
        return
    lite = sqlite3.connect(target.sqlite_path, isolation_level=None)  # type: ignore[arg-type]
    try:
        yield raw_connection(lite)
    finally:
        lite.close()


def columns(conn: RawConnection, table: str) -> set[str]:
    """The column names of a table."""
    if conn.backend == "sqlite":
        return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    return {r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns "
                                       "WHERE table_schema = current_schema() AND table_name = ?", (table,))}
