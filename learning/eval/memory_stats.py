"""The pre-registered analysis of the memory study (issue 62, docs/learning/memory/PREREGISTRATION.md): pure maths
over the held-out records, no I/O.

- Pairing: a condition is compared with bank-off on the same (question, sample) pairs; sample k of a question has
  the same sampling seed in every condition, so the pair differs only by the memory.
- Intervals: a hierarchical bootstrap. Each draw resamples the questions with replacement, then, inside each drawn
  question, its samples with replacement (the same sample index for both conditions, which keeps the pairing while
  treating seeds and samples as random). The interval is the 2.5-97.5 percentile of the mean paired difference; the
  two-sided p is twice the smaller tail share of draws beyond 0, draws at exactly 0 counting half to each tail
  (mid-p), at least 1/B.
- Multiplicity: Holm's step-down method over the primary tests (2 memories x 2 primary metrics = 4 tests).
- Decision: memory helps when a primary test has a positive mean and Holm p < 0.05; memory is ruled out at +0.05
  when every interval of memory (b), the best case, on the primary metrics lies below +0.05. Anything else is
  undecided. The judge's total is reported and never decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

PRIMARY = ("answer_f1", "citation_precision")
SECONDARY = ("gold_recall", "answer_words", "boxed")
REPORTED = ("total",)  # the judge's total: reported, never used to decide
MEMORIES = ("a", "b")
BASE = "off"
SAMPLES = 3
B = 10_000
ALPHA = 0.05
MARGIN = 0.05


def value(record: Mapping[str, Any], metric: str) -> float | None:
    """A record's value of `metric` (a held-out figure, or the judge's total); None where it does not apply."""
    if metric == "total":
        v = (record.get("scores") or {}).get("total")
    else:
        v = (record.get("figures") or {}).get(metric)
    return None if v is None else float(v)


def table(records: Sequence[Mapping[str, Any]], metric: str, items: Sequence[str],
          samples: int | Sequence[int] = SAMPLES) -> np.ndarray:
    """questions x samples of `metric` (NaN where missing or not applicable). `samples`: how many (indices 0..n-1),
    or which sample indices, in column order (a follow-up study's fresh samples 3..8)."""
    index = list(range(samples)) if isinstance(samples, int) else list(samples)
    column = {k: j for j, k in enumerate(index)}
    out = np.full((len(items), len(index)), np.nan)
    row = {q: i for i, q in enumerate(items)}
    for r in records:
        i, s = row.get(r.get("item")), r.get("sample")
        j = column.get(s) if isinstance(s, int) and not isinstance(s, bool) else None
        if i is not None and j is not None:
            v = value(r, metric)
            out[i, j] = np.nan if v is None else v
    return out


def paired_bootstrap(x: np.ndarray, base: np.ndarray, draws: int = B, seed: int = 0) -> dict[str, float]:
    """The mean paired difference x - base (questions x samples, NaN: missing) with its hierarchical-bootstrap
    interval and two-sided p (module docstring)."""
    d = x - base
    keep = ~np.all(np.isnan(d), axis=1)
    d = d[keep]
    n_q, n_s = d.shape
    if n_q == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan"), "p": 1.0, "questions": 0, "pairs": 0}
    rng = np.random.default_rng(seed)
    qs = rng.integers(0, n_q, size=(draws, n_q))
    ss = rng.integers(0, n_s, size=(draws, n_q, n_s))
    picked = d[qs[:, :, None], ss]  # draws x questions x samples
    means = np.nanmean(picked.reshape(draws, -1), axis=1)
    means = means[~np.isnan(means)]
    # ties at exactly 0 (common: most paired differences of a 0/1 figure are 0) count half to each side (mid-p);
    # counting them whole on both sides gave p 0.97 for an interval of [0, +0.109]
    below, tied = float(np.mean(means < 0)), float(np.mean(means == 0))
    p = 2 * min(below + tied / 2, 1 - below - tied / 2)
    return {"mean": float(np.nanmean(d)), "lo": float(np.percentile(means, 2.5)),
            "hi": float(np.percentile(means, 97.5)), "p": min(1.0, max(p, 1 / draws)),
            "questions": int(n_q), "pairs": int(np.sum(~np.isnan(d)))}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    out = [0.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        out[i] = running
    return out


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def memory_acts(records: Sequence[Mapping[str, Any]], meta: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """The positive control of memory: the share of sessions with an item in the prompt, and with an injected
    item's query among the session's searches, or its titles among the passages it retrieved or cited."""
    n = len(records)
    injected = query = titles = 0
    for r in records:
        ids = [i for i in r.get("injected") or [] if i in meta]
        if not r.get("injected"):
            continue
        injected += 1
        searched = {_norm(q) for q in r.get("queries") or []}
        seen = {_norm(t) for t in [*(r.get("searched_titles") or []), *(r.get("cited_titles") or [])]}
        query += any(_norm(q) in searched for i in ids for q in meta[i].get("queries") or [])
        titles += any(_norm(t) in seen for i in ids for t in meta[i].get("titles") or [])
    return {"sessions": n, "injected": injected / n if n else 0.0, "query_reused": query / n if n else 0.0,
            "titles_reused": titles / n if n else 0.0}


def analyse(records: Mapping[str, Sequence[Mapping[str, Any]]], meta: Mapping[str, Mapping[str, Any]],
            items: Sequence[str], draws: int = B, samples: Sequence[int] = tuple(range(SAMPLES)),
            memories: Sequence[str] = MEMORIES) -> dict[str, Any]:
    """Means, paired tests (primary Holm-corrected), the positive control and the decision, for whatever
    conditions `records` holds (a condition with no records is left out). `samples` and `memories` are the
    design's (the follow-up study: samples 3..8, memory (b) only; the Holm family is then its 2 primary tests)."""
    metrics = [*PRIMARY, *SECONDARY, *REPORTED]
    samples = tuple(samples)
    records = {c: [r for r in rs if r.get("sample") in samples] for c, rs in records.items()}
    done = [c for c in (BASE, *memories) if records.get(c)]
    means: dict[str, dict[str, Any]] = {}
    for c in done:
        row: dict[str, Any] = {"n": len(records[c])}
        for m in metrics:
            t = table(records[c], m, items, samples)
            row[m] = None if np.all(np.isnan(t)) else float(np.nanmean(t))
        means[c] = row
    tests: list[dict[str, Any]] = []
    if BASE in done:
        for c in memories:
            if c not in done:
                continue
            for m in metrics:
                res = paired_bootstrap(table(records[c], m, items, samples), table(records[BASE], m, items, samples),
                                       draws)
                tests.append({"comparison": f"{c} - {BASE}", "memory": c, "metric": m, "primary": m in PRIMARY}
                             | res)
    primary = [t for t in tests if t["primary"]]
    for t, p in zip(primary, holm([t["p"] for t in primary]), strict=True):
        t["p_holm"] = p
        t["holm_family"] = len(primary)  # 4 once both memories are in; fewer in a partial report
    acts = {c: memory_acts(records[c], meta) for c in memories if c in done}
    complete = all(len(records.get(c) or []) >= len(items) * len(samples) for c in (BASE, *memories))
    return {"done": done, "metrics": metrics, "means": means, "tests": tests, "acts": acts,
            "decision": decide(primary, complete)}


def decide(primary: Sequence[Mapping[str, Any]], complete: bool) -> str:
    """The pre-registered decision rule, in words."""
    if not complete:
        return "Not decided: not every unit is done (the rule is applied to the whole design only)."
    wins = [t for t in primary if t["mean"] > 0 and t["p_holm"] < ALPHA]
    if wins:
        return "Memory helps: " + "; ".join(f"memory ({t['memory']}) raises {t['metric']} by {t['mean']:+.3f} "
                                            f"[{t['lo']:+.3f}, {t['hi']:+.3f}], Holm p {t['p_holm']:.3f}"
                                            for t in wins) + "."
    best = [t for t in primary if t["memory"] == "b"]
    if best and all(t["hi"] < MARGIN for t in best):
        return ("Memory does not help at this model size: no primary test is significant after Holm, and every "
                f"interval of memory (b), the best case, lies below +{MARGIN}.")
    return ("Undecided: no primary test is significant after Holm, and memory (b)'s intervals do not rule out "
            f"+{MARGIN}.")
