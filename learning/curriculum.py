"""The windowed two-encounter curriculum (RubricEM App. D.3, METHOD §8): windows of 2K steps; steps 1..K take fresh
batches with cross-episode bank retrieval, steps K+1..2K replay the same batches in order with within-episode
retrieval (the reflection written at the first encounter).

Pure and stateless: the batch of any step is a function of (questions, batch size, K, seed, step), so resuming at a
step needs nothing but the step number. Fresh batches are cut from an endless stream of per-epoch permutations of
the question pool, so a pool size that does not divide by the batch size needs no special case (METHOD open point 21:
a batch may straddle two epochs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Mode = Literal["cross", "within", "none"]


@dataclass(frozen=True, slots=True)
class StepBatch:
    """The questions of one training step and the bank retrieval mode their rollouts use."""

    step: int
    indices: tuple[int, ...]  # positions in the question pool
    mode: Mode
    fresh_batch: int  # which fresh batch this is (a replay repeats the number of its first encounter)
    replay: bool


def _stream_slice(pool: int, start: int, count: int, seed: int) -> tuple[int, ...]:
    out: list[int] = []
    pos = start
    while len(out) < count:
        epoch, offset = divmod(pos, pool)
        order = list(range(pool))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        take = min(count - len(out), pool - offset)
        out += order[offset:offset + take]
        pos += take
    return tuple(out)


def step_batch(step: int, *, pool: int, batch_size: int, window: int = 3, seed: int = 0,
               use_bank: bool = True) -> StepBatch:
    """The batch of training step `step` (from 0).

    Args:
        step: the training step, from 0.
        pool: number of questions in the pool.
        batch_size: distinct questions per step.
        window: K (paper: 3); 0 or use_bank=False means fresh batches every step and no retrieval.
        seed: shuffling seed.
        use_bank: whether rollouts retrieve from the rubric bank at all.
    """
    if pool < 1 or batch_size < 1 or step < 0 or window < 0:
        raise ValueError("pool and batch_size must be >= 1, step and window >= 0")
    size = min(batch_size, pool)
    if not use_bank or window == 0:
        return StepBatch(step, _stream_slice(pool, step * size, size, seed), "none", step, False)
    w, pos = divmod(step, 2 * window)
    replay = pos >= window
    fresh = w * window + (pos - window if replay else pos)
    return StepBatch(step, _stream_slice(pool, fresh * size, size, seed), "within" if replay else "cross", fresh,
                     replay)
