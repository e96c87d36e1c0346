"""The SS-GRPO trainer's checkpoints (learning/checkpoint.py), with real accelerate state on CPU: a corrupt or partial
checkpoint is skipped in favour of the newest good one and the reason is reported; pruning keeps exactly the newest
`keep` and never deletes the checkpoint a run would resume from (issue 35, "Untested paths").

Why it matters: a run resumes from `latest_checkpoint` after a crash. If it picked a half-written folder it would fail
or load garbage; if pruning removed the last good folder a crash would lose the whole run.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from learning.checkpoint import (
    LOG_COPY,
    STATE,
    Checkpoint,
    CheckpointError,
    latest_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from store import SessionLog

REASON = "(missing or unreadable state.json, weights or session log)"


@pytest.fixture(scope="module")
def trained() -> tuple[Any, torch.nn.Linear]:
    """An accelerator with a prepared 2×2 linear model and optimizer, so save_state writes real weights."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model


@pytest.fixture
def log(tmp_path: Path) -> Iterator[SessionLog]:
    with SessionLog(tmp_path / "rollouts.sqlite3") as session_log:
        yield session_log


def _save_steps(root: Path, steps: range, trained: tuple[Any, torch.nn.Linear], log: SessionLog) -> None:
    """Checkpoint each step with the weights filled with the step number (which checkpoint was loaded is visible)."""
    accelerator, model = trained
    for step in steps:
        with torch.no_grad():
            model.weight.fill_(float(step))
        save_checkpoint(root, step, accelerator, log, None, {"deferred": [f"batch-{step}"]})


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def _latest(root: Path) -> tuple[Checkpoint | None, list[str]]:
    skipped: list[str] = []
    return latest_checkpoint(root, on_skip=skipped.append), skipped


def test_each_kind_of_corrupt_or_partial_checkpoint_is_skipped_for_the_newest_good_one(
        trained: tuple[Any, torch.nn.Linear], log: SessionLog, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save_steps(root, range(8), trained, log)
    # Newest first, each folder broken a different way; step 1 stays good.
    state7 = (root / "step-000007" / STATE).read_text()
    (root / "step-000007" / STATE).write_text(state7[: len(state7) // 2])  # truncated: not JSON
    (root / "step-000006" / STATE).write_text(json.dumps({"deferred": []}))  # JSON without its step
    (root / "step-000005" / STATE).write_text(json.dumps({"step": 9, "deferred": []}))  # names another step
    (root / "step-000004" / STATE).write_text(json.dumps(["step", 4]))  # not an object
    (root / "step-000003" / LOG_COPY).unlink()  # the session log copy is missing
    shutil.rmtree(root / "step-000002" / "accelerate")  # the weights folder is missing
    (root / "step-000008").mkdir()  # an empty folder: no state.json at all (e.g. a copy that never started)
    # A crash during save leaves the temporary folder: complete-looking, newer, but never taken.
    shutil.copytree(root / "step-000001", root / ".step-000009.tmp")
    (root / ".step-000009.tmp" / STATE).write_text(json.dumps({"step": 9, "deferred": []}))

    checkpoint, skipped = _latest(root)

    assert checkpoint is not None and checkpoint.step == 1 and checkpoint.path == root / "step-000001"
    assert skipped == [f"skipping corrupt checkpoint {root / f'step-{s:06d}'} {REASON}" for s in (8, 7, 6, 5, 4, 3, 2)]
    accelerator, model = trained
    with torch.no_grad():
        model.weight.fill_(-1.0)
    assert checkpoint.restore(accelerator, log, None) == {"deferred": ["batch-1"], "step": 1}
    assert model.weight.tolist() == [[1.0, 1.0], [1.0, 1.0]]  # step 1's weights, not a newer broken one's


def test_nothing_usable_gives_none_and_reports_every_folder(trained: tuple[Any, torch.nn.Linear], log: SessionLog,
                                                            tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save_steps(root, range(2), trained, log)
    for step in range(2):
        (root / f"step-{step:06d}" / STATE).write_text("{")
    checkpoint, skipped = _latest(root)
    assert checkpoint is None
    assert skipped == [f"skipping corrupt checkpoint {root / f'step-{s:06d}'} {REASON}" for s in (1, 0)]
    assert _latest(tmp_path / "absent") == (None, [])  # no folder at all: a fresh run, nothing to report


def test_a_truncated_weights_file_passes_the_cheap_check_and_fails_loudly_on_restore(
        trained: tuple[Any, torch.nn.Linear], log: SessionLog, tmp_path: Path) -> None:
    """The folder check reads state.json only; a weights file damaged after the atomic rename is caught by restore,
    which raises CheckpointError naming the folder rather than training on partial weights."""
    root = tmp_path / "checkpoints"
    _save_steps(root, range(2), trained, log)
    weights = root / "step-000001" / "accelerate" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:10])
    checkpoint, skipped = _latest(root)
    assert checkpoint is not None and checkpoint.step == 1 and skipped == []
    accelerator, _ = trained
    with pytest.raises(CheckpointError, match=rf"^checkpoint {root / 'step-000001'} could not be loaded: "):
        checkpoint.restore(accelerator, log, None)


def test_saving_a_step_again_replaces_its_folder_and_clears_a_stale_temporary(
        trained: tuple[Any, torch.nn.Linear], log: SessionLog, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save_steps(root, range(1), trained, log)
    (root / ".step-000001.tmp").mkdir()
    (root / ".step-000001.tmp" / "junk").write_text("left by a crash")
    (root / "step-000000" / STATE).write_text("{")  # corrupt: a resumed run redoes and re-saves step 0
    _save_steps(root, range(2), trained, log)
    assert _names(root) == ["step-000000", "step-000001"]
    checkpoint, skipped = _latest(root)
    assert checkpoint is not None and checkpoint.step == 1 and skipped == []
    assert json.loads((root / "step-000000" / STATE).read_text()) == {"deferred": ["batch-0"], "step": 0}


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_pruning_keeps_exactly_the_newest_keep(keep: int, trained: tuple[Any, torch.nn.Linear], log: SessionLog,
                                               tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    _save_steps(root, range(5), trained, log)
    (root / ".step-000005.tmp").mkdir()  # an unfinished save is not a checkpoint: neither counted nor removed
    prune_checkpoints(root, keep)
    assert _names(root) == [".step-000005.tmp"] + [f"step-{s:06d}" for s in range(5 - keep, 5)]
    checkpoint, _ = _latest(root)
    assert checkpoint is not None and checkpoint.step == 4


def test_pruning_after_a_resume_never_deletes_the_checkpoint_resumed_from(
        trained: tuple[Any, torch.nn.Linear], log: SessionLog, tmp_path: Path) -> None:
    """The trainer's sequence (learning/grpo.py): resume from the newest good checkpoint past corrupt newer ones,
    save the next step, prune to `keep_checkpoints`. Corrupt folders must not count towards `keep`, or pruning
    deletes the good checkpoints and the next restart finds nothing usable."""
    root = tmp_path / "checkpoints"
    _save_steps(root, range(6), trained, log)
    for step in (4, 5):
        (root / f"step-{step:06d}" / STATE).write_text("{")  # damaged after they were written
    resumed, skipped = _latest(root)
    assert resumed is not None and resumed.step == 3 and len(skipped) == 2

    prune_checkpoints(root, 1)  # before the first new save: the folder resumed from stays
    assert (root / "step-000003" / STATE).is_file()
    _save_steps(root, range(4, 5), trained, log)  # the resumed run's first step, 4, replaces the corrupt folder
    prune_checkpoints(root, 1)

    assert (root / "step-000004" / STATE).is_file()  # the newest good checkpoint survives keep = 1
    checkpoint, _ = _latest(root)
    assert checkpoint is not None and checkpoint.step == 4
    # The older good ones are pruned; the corrupt step 5 is left for the run to overwrite when it saves step 5.
    assert _names(root) == ["step-000004", "step-000005"]


def test_only_trained_parameters_are_written_and_a_file_missing_one_is_refused(log: SessionLog,
                                                                               tmp_path: Path) -> None:
    """A frozen base and a trained adapter, as in a LoRA run: the checkpoint holds the adapter only (the base is what
    every start loads), a restore puts the adapter back and leaves the base alone, and a weights file that lacks a
    trained parameter is refused rather than loaded non-strictly."""
    from accelerate import Accelerator
    from safetensors import safe_open
    from safetensors.torch import save_file

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 2, bias=False))
    model[0].weight.requires_grad_(False)  # the "base"
    optimizer = torch.optim.SGD([model[1].weight], lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    base = model[0].weight.detach().clone()
    with torch.no_grad():
        model[1].weight.fill_(3.0)
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 0, accelerator, log, None, {})
    weights = root / "step-000000" / "accelerate" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        assert set(f.keys()) == {"1.weight"}
    with torch.no_grad():
        model[1].weight.fill_(0.0)
    checkpoint = latest_checkpoint(root)
    assert checkpoint is not None
    checkpoint.restore(accelerator, log, None)
    assert torch.equal(model[1].weight, torch.full((2, 4), 3.0)) and torch.equal(model[0].weight, base)

    save_file({"0.weight": base}, str(weights))  # the trained parameter is gone: a non-strict load would skip it
    with pytest.raises(CheckpointError, match=r"model.safetensors lacks 1 trained parameter\(s\), e.g. 1.weight"):
        checkpoint.restore(accelerator, log, None)
