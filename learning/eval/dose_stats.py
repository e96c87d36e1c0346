"""The positive control of a training run (issue 62, part B; docs/learning/training/PREREGISTRATION.md): did the
training reward rise, and did the policy move further than the engines' own rounding? Pure maths over the run's
metrics rows (`learning.grpo` writes one per step), no I/O.

- The step's training reward is the mean of its rollouts' totals (`reward/rollout_totals`: the mean of the stage
  scores, one list per question). Its 95 % interval is a hierarchical bootstrap: questions resampled, then the
  rollouts inside each drawn question.
- The trend is the least-squares slope of the step rewards over the step index; its p is a two-sided permutation
  test (the step rewards shuffled over the steps, 10,000 times), which needs no normality. Its interval is a
  bootstrap over the steps' own intervals: each draw takes one bootstrap mean per step and refits the slope.
- Movement: `task/kl` is the per-token KL to the anchor (the start adapter) that each update measures before its
  step, so the last row shows the policy after all but the last update. The engine gap is the median of
  `task/sampler_kl` (the rollout engine against the trainer on the same weights). The control passes when the last
  KL is at least 10 times the gap and at least 0.05.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

B = 10_000
KL_FLOOR = 0.05
KL_TIMES_GAP = 10.0


def step_reward(groups: Sequence[Sequence[float]], draws: int = B, seed: int = 0) -> dict[str, Any]:
    """The mean rollout total of one step with its hierarchical-bootstrap interval and bootstrap means."""
    groups = [list(g) for g in groups if len(g)]
    if not groups:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "rollouts": 0, "boot": np.array([])}
    rng = np.random.default_rng(seed)
    width = max(len(g) for g in groups)
    table = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        table[i, : len(g)] = g
    counts = np.array([len(g) for g in groups])
    qs = rng.integers(0, len(groups), size=(draws, len(groups)))
    # inside each drawn question, its own rollouts resampled (indices below that question's count)
    rs = (rng.random((draws, len(groups), width)) * counts[qs][:, :, None]).astype(int)
    picked = table[qs[:, :, None], rs]
    mask = np.arange(width)[None, None, :] < counts[qs][:, :, None]
    boot = np.nansum(np.where(mask, picked, 0.0), axis=(1, 2)) / mask.sum(axis=(1, 2))
    flat = [x for g in groups for x in g]
    return {"mean": float(np.mean(flat)), "lo": float(np.percentile(boot, 2.5)),
            "hi": float(np.percentile(boot, 97.5)), "rollouts": len(flat), "boot": boot}


def slope(y: Sequence[float]) -> float:
    """The least-squares slope of y over 0, 1, 2, …"""
    x = np.arange(len(y), dtype=float)
    yy = np.asarray(y, dtype=float)
    return float(np.polyfit(x, yy, 1)[0]) if len(y) >= 2 else float("nan")


def trend(rewards: Sequence[float], boots: Sequence[np.ndarray], draws: int = B, seed: int = 1) -> dict[str, float]:
    """The slope of the step rewards with its bootstrap interval and two-sided permutation p."""
    obs = slope(rewards)
    rng = np.random.default_rng(seed)
    y = np.asarray(rewards, dtype=float)
    perm = np.array([slope(rng.permutation(y)) for _ in range(draws)])
    p = float(np.mean(np.abs(perm) >= abs(obs) - 1e-12))
    usable = [b for b in boots if len(b)]
    if len(usable) == len(rewards) and len(rewards) >= 2:
        n = min(len(b) for b in usable)
        stacked = np.stack([b[:n] for b in usable])  # steps x draws
        x = np.arange(len(rewards), dtype=float)
        xc = x - x.mean()
        slopes = (xc[:, None] * (stacked - stacked.mean(axis=0))).sum(axis=0) / (xc ** 2).sum()
        lo, hi = float(np.percentile(slopes, 2.5)), float(np.percentile(slopes, 97.5))
    else:
        lo = hi = float("nan")
    return {"slope": obs, "lo": lo, "hi": hi, "p": max(p, 1 / draws), "steps": len(rewards)}


def positive_control(rows: Sequence[Mapping[str, Any]], draws: int = B) -> dict[str, Any]:
    """Per-step rewards with intervals, the trend, the KL against the engine gap, and whether the control passed."""
    steps = []
    boots = []
    for r in rows:
        s = step_reward(r.get("reward/rollout_totals") or [], draws, seed=int(r.get("step", 0)))
        boots.append(s.pop("boot"))
        steps.append({"step": int(r["step"]), "kl": r.get("task/kl"), "sampler_kl": r.get("task/sampler_kl")} | s)
    rewards = [s["mean"] for s in steps]
    t = trend(rewards, boots, draws) if len(steps) >= 3 else None
    gaps = [float(r["task/sampler_kl"]) for r in rows if r.get("task/sampler_kl") is not None]
    gap = float(np.median(gaps)) if gaps else float("nan")
    kl = next((float(r["task/kl"]) for r in reversed(rows) if r.get("task/kl") is not None), float("nan"))
    moved = bool(kl >= KL_FLOOR and kl >= KL_TIMES_GAP * gap)
    rose = bool(t is not None and t["slope"] > 0 and t["p"] < 0.05)
    return {"steps": steps, "trend": t, "kl_last": kl, "engine_gap": gap, "moved": moved, "reward_rose": rose,
            "passed": moved and rose}
