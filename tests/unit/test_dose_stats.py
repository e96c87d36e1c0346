"""Issue 62 B's positive control (learning/eval/dose_stats.py): the step reward's interval, the trend's slope and
permutation p, and the KL against the engines' gap, on rows shaped like `learning.grpo`'s."""

from __future__ import annotations

import numpy as np
import pytest

from learning.eval.dose_stats import positive_control, slope, step_reward, trend


def _rows(means: list[float], kls: list[float], gap: float = 0.004, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"step": i, "task/kl": kl, "task/sampler_kl": gap,
             "reward/rollout_totals": [list(np.clip(m + rng.normal(0, 0.05, 4), 0, 1)) for _ in range(4)]}
            for i, (m, kl) in enumerate(zip(means, kls, strict=True))]


def test_the_step_reward_interval_covers_its_mean_and_narrows_with_agreement() -> None:
    wide = step_reward([[0.0, 1.0], [0.0, 1.0]], draws=2000)
    narrow = step_reward([[0.5, 0.5], [0.5, 0.5]], draws=2000)
    assert wide["mean"] == 0.5 and wide["lo"] < 0.5 < wide["hi"] and wide["rollouts"] == 4
    assert narrow["lo"] == narrow["hi"] == 0.5
    uneven = step_reward([[1.0], [0.0, 0.0, 0.0]], draws=2000)  # questions with fewer rollouts (dropped ones)
    assert uneven["mean"] == 0.25 and 0.0 <= uneven["lo"] <= uneven["hi"] <= 1.0
    assert np.isnan(step_reward([])["mean"])


def test_a_rising_reward_and_a_moving_policy_pass_and_a_flat_one_does_not() -> None:
    assert slope([0.0, 1.0, 2.0]) == pytest.approx(1.0)
    steps = 24
    rising = positive_control(_rows([0.5 + 0.01 * i for i in range(steps)], [0.004 * i for i in range(steps)]),
                              draws=2000)
    assert rising["reward_rose"] and rising["moved"] and rising["passed"]
    assert rising["trend"]["slope"] == pytest.approx(0.01, abs=0.004) and rising["trend"]["p"] < 0.01
    assert rising["trend"]["lo"] > 0 and rising["kl_last"] == pytest.approx(0.092)
    assert len(rising["steps"]) == steps and all(s["lo"] <= s["mean"] <= s["hi"] for s in rising["steps"])
    flat = positive_control(_rows([0.5] * steps, [0.003] * steps, seed=1), draws=2000)
    assert not flat["reward_rose"] and not flat["moved"] and not flat["passed"] and flat["trend"]["p"] > 0.05
    # moved past 0.05 but not 10x a large engine gap: not enough
    assert not positive_control(_rows([0.5] * 3, [0.0, 0.04, 0.06], gap=0.01), draws=200)["moved"]
    t = trend([0.3, 0.2, 0.1], [np.array([]), np.array([]), np.array([])], draws=500)
    assert t["slope"] < 0 and np.isnan(t["lo"])  # no bootstrap draws: no interval, the slope and p still stand
