"""The typed records of DeepRubric (METHOD §11): passages, statements, tree nodes, trees, leaves, rubrics, pairs and
audit verdicts. All are frozen; `to_json` / `*_from_json` are the one place they meet JSON.

Decisions where METHOD §11 is silent:
- Ids are scoped to one tree: nodes are `n0` (the root), `n1`, ... in breadth-first order; a leaf keeps its node's
  id, so `source_leaf_ids` name nodes of the pair's own tree. A tree's id is `t-<sha256(key)[:10]>` and its pair's
  id `dr-<same hex>`, stable across reruns.
- A statement keeps the snippet id the project's `local_search` gave its passage (`{call id}-{index}`, METHOD D2;
  the call ids come from a generator seeded by the tree key, so they are unique within a tree and reproducible) and
  the passage's title; the passages themselves are kept on the node, so every statement resolves to its passage.
- Every product carries `mode` ("offline" for the deterministic pipeline, "llm" reserved for model-backed steps).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

Mode = Literal["offline", "llm"]
RubricType = Literal["logical", "factual"]
Decision = Literal["KEEP", "REVISE", "DROP"]
StopReason = Literal["max_depth", "budget", "empty_retrieval", "gate", "no_children", "children_rejected"]


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrieved passage: the snippet id local_search gave it, its title and its (whitespace-collapsed) text."""

    id: str
    title: str
    text: str
    url: str = ""
    clipped: bool = False  # the tool cut the text (its last sentence is incomplete)


@dataclass(frozen=True, slots=True)
class Statement:
    """A verbatim piece of a passage (at most 240 characters) and the passage it came from."""

    text: str
    passage_id: str
    title: str


@dataclass(frozen=True, slots=True)
class Node:
    """One node of an evidence tree: its sub-query, its facet and focus entity, what it retrieved and extracted."""

    id: str
    query: str
    depth: int
    parent: str | None
    facet: str
    focus: str  # the entity the sub-query is about
    contrast: str = ""  # the second entity of a comparison facet
    passages: tuple[Passage, ...] = ()
    statements: tuple[Statement, ...] = ()
    children: tuple[str, ...] = ()
    stop: StopReason | None = None  # why the node has no children (None: it has some)


@dataclass(frozen=True, slots=True)
class TreeCounts:
    """What the tree builder removed or refused, by kind."""

    duplicate_statements: int = 0
    ungrounded_statements: int = 0  # an extractor's statement that is not a verbatim piece of its passage
    empty_retrievals: int = 0
    rejected_children: int = 0  # proposed sub-queries removed by facets.check_children


@dataclass(frozen=True, slots=True)
class Tree:
    """An evidence tree grown from one seed page or topic."""

    id: str
    key: str  # the seed key of the build ("s0-3": seed 0, tree 3)
    mode: Mode
    seed_title: str
    summary: str
    info_points: tuple[str, ...]
    nodes: tuple[Node, ...]
    counts: TreeCounts = TreeCounts()

    def node(self, node_id: str) -> Node:
        """The node with this id (KeyError if none)."""
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)


@dataclass(frozen=True, slots=True)
class Leaf:
    """An exported leaf: its root→leaf query path and at most 4 statements."""

    id: str
    path: tuple[str, ...]
    facet: str
    focus: str
    contrast: str
    depth: int
    branch: str  # id of its depth-1 ancestor (itself at depth 1; the root's id for the root)
    statements: tuple[Statement, ...]


@dataclass(frozen=True, slots=True)
class Rubric:
    """One criterion of a pair (METHOD §11.3)."""

    id: str
    type: RubricType
    description: str
    weight: float
    source_leaf_ids: tuple[str, ...]
    evidence: tuple[str, ...] = ()  # factual: leaf statements, verbatim


@dataclass(frozen=True, slots=True)
class SelectionStep:
    """One decision of leaf selection: a leaf chosen (with its diversity score) or passed over (with the reason)."""

    leaf_id: str
    chosen: bool
    facet: str
    score: float
    reason: str


@dataclass(frozen=True, slots=True)
class MergeStep:
    """One bottom-up merge: the ids merged (leaves, or intermediate queries) into a query with id `id`."""

    id: str
    level: int
    sources: tuple[str, ...]
    query: str


@dataclass(frozen=True, slots=True)
class Pair:
    """A question and its rubrics, written together from one tree's selected leaves."""

    id: str
    tree_id: str
    key: str
    mode: Mode
    root: str
    question: str
    answer: str  # a short reference answer: the key leaf statements, joined
    selected_leaf_ids: tuple[str, ...]
    leaves: tuple[Leaf, ...]  # the selected leaves, in selection order
    rubrics: tuple[Rubric, ...]
    selection_trace: tuple[SelectionStep, ...]
    merge_trace: tuple[MergeStep, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """One audit finding: the §11.4 dimension, a short code, the rubric it concerns (if any) and what is wrong."""

    dimension: str
    code: str
    rubric_id: str | None
    message: str
    repairable: bool


@dataclass(frozen=True, slots=True)
class AuditVerdict:
    """KEEP / REVISE / DROP with the findings; a REVISE carries the repaired pair, a DROP its reason code."""

    decision: Decision
    problems: tuple[Problem, ...]
    revised: Pair | None = None
    reason: str = ""


def stable_hex(key: str, n: int = 10) -> str:
    """The first `n` hex characters of SHA-256 of `key`."""
    return hashlib.sha256(key.encode()).hexdigest()[:n]


def to_json(record: Any) -> Any:
    """A record as JSON-ready data (tuples become lists)."""
    return asdict(record)


def _passage(d: Mapping[str, Any]) -> Passage:
    return Passage(str(d["id"]), str(d["title"]), str(d["text"]), str(d.get("url", "")), bool(d.get("clipped")))


def _statement(d: Mapping[str, Any]) -> Statement:
    return Statement(str(d["text"]), str(d["passage_id"]), str(d["title"]))


def node_from_json(d: Mapping[str, Any]) -> Node:
    return Node(
        id=str(d["id"]), query=str(d["query"]), depth=int(d["depth"]), parent=d.get("parent"), facet=str(d["facet"]),
        focus=str(d["focus"]), contrast=str(d.get("contrast", "")),
        passages=tuple(_passage(p) for p in d.get("passages", ())),
        statements=tuple(_statement(s) for s in d.get("statements", ())),
        children=tuple(str(c) for c in d.get("children", ())), stop=d.get("stop"),
    )  # fmt: skip


def tree_from_json(d: Mapping[str, Any]) -> Tree:
    """A Tree from `to_json(tree)` (KeyError/TypeError/ValueError on a malformed record)."""
    return Tree(
        id=str(d["id"]), key=str(d["key"]), mode=d["mode"], seed_title=str(d["seed_title"]),
        summary=str(d["summary"]), info_points=tuple(str(x) for x in d["info_points"]),
        nodes=tuple(node_from_json(n) for n in d["nodes"]), counts=TreeCounts(**d.get("counts", {})),
    )  # fmt: skip


def leaf_from_json(d: Mapping[str, Any]) -> Leaf:
    return Leaf(
        id=str(d["id"]), path=tuple(str(q) for q in d["path"]), facet=str(d["facet"]), focus=str(d["focus"]),
        contrast=str(d.get("contrast", "")), depth=int(d["depth"]), branch=str(d["branch"]),
        statements=tuple(_statement(s) for s in d["statements"]),
    )  # fmt: skip


def rubric_from_json(d: Mapping[str, Any]) -> Rubric:
    return Rubric(
        id=str(d["id"]), type=d["type"], description=str(d["description"]), weight=float(d["weight"]),
        source_leaf_ids=tuple(str(x) for x in d.get("source_leaf_ids") or ()),
        evidence=tuple(str(x) for x in d.get("evidence") or ()),
    )  # fmt: skip


def pair_from_json(d: Mapping[str, Any]) -> Pair:
    """A Pair from its JSON record (the extra fields of the pairs file are ignored)."""
    return Pair(
        id=str(d["id"]), tree_id=str(d["tree_id"]), key=str(d["key"]), mode=d["mode"], root=str(d["root"]),
        question=str(d["question"]), answer=str(d["answer"]),
        selected_leaf_ids=tuple(str(x) for x in d["selected_leaf_ids"]),
        leaves=tuple(leaf_from_json(x) for x in d["leaves"]), rubrics=tuple(rubric_from_json(x) for x in d["rubrics"]),
        selection_trace=tuple(SelectionStep(**x) for x in d["selection_trace"]),
        merge_trace=tuple(MergeStep(x["id"], int(x["level"]), tuple(x["sources"]), x["query"]) for x in d["merge_trace"]),
    )  # fmt: skip


__all__ = [
    "AuditVerdict",
    "Decision",
    "Leaf",
    "MergeStep",
    "Mode",
    "Node",
    "Pair",
    "Passage",
    "Problem",
    "Rubric",
    "RubricType",
    "SelectionStep",
    "Statement",
    "StopReason",
    "Tree",
    "TreeCounts",
    "leaf_from_json",
    "node_from_json",
    "pair_from_json",
    "rubric_from_json",
    "stable_hex",
    "to_json",
    "tree_from_json",
]
