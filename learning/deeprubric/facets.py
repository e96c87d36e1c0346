"""Facets of sub-queries (METHOD §11.2) and the checks every set of sibling sub-queries must pass.

The released code asks the QA model for up to L sibling sub-queries, each a different parallel facet of the parent,
with at least one comparison/alternative, one risks/failures and one quantitative facet, each under 12 tokens, and
no two overlapping. Here those rules are a pure check (`check_children`) that any proposer (offline or LLM) is held
to, plus the offline wording of each facet.

Decisions where the paper is silent:
- A sub-query's facet is recognised from cue words (`facet_of`); the three required facets are required only of
  a node with at least 3 children (fewer children cannot hold three facets).
- Two sub-queries overlap when their content-token Jaccard is at least `MAX_OVERLAP` (0.5); a sub-query that
  repeats (normalised) its parent or any ancestor on its path is a duplicate as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from learning.deeprubric.text import normalise, overlap, token_count, words

Facet = Literal[
    "comparison", "risks", "quantitative", "timeline", "stakeholders", "mechanisms", "outcomes", "geography",
    "policy", "controversy", "overview",
]
REQUIRED_FACETS: tuple[Facet, ...] = ("comparison", "risks", "quantitative")
OPTIONAL_FACETS: tuple[Facet, ...] = (
    "timeline", "stakeholders", "mechanisms", "outcomes", "geography", "policy", "controversy",
)
MAX_QUERY_TOKENS = 11  # "under 12 tokens"
MAX_OVERLAP = 0.5

# Cue words by facet, tried in this order (the required facets first, so "compared ... figures" is a comparison).
_CUES: tuple[tuple[Facet, frozenset[str]], ...] = (
    ("comparison", frozenset("compare compared comparison versus vs alternative alternatives contrast contrasted "
                             "differ differs difference differences rival rivals counterpart instead".split())),
    ("risks", frozenset("risk risks failure failures fail failed problem problems criticism criticisms danger "
                        "dangers decline weakness weaknesses setback setbacks threat threats limitation "
                        "limitations harm losses".split())),
    ("quantitative", frozenset("number numbers figure figures statistic statistics statistical count counts size "
                               "population percent percentage amount amounts data rate rates cost costs quantity "
                               "measurements metrics scale".split())),
    ("timeline", frozenset("timeline history historical chronology origins origin dates when era".split())),
    ("stakeholders", frozenset("people groups stakeholders members founders leaders organisations organizations "
                               "involved actors".split())),
    ("mechanisms", frozenset("how mechanism mechanisms causes cause works why process".split())),
    ("outcomes", frozenset("outcome outcomes legacy impact effects effect results consequences influence".split())),
    ("geography", frozenset("where location locations geography region regions place places".split())),
    ("policy", frozenset("policy policies regulation regulations law laws rules governance".split())),
    ("controversy", frozenset("controversy controversies dispute disputes debate debates disputed".split())),
)

# Offline wording: `{e}` is the focus entity, `{f}` a second entity (comparison only).
QUERY_TEMPLATES: dict[Facet, str] = {
    "comparison": "{e} compared with {f}",
    "risks": "{e} risks, failures and criticism",
    "quantitative": "{e} key figures and statistics",
    "timeline": "{e} history and timeline",
    "stakeholders": "people and groups involved in {e}",
    "mechanisms": "how {e} works and its causes",
    "outcomes": "{e} outcomes and legacy",
    "geography": "{e} location and geography",
    "policy": "{e} rules, policy and regulation",
    "controversy": "{e} controversy and disputes",
    "overview": "{e}",
}
COMPARISON_FALLBACK = "{e} versus alternatives"

# Offline question clauses, one per facet (merged into the final question by synthesis).
CLAUSE_TEMPLATES: dict[Facet, str] = {
    "comparison": "how does {e} compare with {f}",
    "risks": "what failures, risks or criticism are recorded for {e}",
    "quantitative": "which figures and numbers document {e}",
    "timeline": "how did {e} develop over time",
    "stakeholders": "who are the main people and groups behind {e}",
    "mechanisms": "what explains how {e} came about or works",
    "outcomes": "what came of {e} and what is its legacy",
    "geography": "where is {e} situated and why does that matter",
    "policy": "which rules or policies shaped {e}",
    "controversy": "what has been disputed about {e}",
    "overview": "what is known about {e}",
}


def facet_of(query: str) -> Facet:
    """The facet a sub-query is about, from its cue words ("overview" when none matches)."""
    tokens = set(words(query))
    for facet, cues in _CUES:
        if tokens & cues:
            return facet
    return "overview"


def has_cue(text: str) -> bool:
    """Whether `text` holds a facet cue word (an entity named like that would blur its sub-query's facet)."""
    tokens = set(words(text))
    return any(tokens & cues for _, cues in _CUES)


def check_children(queries: Sequence[str], ancestors: Sequence[str] = ()) -> list[str]:
    """Violations of the sibling rules among `queries` (empty: they pass).

    Rules: each has at most MAX_QUERY_TOKENS tokens and is not blank; none repeats a sibling or an ancestor query;
    no two siblings overlap (content Jaccard >= MAX_OVERLAP); with 3 or more siblings, the comparison, risks and
    quantitative facets are each present.
    """
    problems: list[str] = []
    seen = {normalise(a) for a in ancestors}
    for i, q in enumerate(queries):
        if not q.strip():
            problems.append(f"blank sub-query at position {i}")
            continue
        n = token_count(q)
        if n > MAX_QUERY_TOKENS:
            problems.append(f"too long ({n} tokens): {q!r}")
        key = normalise(q)
        if key in seen:
            problems.append(f"duplicate: {q!r}")
        seen.add(key)
        for other in queries[:i]:
            if other.strip() and normalise(other) != key and overlap(q, other) >= MAX_OVERLAP:
                problems.append(f"overlap: {other!r} / {q!r}")
    if len(queries) >= len(REQUIRED_FACETS):
        present = {facet_of(q) for q in queries}
        problems.extend(f"missing facet: {f}" for f in REQUIRED_FACETS if f not in present)
    return problems


__all__ = [
    "CLAUSE_TEMPLATES",
    "COMPARISON_FALLBACK",
    "MAX_OVERLAP",
    "MAX_QUERY_TOKENS",
    "OPTIONAL_FACETS",
    "QUERY_TEMPLATES",
    "REQUIRED_FACETS",
    "Facet",
    "check_children",
    "facet_of",
    "has_cue",
]
