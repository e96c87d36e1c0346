"""Resumable training checkpoints: accelerate state (weights, optimizer, RNG), the run's session log (rollouts,
judgements, rubric buffers, reflection candidates), the run's rubric bank and the loop state (step, deferred
reflection batches), written to a temporary folder and renamed into place, so a crash never leaves a half checkpoint
that looks complete. A folder without a readable `state.json` naming its own step is corrupt and is skipped.

Only the parameters the run trains are written (the LoRA adapter, its optimizer state beside it): the frozen base
weights are the model every start loads anyway, and writing them made each SmolLM2 checkpoint 314 MB instead of
57 MB (one per step in the learning curve and in tests). A restore checks that the file holds every trained
parameter before loading it non-strictly, so a checkpoint missing one is refused, never half-applied; a checkpoint
written with every weight (before this) still restores. DeepSpeed, FSDP and Megatron save and load the model their
own way: untouched.

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
            folder = str(self.path / "accelerate")
            if _plain(accelerator):
                handle = accelerator.register_load_state_pre_hook(_check_trained_weights)
                try:
                    accelerator.load_state(folder, strict=False)  # the frozen base weights are not in the file
                finally:
                    handle.remove()
            else:
                accelerator.load_state(folder)
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


def _plain(accelerator: Any) -> bool:
    """Whether accelerate saves the model's weights as one state dict per model (not DeepSpeed, FSDP or Megatron)."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP,
                                                DistributedType.MEGATRON_LM)


def _trained_names(model: Any) -> set[str]:
    return {name for name, param in model.named_parameters() if param.requires_grad}


def _trained_only(models: list[Any], weights: list[dict[str, Any]], _output_dir: str) -> None:
    """save_state pre-hook: keep the trained parameters of each model's state dict (all of it when none is frozen,
    or when the names do not line up, so nothing is ever dropped by mistake)."""
    for i, (model, state) in enumerate(zip(models, weights, strict=False)):
        names = _trained_names(model)
        if names and names <= state.keys() and len(names) < len(state):
            weights[i] = {k: v for k, v in state.items() if k in names}


def _check_trained_weights(models: list[Any], input_dir: str) -> None:
    """load_state pre-hook: raise unless each model's weights file holds every parameter it trains (the load that
    follows is non-strict and would skip one)."""
    from safetensors import safe_open

    for i, model in enumerate(models):
        path = Path(input_dir) / ("model.safetensors" if i == 0 else f"model_{i}.safetensors")
        if not path.is_file():  # save_checkpoint always writes safetensors
            raise CheckpointError(f"{path.name} is missing")
        with safe_open(str(path), framework="pt") as f:
            missing = _trained_names(model) - set(f.keys())
        if missing:
            raise CheckpointError(f"{path.name} lacks {len(missing)} trained parameter(s), e.g. {sorted(missing)[0]}")


def save_checkpoint(root: Path, step: int, accelerator: Any, log: SessionLog, bank: RubricBank | None,
                    state: dict[str, Any]) -> Path:
    """Write checkpoint `step` under `root` atomically (temporary folder, then rename)."""
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    handle = accelerator.register_save_state_pre_hook(_trained_only) if _plain(accelerator) else None
    try:
        accelerator.save_state(str(tmp / "accelerate"))
    finally:
        if handle is not None:
            handle.remove()
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
