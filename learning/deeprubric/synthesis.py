"""Joint synthesis of the question and its rubrics from one tree (METHOD §11.3), offline: templated, deterministic.

The steps of the released prompt are kept: select a small set of leaves covering distinct facets (`select.py`),
merge them bottom-up into one question (leaves → one intermediate query per depth-1 branch → the final question,
recorded in `merge_trace`), and write rubrics grounded only in the selected leaves.

Decisions where METHOD §11 is silent:
- Each leaf becomes a clause (`facets.CLAUSE_TEMPLATES`, with its focus entity and, for a comparison, the entity
  it is compared with); the clauses of one branch join into an intermediate query (`M1`, `M2`, ...), and those into
  the final question (`Q`), which names the root and asks for the threads to be connected and sourced. It never
  quotes a statement, so it does not list the rubrics and is not answerable from its own wording.
- Rubrics: one factual rubric per selected leaf, from its best statement (weight 0.8, `evidence` = that statement
  verbatim); then logical rubrics, in this order, up to 8 in all: coverage of every thread (1.0), and where the
  selection has such a leaf, a direct comparison (0.6), recorded problems (0.5), specific figures (0.5),
  chronology (0.5); then the link back to the root (0.6) and sourcing (0.4). With 3 to 5 leaves this gives 6 to 8
  rubrics. No negative rubric is written offline (the audit treats negative weights as suspect).
- The reference `answer` is the selected leaves' best statements joined; `format` is long_form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from learning.deeprubric.facets import CLAUSE_TEMPLATES
from learning.deeprubric.records import Leaf, MergeStep, Pair, Rubric, SelectionStep, Tree, stable_hex
from learning.deeprubric.select import MIN_SELECTED, select_leaves
from learning.deeprubric.text import lower_first

MAX_RUBRICS = 8
MIN_RUBRICS = 5
FACTUAL_WEIGHT = 0.8


class Skip(Exception):
    """A tree gives no pair; `reason` is a short code counted in the statistics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Synthesiser(Protocol):
    async def synthesise(self, tree: Tree, leaves: Sequence[Leaf]) -> Pair:
        """The pair of `tree` (raises Skip when the tree cannot give one)."""
        ...


def clause(leaf: Leaf) -> str:
    """The question clause a leaf contributes."""
    return CLAUSE_TEMPLATES[leaf.facet].format(e=leaf.focus, f=leaf.contrast or "its alternatives")  # type: ignore[index]


def _join(parts: Sequence[str], sep: str = ", ") -> str:
    """"A and B", "A, B, and C" (with sep "; ": "A; and B", "A; B; and C")."""
    if len(parts) <= 1:
        return "".join(parts)
    if len(parts) == 2 and sep == ", ":
        return f"{parts[0]} and {parts[1]}"
    return sep.join(parts[:-1]) + sep.rstrip() + " and " + parts[-1]


def merge(root: str, selected: Sequence[Leaf]) -> tuple[str, list[MergeStep]]:
    """The final question and the bottom-up merge trace (level 1: one query per branch; level 2: the question)."""
    branches: dict[str, list[Leaf]] = {}
    for leaf in selected:
        branches.setdefault(leaf.branch, []).append(leaf)
    steps: list[MergeStep] = []
    for n, group in enumerate(branches.values(), 1):
        steps.append(MergeStep(f"M{n}", 1, tuple(x.id for x in group), _join([clause(x) for x in group])))
    question = (f"In researching {root}: {_join([s.query for s in steps], '; ')}? Explain how these threads "
                f"connect back to {root}, citing a source for each point.")
    steps.append(MergeStep("Q", 2, tuple(s.id for s in steps), question))
    return question, steps


def write_rubrics(root: str, selected: Sequence[Leaf]) -> list[Rubric]:
    """Factual rubrics from the leaves' best statements, then logical ones (see the module docstring)."""
    drafts: list[tuple[str, str, float, tuple[str, ...], tuple[str, ...]]] = []
    for leaf in selected:
        s = leaf.statements[0].text
        drafts.append(("factual", f"States that {lower_first(s)}", FACTUAL_WEIGHT, (leaf.id,), (s,)))
    ids = tuple(x.id for x in selected)
    drafts.append(("logical", "Addresses each thread of the question: " + ", ".join(x.focus for x in selected),
                   1.0, ids, ()))
    by_facet = {x.facet: x for x in reversed(selected)}  # the first leaf of each facet
    if (c := by_facet.get("comparison")) is not None:
        drafts.append(("logical", f"Compares {c.focus} with {c.contrast or 'its alternatives'} directly, naming at "
                       "least one concrete difference or similarity", 0.6, (c.id,), ()))
    if (r := by_facet.get("risks")) is not None:
        drafts.append(("logical", f"Reports recorded problems, failures or criticism concerning {r.focus}, not only "
                       "positive aspects", 0.5, (r.id,), ()))
    if (q := by_facet.get("quantitative")) is not None:
        drafts.append(("logical", f"Gives specific figures, dates or amounts for {q.focus} rather than vague "
                       "quantities", 0.5, (q.id,), ()))
    if (t := by_facet.get("timeline")) is not None:
        drafts.append(("logical", f"Places the events concerning {t.focus} in chronological order", 0.5, (t.id,), ()))
    far = max(selected, key=lambda x: x.depth)
    drafts.append(("logical", f"Explains how {far.focus} relates to {root} instead of listing facts side by side",
                   0.6, (far.id,), ()))
    drafts.append(("logical", "Attributes each factual claim to a cited source", 0.4, ids, ()))
    n_factual = len(selected)
    keep = drafts[:n_factual] + drafts[n_factual:][: max(0, MAX_RUBRICS - n_factual)]
    return [Rubric(f"R{i}", kind, desc, w, src, ev) for i, (kind, desc, w, src, ev) in enumerate(keep, 1)]  # type: ignore[arg-type]


def reference_answer(selected: Sequence[Leaf]) -> str:
    """The selected leaves' best statements, joined."""
    return " ".join(x.statements[0].text for x in selected if x.statements)


def synthesise_offline(tree: Tree, leaves: Sequence[Leaf]) -> Pair:
    """The offline pair of `tree` (raises Skip("too_few_leaves") when fewer than 3 leaves are usable)."""
    selected, trace = select_leaves(leaves)
    if len(selected) < MIN_SELECTED:
        raise Skip("too_few_leaves", f"{len(selected)} usable leaves of {len(leaves)}")
    return assemble(tree, selected, trace)


def assemble(tree: Tree, selected: Sequence[Leaf], trace: Sequence[SelectionStep]) -> Pair:
    """A pair from chosen leaves: merged question, rubrics and reference answer."""
    question, steps = merge(tree.seed_title, selected)
    return Pair(
        id=f"dr-{stable_hex(tree.key)}", tree_id=tree.id, key=tree.key, mode=tree.mode, root=tree.seed_title,
        question=question, answer=reference_answer(selected), selected_leaf_ids=tuple(x.id for x in selected),
        leaves=tuple(selected), rubrics=tuple(write_rubrics(tree.seed_title, selected)),
        selection_trace=tuple(trace), merge_trace=tuple(steps),
    )  # fmt: skip


class OfflineSynthesiser:
    """Diversity selection, templated merge and rubrics (`synthesise_offline`)."""

    async def synthesise(self, tree: Tree, leaves: Sequence[Leaf]) -> Pair:
        return synthesise_offline(tree, leaves)


__all__ = [
    "FACTUAL_WEIGHT",
    "MAX_RUBRICS",
    "MIN_RUBRICS",
    "OfflineSynthesiser",
    "Skip",
    "Synthesiser",
    "assemble",
    "clause",
    "merge",
    "reference_answer",
    "synthesise_offline",
    "write_rubrics",
]
