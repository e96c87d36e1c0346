"""Reflection test fixtures: a real session log and a real embedded rubric bank in tmp_path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from learning.judge.buffer import RubricBuffer, save_buffer
from store.config import StoreConfig
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from tests.judge.builders import QUESTION
from tests.reflection.helpers import RUBRICS


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SessionLog]:
    """A fresh session log with the question's rubric buffer saved."""
    with SessionLog(tmp_path / "log.sqlite3") as session_log:
        buffer, _ = RubricBuffer.empty(QUESTION).add(RUBRICS)
        save_buffer(session_log, buffer)
        yield session_log


@pytest.fixture
def bank(tmp_path: Path) -> RubricBank:
    """A fresh embedded rubric bank (Chroma PersistentClient in tmp_path, bundled MiniLM)."""
    return RubricBank(StoreConfig(data_dir=tmp_path / "data"))
