"""Growing one evidence tree (METHOD §11.2), breadth first, behind three small interfaces.

A `Retriever` turns a sub-query into passages (the project's own `local_search`, see `corpus.py`); a `Proposer`
writes a node's sibling sub-queries; an `Extractor` turns a node's passages into statements; a `Gate` may stop
branching. The offline implementations live in `offline.py`; an LLM-backed one only has to honour the same
signatures, and whatever it returns is held to the same rules here: sub-queries to `facets.check_children`,
statements to being verbatim pieces of their passage (at most 240 characters), deduplicated across the tree.

Decisions where METHOD §11 is silent:
- Expansion is breadth first, and the node budget (50) is spent when children are *proposed*, so the shallow
  levels fill before the deep ones and a tree never exceeds the budget.
- A node retrieves once, with its own sub-query; a node that retrieves nothing is a leaf ("empty_retrieval").
- Statements are deduplicated across the whole tree in breadth-first order (`text.is_duplicate`): the first node
  to find a statement keeps it, later ones drop it and the drop is counted. A node left with no new statement is a
  leaf ("gate": it adds no new evidence), which is also the offline form of the LLM gate.
- Children that break the sibling rules are removed one by one (the rest are kept while they pass); if what is left
  still fails (a required facet missing), the node is a leaf ("children_rejected"). Every removal is counted.
- A node keeps at most `statements_per_node` (6) statements; a leaf exports the first 4 (METHOD §11.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from learning.deeprubric.facets import check_children
from learning.deeprubric.records import Leaf, Mode, Node, Passage, Statement, Tree, TreeCounts, stable_hex
from learning.deeprubric.text import STATEMENT_CHARS, collapse, is_duplicate


@dataclass(frozen=True, slots=True)
class TreeConfig:
    """METHOD §11.2's defaults."""

    max_depth: int = 3
    children: tuple[int, ...] = (6, 4, 3)  # at the root, at depth 1, and below
    max_nodes: int = 50
    top_k: int = 5
    passage_chars: int = 5000
    statements_per_node: int = 6
    leaf_statements: int = 4

    def children_at(self, depth: int) -> int:
        """How many children a node at `depth` may have."""
        return self.children[min(depth, len(self.children) - 1)]

    def __post_init__(self) -> None:
        if self.max_depth < 1 or self.max_nodes < 1 or self.top_k < 1 or not self.children:
            raise ValueError("a tree needs max_depth, max_nodes and top_k of at least 1, and a children schedule")
        if any(c < 1 for c in self.children) or self.leaf_statements < 1 or self.statements_per_node < 1:
            raise ValueError("children per node and statements per node must be at least 1")


@dataclass(frozen=True, slots=True)
class Proposal:
    """One proposed sub-query with the facet and entity it is about."""

    query: str
    facet: str
    focus: str
    contrast: str = ""


@dataclass(frozen=True, slots=True)
class Root:
    """Where a tree starts: the root query (a page title or a topic), its focus, summary and information points."""

    query: str
    focus: str
    summary: str
    info_points: tuple[str, ...] = ()


class Retriever(Protocol):
    async def __call__(self, query: str) -> Sequence[Passage]: ...


class Proposer(Protocol):
    async def propose(self, node: Node, path: Sequence[Node], n: int, taken: frozenset[str]) -> Sequence[Proposal]:
        """At most `n` sibling sub-queries for `node` (`path`: its ancestors, root first; `taken`: foci in use)."""
        ...


class Extractor(Protocol):
    async def extract(self, node: Node, passages: Sequence[Passage]) -> Sequence[Statement]:
        """Candidate statements about `node` from `passages`, best first."""
        ...


class Gate(Protocol):
    async def expand(self, node: Node, path: Sequence[Node]) -> bool:
        """Whether branching below `node` (which has passages and new statements) is worth it."""
        ...


class AlwaysExpand:
    """The offline gate: every node with new evidence may branch (the no-new-evidence stop is in the builder)."""

    async def expand(self, node: Node, path: Sequence[Node]) -> bool:
        return True


def grounded(statement: Statement, passages: Sequence[Passage]) -> bool:
    """Whether `statement` is a verbatim piece (whitespace collapsed) of the passage it names, within 240 chars."""
    if not statement.text.strip() or len(statement.text) > STATEMENT_CHARS:
        return False
    return any(p.id == statement.passage_id and collapse(statement.text) in collapse(p.text) for p in passages)


def repair_children(proposals: Sequence[Proposal], ancestors: Sequence[str]) -> tuple[list[Proposal], int]:
    """The proposals that pass `check_children` together, and how many were removed (see the module docstring)."""
    kept: list[Proposal] = []
    for p in proposals:
        # Per-query rules first (length, blank, duplicate, overlap); the facet mix is checked on the whole set.
        trial = [*kept, p]
        if not [v for v in check_children([k.query for k in trial], ancestors) if not v.startswith("missing facet")]:
            kept.append(p)
    if check_children([k.query for k in kept], ancestors):
        return [], len(proposals)
    return kept, len(proposals) - len(kept)


async def build_tree(
    key: str,
    root: Root,
    retriever: Retriever,
    proposer: Proposer,
    extractor: Extractor,
    gate: Gate,
    config: TreeConfig = TreeConfig(),
    mode: Mode = "offline",
) -> Tree:
    """Grow the evidence tree of `root` (see the module docstring for the rules)."""
    nodes: list[Node] = [Node(id="n0", query=root.query, depth=0, parent=None, facet="overview", focus=root.focus)]
    seen: list[str] = []  # every statement kept so far, for tree-wide deduplication
    duplicates = ungrounded = empty = rejected = 0
    position = 0
    while position < len(nodes):
        node = nodes[position]
        path = _path(nodes, node)
        passages = [p for p in await retriever(node.query)][: config.top_k]
        kept: list[Statement] = []
        for s in await extractor.extract(node, passages):
            if len(kept) >= config.statements_per_node:
                break
            if not grounded(s, passages):
                ungrounded += 1
            elif is_duplicate(s.text, seen):
                duplicates += 1
            else:
                kept.append(s)
                seen.append(s.text)
        node = replace(node, passages=tuple(passages), statements=tuple(kept))
        children: list[Proposal] = []
        budget = min(config.children_at(node.depth), config.max_nodes - len(nodes))
        if node.depth >= config.max_depth:
            stop = "max_depth"
        elif not passages:
            stop, empty = "empty_retrieval", empty + 1
        elif not kept or not await gate.expand(node, path):
            stop = "gate"
        elif budget <= 0:
            stop = "budget"
        else:
            taken = frozenset(n.focus.lower() for n in nodes)
            proposals = list(await proposer.propose(node, path, budget, taken))[:budget]
            children, removed = repair_children(proposals, [n.query for n in (*path, node)])
            rejected += removed
            stop = None if children else ("children_rejected" if proposals else "no_children")
        ids = tuple(f"n{len(nodes) + i}" for i in range(len(children)))
        nodes[position] = replace(node, children=ids, stop=stop)  # type: ignore[arg-type]
        for cid, c in zip(ids, children, strict=True):
            nodes.append(Node(id=cid, query=c.query, depth=node.depth + 1, parent=node.id, facet=c.facet,
                              focus=c.focus, contrast=c.contrast))
        position += 1
    return Tree(
        id=f"t-{stable_hex(key)}", key=key, mode=mode, seed_title=root.query, summary=root.summary,
        info_points=root.info_points, nodes=tuple(nodes),
        counts=TreeCounts(duplicates, ungrounded, empty, rejected),
    )  # fmt: skip


def _path(nodes: Sequence[Node], node: Node) -> list[Node]:
    """The ancestors of `node`, root first."""
    by_id = {n.id: n for n in nodes}
    out: list[Node] = []
    parent = node.parent
    while parent is not None:
        out.append(by_id[parent])
        parent = by_id[parent].parent
    return out[::-1]


def leaves(tree: Tree, max_statements: int = 4) -> list[Leaf]:
    """The tree's leaves (nodes without children) in breadth-first order, with root→leaf paths."""
    out: list[Leaf] = []
    for node in tree.nodes:
        if node.children:
            continue
        path = [*_path(tree.nodes, node), node]
        branch = path[1].id if len(path) > 1 else node.id
        out.append(Leaf(id=node.id, path=tuple(n.query for n in path), facet=node.facet, focus=node.focus,
                        contrast=node.contrast, depth=node.depth, branch=branch,
                        statements=node.statements[:max_statements]))
    return out


def passage_of(tree: Tree, passage_id: str) -> Passage | None:
    """The passage with this snippet id anywhere in the tree."""
    for n in tree.nodes:
        for p in n.passages:
            if p.id == passage_id:
                return p
    return None


__all__ = [
    "AlwaysExpand",
    "Extractor",
    "Gate",
    "Proposal",
    "Proposer",
    "Retriever",
    "Root",
    "TreeConfig",
    "build_tree",
    "grounded",
    "leaves",
    "passage_of",
    "repair_children",
]
