"""Choosing the small set of leaves a pair is written from (METHOD §11.3, step 1), offline: by diversity.

Decisions where METHOD §11 is silent:
- A leaf without statements cannot ground a rubric (it is "noisy"): it is passed over, and so is a leaf whose focus
  or evidence repeats a chosen one (content Jaccard of its statements >= `MAX_EVIDENCE_OVERLAP` against a chosen
  leaf's).
- Greedy choice, up to `MAX_SELECTED` (5, the paper's mean): each step takes the leaf with the highest score
    1.0·[its facet is new] + 0.5·[its depth-1 branch is new] + (1 − its largest evidence overlap with a chosen leaf)
    + 0.1·(its statements / 4),
  ties going to the earlier leaf (breadth-first order), so the first pick is the best-evidenced leaf.
- Fewer than `MIN_SELECTED` (3) usable leaves: the tree is skipped with reason "too_few_leaves" (a research-heavy
  question needs at least three distinct threads).
"""

from __future__ import annotations

from collections.abc import Sequence

from learning.deeprubric.records import Leaf, SelectionStep
from learning.deeprubric.text import content_tokens, jaccard, normalise

MAX_SELECTED = 5
MIN_SELECTED = 3
MAX_EVIDENCE_OVERLAP = 0.5


def _evidence(leaf: Leaf) -> frozenset[str]:
    return frozenset().union(*(content_tokens(s.text) for s in leaf.statements)) if leaf.statements else frozenset()


def select_leaves(leaves: Sequence[Leaf], k: int = MAX_SELECTED) -> tuple[list[Leaf], list[SelectionStep]]:
    """The chosen leaves (in choice order) and the trace of every decision (chosen and passed-over leaves)."""
    trace: list[SelectionStep] = []
    pool: list[Leaf] = []
    for leaf in leaves:
        if leaf.statements:
            pool.append(leaf)
        else:
            trace.append(SelectionStep(leaf.id, False, leaf.facet, 0.0, "no statements"))
    chosen: list[Leaf] = []
    while pool and len(chosen) < k:
        best: tuple[float, Leaf] | None = None
        for leaf in list(pool):
            sim = max((jaccard(_evidence(leaf), _evidence(c)) for c in chosen), default=0.0)
            if sim >= MAX_EVIDENCE_OVERLAP or any(normalise(leaf.focus) == normalise(c.focus) for c in chosen):
                pool.remove(leaf)
                trace.append(SelectionStep(leaf.id, False, leaf.facet, 0.0, f"repeats chosen evidence ({sim:.2f})"))
                continue
            score = (1.0 * (leaf.facet not in {c.facet for c in chosen})
                     + 0.5 * (leaf.branch not in {c.branch for c in chosen})
                     + (1.0 - sim) + 0.1 * len(leaf.statements) / 4)
            if best is None or score > best[0] + 1e-9:
                best = (score, leaf)
        if best is None:
            break
        score, leaf = best
        pool.remove(leaf)
        chosen.append(leaf)
        trace.append(SelectionStep(leaf.id, True, leaf.facet, round(score, 4),
                                   f"facet {leaf.facet}, branch {leaf.branch}"))
    for leaf in pool:
        trace.append(SelectionStep(leaf.id, False, leaf.facet, 0.0, "selection full"))
    return chosen, trace


__all__ = ["MAX_EVIDENCE_OVERLAP", "MAX_SELECTED", "MIN_SELECTED", "select_leaves"]
