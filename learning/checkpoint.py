"""Resumable training checkpoints: accelerate state (weights, optimizer, RNG), the run's session log (rollouts,
judgements, rubric buffers, reflection candidates), the run's rubric bank and the loop state (step, deferred
reflection batches), written to a temporary folder and renamed into place, so a crash never leaves a half checkpoint
that looks complete. A folder without a readable `state.json` naming its own step is corrupt and is skipped.

The session log is copied only when it is a SQLite file, which a training run's own log always is (`app.training`
opens RUN/rollouts.sqlite3 whatever the store's backend). A log on PostgreSQL is a shared database, not a run's
private file: it is never copied or rolled back (restoring a snapshot would erase what other writers added since), so
such a checkpoint records that nothing was copied and a resumed run keeps the rows of the interrupted step.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learning.errors import LearningError
from store.rubric_bank import RubricBank
from store.session_log import SessionLog

STATE = "state.json"
LOG_COPY = "session_log.sqlite3"
BANK_COPY = "bank.jsonl"
_LOG_NOT_COPIED = "log_not_copied"  # state key of a checkpoint whose session log is on PostgreSQL


class CheckpointError(LearningError):
    """A checkpoint could not be written or restored."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A complete checkpoint folder."""

    path: Path
    step: int
    state: dict[str, Any]

    def restore(self, accelerator: Any, log: SessionLog, bank: RubricBank | None) -> dict[str, Any]:
        """Load weights, optimizer and RNG; put the session log and the bank back as they were; return the state."""
        try:
            accelerator.load_state(str(self.path / "accelerate"))
        except Exception as exc:  # noqa: BLE001 - any failure here means the checkpoint is unusable
            raise CheckpointError(f"checkpoint {self.path} could not be loaded: {type(exc).__name__}: {exc}") from exc
        if log.path is not None and not self.state.get(_LOG_NOT_COPIED):
            _restore_sqlite(self.path / LOG_COPY, log.path)
        if bank is not None and (self.path / BANK_COPY).exists():
            bank.clear()
            bank.import_jsonl(self.path / BANK_COPY)
        return self.state


def _restore_sqlite(src: Path, log_path: Path) -> None:
    """Copy a checkpointed database over the live one through SQLite's backup API (safe with open connections)."""
    source = sqlite3.connect(str(src))
    target = sqlite3.connect(str(log_path), timeout=30)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


def save_checkpoint(root: Path, step: int, accelerator: Any, log: SessionLog, bank: RubricBank | None,
                    state: dict[str, Any]) -> Path:
    """Write checkpoint `step` under `root` atomically (temporary folder, then rename)."""
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp / "accelerate"))
    if accelerator.is_main_process:
        if log.path is None:
            state = state | {_LOG_NOT_COPIED: log.location}
        else:
            source = sqlite3.connect(str(log.path), timeout=30)
            target = sqlite3.connect(str(tmp / LOG_COPY))
            try:
                source.backup(target)
            finally:
                source.close()
                target.close()
        if bank is not None:
            bank.export_jsonl(tmp / BANK_COPY)
        (tmp / STATE).write_text(json.dumps(state | {"step": step}, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
    return final


def _read(path: Path) -> Checkpoint | None:
    try:
        state = json.loads((path / STATE).read_text())
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    has_log = (path / LOG_COPY).is_file() or bool(state.get(_LOG_NOT_COPIED))
    if path.name != f"step-{step:06d}" or not (path / "accelerate").is_dir() or not has_log:
        return None
    return Checkpoint(path, step, state)


def latest_checkpoint(root: Path, on_skip: Callable[[str], None] = lambda _m: None) -> Checkpoint | None:
    """The newest complete checkpoint; corrupt ones are reported through `on_skip` and passed over."""
    if not root.is_dir():
        return None
    for path in sorted(root.glob("step-*"), reverse=True):
        ckpt = _read(path)
        if ckpt is not None:
            return ckpt
        on_skip(f"skipping corrupt checkpoint {path} (missing or unreadable {STATE}, weights or session log)")
    return None


def prune_checkpoints(root: Path, keep: int) -> None:
    """Keep the newest `keep` complete checkpoints. Corrupt folders neither count towards `keep` (newer corrupt ones
    would otherwise push out the good checkpoint a resumed run came from) nor are removed (a resumed run overwrites
    them when it saves that step again)."""
    complete = [path for path in sorted(root.glob("step-*"), reverse=True) if _read(path) is not None]
    for path in complete[keep:]:
        shutil.rmtree(path, ignore_errors=True)
