"""The statistics of a held-out learning curve (issue 38), pure functions over per-sample records.

A record is one held-out session: `{"item": id, "scores": {plan, research, review, answer, total}, "figures":
{gold_recall, citation_precision, ...}}` (learning/eval/heldout.py says what each figure is). The unit of every
interval and test is the held-out question: its samples (and, pooled over seeds, every seed's samples) are averaged
first, because the samples of one question are not independent. Intervals are percentile bootstraps over questions;
paired tests are two-sided sign-flip permutation tests over the questions both sides answered (exact up to 16
questions, Monte Carlo beyond). Both are vectorised (numpy): a report holds hundreds of them.

A figure that an item does not have (no gold passages: None) leaves that item out of that figure only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from learning.eval.heldout import FIGURES
from store.records import STAGES

REWARDS = (*STAGES, "total")
METRICS = (*REWARDS, *FIGURES)
Record = Mapping[str, Any]


def value(record: Record, metric: str) -> float | None:
    """The record's value of `metric` (a judge reward or a held-out figure); None where it has none."""
    got = (record.get("scores") or {}).get(metric) if metric in REWARDS else (record.get("figures") or {}).get(metric)
    return None if got is None else float(got)


def question_means(records: Iterable[Record], metric: str) -> dict[str, float]:
    """item id -> the mean of `metric` over that item's records (items without a value are absent)."""
    by_item: dict[str, list[float]] = {}
    for r in records:
        v = value(r, metric)
        if v is not None and math.isfinite(v):
            by_item.setdefault(str(r["item"]), []).append(v)
    return {k: statistics.fmean(v) for k, v in sorted(by_item.items())}


def _bootstrap(values: Sequence[float], resamples: int, seed: int) -> tuple[float, float]:
    """The 2.5 and 97.5 percentiles of the mean over `resamples` resamples with replacement."""
    import numpy as np

    x = np.asarray(values, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    low, high = np.quantile(x[picks].mean(axis=1), [0.025, 0.975])
    return float(low), float(high)


def mean_ci(records: Iterable[Record], metric: str, resamples: int = 2000, seed: int = 0) -> dict[str, float]:
    """Mean over questions with a 95 % bootstrap interval; `n` questions."""
    per_q = list(question_means(records, metric).values())
    if not per_q:
        return {"mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": 0}
    low, high = _bootstrap(per_q, resamples, seed) if len(per_q) > 1 else (per_q[0], per_q[0])
    return {"mean": round(statistics.fmean(per_q), 4), "ci_low": round(low, 4), "ci_high": round(high, 4),
            "n": len(per_q)}


def sign_flip_p(diffs: Sequence[float], resamples: int = 20000, seed: int = 0) -> float:
    """Two-sided p of the mean difference under "each question's difference is as likely negative": exact over all
    2^n signings up to 16 questions; beyond, Monte Carlo with the observed signing counted ((hits + 1) /
    (resamples + 1), so p is never 0)."""
    import numpy as np

    n = len(diffs)
    if n == 0:
        return math.nan
    d = np.asarray(diffs, dtype=np.float64)
    observed = abs(d.mean()) - 1e-12
    if n <= 16:
        masks = np.arange(2**n)[:, None] >> np.arange(n)[None, :] & 1  # every signing, one row each
        means = np.abs(((2 * masks - 1) * d).mean(axis=1))
        return float((means >= observed).sum() / 2**n)
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(resamples, n))
    hits = int((np.abs((signs * d).mean(axis=1)) >= observed).sum())
    return (hits + 1) / (resamples + 1)


def paired(before: Iterable[Record], after: Iterable[Record], metric: str, resamples: int = 2000,
           seed: int = 0) -> dict[str, float]:
    """after − before on the questions both have: mean, 95 % bootstrap interval, sign-flip p, `n` questions."""
    b, a = question_means(before, metric), question_means(after, metric)
    diffs = [a[q] - b[q] for q in b if q in a]
    if not diffs:
        return {"mean": math.nan, "ci_low": math.nan, "ci_high": math.nan, "p": math.nan, "n": 0}
    low, high = _bootstrap(diffs, resamples, seed) if len(diffs) > 1 else (diffs[0], diffs[0])
    return {"mean": round(statistics.fmean(diffs), 4), "ci_low": round(low, 4), "ci_high": round(high, 4),
            "p": round(sign_flip_p(diffs, seed=seed), 4), "n": len(diffs)}


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's r (NaN with fewer than 3 pairs or no spread)."""
    if len(xs) < 3 or len(xs) != len(ys):
        return math.nan
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sx, sy = math.sqrt(sum((x - mx) ** 2 for x in xs)), math.sqrt(sum((y - my) ** 2 for y in ys))
    return round(sxy / (sx * sy), 4) if sx > 0 and sy > 0 else math.nan


def co_movement(before: Sequence[Record], after: Sequence[Record], reward: str = "total",
                figures: Sequence[str] = ("gold_recall", "citation_precision", "citation_recall", "cover_em")
                ) -> dict[str, Any]:
    """Do the judge's reward and the held-out figures move together from `before` to `after`?

    Per question, the change of the reward against the change of each figure (Pearson r over questions), and the
    verdict `reward_hacking`: the reward rose (paired p < 0.05, mean > 0) while neither gold recall nor citation
    precision rose (each p ≥ 0.05 or mean ≤ 0), i.e. the judge is paid for something the task does not gain.
    """
    rb, ra = question_means(before, reward), question_means(after, reward)
    out: dict[str, Any] = {"reward": reward, "r": {}}
    for f in figures:
        fb, fa = question_means(before, f), question_means(after, f)
        common = [q for q in rb if q in ra and q in fb and q in fa]
        out["r"][f] = pearson([ra[q] - rb[q] for q in common], [fa[q] - fb[q] for q in common])
    d_reward = paired(before, after, reward)
    d_task = {f: paired(before, after, f) for f in ("gold_recall", "citation_precision")}
    rose = d_reward["n"] > 0 and d_reward["mean"] > 0 and d_reward["p"] < 0.05
    task_rose = any(d["n"] > 0 and d["mean"] > 0 and d["p"] < 0.05 for d in d_task.values())
    out["reward_change"], out["task_change"] = d_reward, d_task
    out["reward_hacking"] = bool(rose and not task_rose)
    return out


def hacking_example(before: Sequence[Record], after: Sequence[Record], reward: str = "total") -> dict[str, Any] | None:
    """The question whose reward rose most while its citation precision did not rise: both answers, for the README.

    None when no question's reward rose.
    """
    rb, ra = question_means(before, reward), question_means(after, reward)
    pb, pa = question_means(before, "citation_precision"), question_means(after, "citation_precision")
    best = max(((ra[q] - rb[q], q) for q in rb if q in ra and q in pa and q in pb and pa[q] <= pb[q]), default=None)
    if best is None or best[0] <= 0:
        return None
    gain, q = best
    pick = {side: next(r for r in recs if str(r["item"]) == q) for side, recs in (("before", before), ("after", after))}
    return {"item": q, "reward_gain": round(gain, 4),
            **{side: {"scores": r.get("scores"), "figures": r.get("figures"), "answer": r.get("answer", "")}
               for side, r in pick.items()}}
