"""The checkpoint tables of a fresh PostgreSQL database are created once, however many hosts start together.

Several hosts (two apps and a scheduler) open the checkpointer against one new database at the same moment; each
runs LangGraph's migrations, and without a lock two of them insert the same migration row and one run fails with a
unique violation (the failure CI met in `test_two_apps_and_a_scheduler_on_one_postgresql_store`).
"""

from __future__ import annotations

import asyncio

import pytest

from agent.checkpoint import CheckpointTarget, open_checkpointer


async def _open_all(url: str, n: int) -> list[int]:
    start = asyncio.Event()

    async def one() -> int:
        await start.wait()
        async with open_checkpointer(CheckpointTarget(database_url=url)) as saver:
            conn = saver.conn  # type: ignore[attr-defined]
            cur = await conn.execute("SELECT count(*) AS n FROM checkpoint_migrations")
            row = await cur.fetchone()
            return int(row["n"])

    tasks = [asyncio.create_task(one()) for _ in range(n)]
    await asyncio.sleep(0.05)
    start.set()
    return await asyncio.gather(*tasks)


@pytest.mark.parametrize("round_", range(3))
def test_hosts_opening_a_fresh_postgresql_checkpointer_together_all_succeed(postgres_url: str, round_: int) -> None:
    counts = asyncio.run(_open_all(postgres_url, 6))
    # Every opener sees the same complete migration history: each migration recorded exactly once.
    assert len(set(counts)) == 1 and counts[0] > 0
