"""Spread over repeated evaluations (`rubricem eval --runs N`, issue 36): each metric's mean over the runs and its
sample standard deviation (n - 1 in the denominator), as MiroFlow and DR Tulu report theirs. Pure functions."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and the sample standard deviation; no deviation (None) from fewer than two values."""
    if not values:
        raise ValueError("no values")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def metric_spread(per_run: Sequence[Mapping[str, float]]
                  ) -> tuple[dict[str, float], dict[str, float | None], dict[str, int]]:
    """(means, standard deviations, runs counted) per metric, over the runs' metric means.

    A metric absent from a run (e.g. an LLM grade when every grading of that run failed) is averaged over the runs that
    have it; the counts say how many did. Metrics keep their first-seen order.
    """
    names = list(dict.fromkeys(k for m in per_run for k, v in m.items() if isinstance(v, int | float)))
    means: dict[str, float] = {}
    stds: dict[str, float | None] = {}
    counts: dict[str, int] = {}
    for name in names:
        values = [float(m[name]) for m in per_run if isinstance(m.get(name), int | float)]
        means[name], stds[name] = mean_std(values)
        counts[name] = len(values)
    return means, stds, counts
