"""The offline proposer and extractor of evidence trees: deterministic, no model, labelled `"mode": "offline"`.

Sub-queries come from the entities and titles a node's passages mention (METHOD §11.2's facet rules, worded by
`facets.QUERY_TEMPLATES`); statements are the passages' sentences about the node's focus entity.

Decisions where METHOD §11 is silent:
- Candidate entities, best first: titles of the node's retrieved passages that its statements mention, then
  capitalised name spans of two or more words in its statements (`text.entity_spans`; one capitalised word alone
  is too often a nationality or a common noun). Titles the evidence does not mention are never used: they are what
  the sub-query's template words matched, not what the node is about. An entity already the
  focus of a node of the tree, overlapping one (content Jaccard >= 0.5), holding a facet cue word, or longer than
  6 tokens is skipped, so every node of a tree is about a different entity.
- Facets are assigned in order: the three required ones (comparison, risks, quantitative) first, then the optional
  ones rotated by a hash of the node, so trees differ. A comparison compares the new entity with the parent's focus
  ("{e} compared with {f}"), or with alternatives when that would exceed 11 tokens.
- A sentence is "about the node" when it names every content word of the focus entity, or when it comes from the
  focus entity's own page (title match). It ranks higher when it names the focus, when it carries the facet's signal
  (a number for "quantitative", a year for "timeline", the contrast entity for "comparison", a cue word of the facet
  otherwise), and when its passage ranked higher. The last sentence of a passage the tool cut, and a sentence
  ending in a colon (a list heading such as "X may refer to:"), are never used.
- The root's summary is the seed page's first sentence and its information points the page's first 6 sentences
  (trimmed to 240 characters), in place of the LLM summary of the released code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from learning.deeprubric.facets import (
    COMPARISON_FALLBACK,
    MAX_QUERY_TOKENS,
    OPTIONAL_FACETS,
    QUERY_TEMPLATES,
    REQUIRED_FACETS,
    facet_of,
    has_cue,
)
from learning.deeprubric.records import Node, Passage, Statement, stable_hex
from learning.deeprubric.text import (
    content_tokens,
    entity_spans,
    normalise,
    overlap,
    sentences,
    token_count,
    trim_statement,
)
from learning.deeprubric.tree import Proposal, Root
from learning.sft.questions import main_title

MAX_ENTITY_TOKENS = 6
INFO_POINTS = 6
_YEAR = re.compile(r"\b(1[0-9]{3}|20[0-9]{2})\b")
_DIGIT = re.compile(r"\d")


def mentions(entity: str, text: str) -> bool:
    """Whether `text` names every content word of `entity`."""
    need = content_tokens(entity)
    return bool(need) and need <= content_tokens(text)


def _same(a: str, b: str) -> bool:
    return normalise(a) == normalise(b) or overlap(a, b) >= 0.5


def candidate_entities(node: Node, passages: Sequence[Passage], taken: Sequence[str]) -> list[str]:
    """Entities `node`'s evidence mentions that could each focus one child (see the module docstring)."""
    said = " ".join(s.text for s in node.statements)
    titles = [main_title(p.title) for p in passages if p.title.strip()]
    ranked = [t for t in titles if mentions(t, said)]
    ranked += [e for s in node.statements for e in entity_spans(s.text) if len(e.split()) > 1]
    out: list[str] = []
    for e in ranked:
        e = " ".join(e.split())
        if (not e or token_count(e) > MAX_ENTITY_TOKENS or has_cue(e) or not content_tokens(e)
                or any(_same(e, t) for t in [*taken, node.focus, *out])):
            continue
        out.append(e)
    return out


def facet_order(node: Node) -> list[str]:
    """Required facets first, then the optional ones rotated by a hash of the node (deterministic)."""
    shift = int(stable_hex(f"{node.id}:{node.focus}", 8), 16) % len(OPTIONAL_FACETS)
    return [*REQUIRED_FACETS, *OPTIONAL_FACETS[shift:], *OPTIONAL_FACETS[:shift]]


def propose_children(node: Node, entities: Sequence[str], n: int) -> list[Proposal]:
    """Up to `n` sub-queries, one entity and one facet each, every one within the 11-token limit."""
    facets = facet_order(node)
    out: list[Proposal] = []
    for e in entities:
        if len(out) >= min(n, len(facets)):
            break
        facet = facets[len(out)]
        contrast = node.focus if facet == "comparison" else ""
        query = QUERY_TEMPLATES[facet].format(e=e, f=contrast)  # type: ignore[index]
        if facet == "comparison" and token_count(query) > MAX_QUERY_TOKENS:
            contrast, query = "", COMPARISON_FALLBACK.format(e=e)
        if token_count(query) > MAX_QUERY_TOKENS or facet_of(query) != facet:
            continue
        out.append(Proposal(query=query, facet=facet, focus=e, contrast=contrast))
    return out


def _facet_signal(facet: str, statement: str, contrast: str) -> float:
    if facet == "quantitative":
        return float(bool(_DIGIT.search(statement)))
    if facet == "timeline":
        return float(bool(_YEAR.search(statement)))
    if facet == "comparison":
        return float(bool(contrast) and mentions(contrast, statement))
    return float(facet_of(statement) == facet)


def offline_statements(node: Node, passages: Sequence[Passage]) -> list[Statement]:
    """Sentences of `passages` about `node`, trimmed to 240 characters, best first (not yet deduplicated)."""
    ranked: list[tuple[float, int, int, Statement]] = []
    for rank, p in enumerate(passages):
        own_page = _same(main_title(p.title), node.focus)
        sents = sentences(p.text)
        if p.clipped:
            sents = sents[:-1]
        for pos, sentence in enumerate(sents):
            text = trim_statement(sentence)
            if text is None or text.endswith(":"):  # a list heading ("X may refer to:") states nothing
                continue
            named = mentions(node.focus, text)
            if not (named or own_page):
                continue
            score = 2.0 * named + own_page + _facet_signal(node.facet, text, node.contrast) - 0.25 * rank
            ranked.append((-score, rank, pos, Statement(text=text, passage_id=p.id, title=p.title)))
    ranked.sort(key=lambda r: r[:3])
    return [r[3] for r in ranked]


def page_root(title: str, text: str) -> Root:
    """The root of a tree seeded by a page: its title, first sentence and first information points."""
    points = [t for s in sentences(text) if (t := trim_statement(s))][:INFO_POINTS]
    name = main_title(title)
    return Root(query=name, focus=name, summary=points[0] if points else "", info_points=tuple(points))


class OfflineProposer:
    """Sub-queries from the entities and titles the node's passages mention."""

    async def propose(self, node: Node, path: Sequence[Node], n: int, taken: frozenset[str]) -> list[Proposal]:
        return propose_children(node, candidate_entities(node, node.passages, sorted(taken)), n)


class OfflineExtractor:
    """Statements from the passages' sentences about the node."""

    async def extract(self, node: Node, passages: Sequence[Passage]) -> list[Statement]:
        return offline_statements(node, passages)


__all__ = [
    "INFO_POINTS",
    "MAX_ENTITY_TOKENS",
    "OfflineExtractor",
    "OfflineProposer",
    "candidate_entities",
    "facet_order",
    "mentions",
    "offline_statements",
    "page_root",
    "propose_children",
]
