"""Training checkpoints and the session log's backend (real accelerate on CPU): a SQLite run log is copied and put back
on restore; a PostgreSQL log, a shared database, is neither copied nor rolled back, and its checkpoint still counts as
complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from learning.checkpoint import LOG_COPY, latest_checkpoint, save_checkpoint
from store import PromptRecord, SessionLog

PROMPT = PromptRecord("p", (1, 2), "h")


@pytest.fixture(scope="module")
def accelerator() -> object:
    from accelerate import Accelerator

    return Accelerator(cpu=True)


def _ids(log: SessionLog) -> set[str]:
    return {s.session_id for s in log.list_sessions()}


def test_a_sqlite_run_log_is_copied_and_restored(accelerator: object, tmp_path: Path) -> None:
    with SessionLog(tmp_path / "rollouts.sqlite3") as log:
        kept = log.create_session("before the checkpoint?", PROMPT, {}, "base")
        path = save_checkpoint(tmp_path / "checkpoints", 0, accelerator, log, None, {"deferred": []})
        assert (path / LOG_COPY).is_file()
        log.create_session("after the checkpoint?", PROMPT, {}, "base")
        checkpoint = latest_checkpoint(tmp_path / "checkpoints")
        assert checkpoint is not None and checkpoint.step == 0
        assert checkpoint.restore(accelerator, log, None) == {"deferred": [], "step": 0}
        assert _ids(log) == {kept}  # the run's own log is back where the checkpoint left it


def test_a_postgresql_log_is_neither_copied_nor_rolled_back(accelerator: object, postgres_url: str,
                                                           tmp_path: Path) -> None:
    with SessionLog(database_url=postgres_url) as log:
        before = log.create_session("before the checkpoint?", PROMPT, {}, "base")
        path = save_checkpoint(tmp_path / "checkpoints", 3, accelerator, log, None, {"deferred": []})
        assert not (path / LOG_COPY).exists()
        after = log.create_session("after the checkpoint?", PROMPT, {}, "base")
        checkpoint = latest_checkpoint(tmp_path / "checkpoints")
        assert checkpoint is not None and checkpoint.step == 3  # complete without a copy
        state = checkpoint.restore(accelerator, log, None)
        assert state["step"] == 3 and state["deferred"] == []
        assert postgres_url.split("@")[0].split(":")[-1] not in str(state)  # the marker names no password
        assert _ids(log) == {before, after}  # other writers' rows are never erased
