"""LangGraph's checkpointer for durable sessions: one thread per session (issue 21).

SQLite (a file beside the session log's) or PostgreSQL (the store's database) through the official
`langgraph-checkpoint-sqlite` / `-postgres` savers. The state is serialised with msgpack and an explicit allow-list
of the project's record types, so a checkpoint can never revive an arbitrary class.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from store.db.sqlite import is_busy

# Every non-builtin type that can sit in ResearchState (agent.state).
STATE_TYPES: tuple[tuple[str, str], ...] = (
    ("store.records", "Turn"),
    ("store.records", "ToolCallRecord"),
    ("store.records", "Snippet"),
    ("agent.protocols", "PromptContext"),
    ("agent.parse", "ParsedCall"),
)


def _retuple(value: Any) -> Any:
    """msgpack has no tuple: the records' tuple fields (token ids, logprobs, snippets) come back as lists."""
    if isinstance(value, list):
        return [_retuple(v) for v in value]
    if isinstance(value, dict):
        return {k: _retuple(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if isinstance(v, list):
                changes[f.name] = tuple(_retuple(x) for x in v)
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                changes[f.name] = _retuple(v)
        return dataclasses.replace(value, **changes) if changes else value
    return value


class StateSerializer(JsonPlusSerializer):
    """msgpack with only the state's own record types allowed back, tuples restored."""

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return _retuple(super().loads_typed(data))


def serializer() -> JsonPlusSerializer:
    """The checkpoints' serializer."""
    return StateSerializer(allowed_msgpack_modules=list(STATE_TYPES))


# The advisory lock that serialises the checkpoint tables' migrations across hosts.
CHECKPOINT_SETUP_LOCK = "rubricem.checkpoint.setup"


@dataclass(frozen=True, slots=True)
class CheckpointTarget:
    """Where checkpoints go: a SQLite file, or a PostgreSQL database URL (exactly one)."""

    sqlite_path: Path | None = None
    database_url: str | None = None

    def __post_init__(self) -> None:
        if (self.sqlite_path is None) == (self.database_url is None):
            raise ValueError("a checkpoint target is a SQLite path or a PostgreSQL URL (exactly one)")

    @property
    def location(self) -> str:
        """For messages: the file, or the database's host (never the password)."""
        if self.sqlite_path is not None:
            return str(self.sqlite_path)
        return "postgresql://" + str(self.database_url).rsplit("@", 1)[-1]


# How long a checkpoint write waits for another session's lock on the SQLite file (its busy_timeout).
SQLITE_BUSY_S = 10.0


async def _enable_wal(conn: Any) -> None:
    """Switch the file to WAL, retrying while another connection holds its lock, for up to SQLITE_BUSY_S.

    A journal-mode change takes the file's exclusive lock and SQLite answers a contender "database is locked" at once,
    without calling its busy handler; so sessions that start together on a fresh data folder (a batch's first items)
    would fail at their first checkpoint. The store's own log retries the same way (`store.db.sqlite`), with the
    same test for a busy lock (`is_busy`).
    """
    deadline = time.monotonic() + SQLITE_BUSY_S
    while True:
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


async def _try_lock(conn: Any, key: int) -> bool:
    cur = await conn.execute("SELECT pg_try_advisory_lock(%s) AS taken", (key,))
    row = await cur.fetchone()  # the saver's connection returns rows as dicts
    return bool(row["taken"])


@asynccontextmanager
async def open_checkpointer(target: CheckpointTarget) -> AsyncIterator[BaseCheckpointSaver[str]]:
    """An async saver for one run's event loop (aiosqlite and psycopg connections belong to one loop)."""
    if target.sqlite_path is not None:
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        target.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        async with aiosqlite.connect(str(target.sqlite_path)) as conn:
            await conn.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_S * 1000)}")
            # WAL: a reader (the UI) never blocks a running session's writes; NORMAL sync survives a process crash.
            await _enable_wal(conn)
            await conn.execute("PRAGMA synchronous=NORMAL")
            saver = AsyncSqliteSaver(conn, serde=serializer())
            await saver.setup()
            yield saver
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    from store.db.dialect import advisory_key

    async with AsyncPostgresSaver.from_conn_string(str(target.database_url), serde=serializer()) as pg:
        # setup() is idempotent for one caller but not for several at once: hosts starting together on a fresh
        # database would each insert the same migration row. A session advisory lock runs them one after another.
        # It is polled with pg_try_advisory_lock, not awaited with pg_advisory_lock: a waiter blocked inside a
        # statement is an open transaction, and the holder's CREATE INDEX CONCURRENTLY waits for every open
        # transaction to end, which PostgreSQL reports as a deadlock.
        key = advisory_key(CHECKPOINT_SETUP_LOCK)
        while not await _try_lock(pg.conn, key):
            await asyncio.sleep(0.05)
        try:
            await pg.setup()  # creates or migrates the checkpoint tables
        finally:
            await pg.conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        yield pg
