"""The KEEP / REVISE / DROP audit of a pair (METHOD §11.4), rule-based, and the invariants every written pair meets.

The six dimensions, as rules over the pair and its selected leaves:
1. alignment — every selected leaf's focus entity is named in the question;
2. deep research — at least 3 selected leaves, whose statements come from at least 2 different pages;
3. rubric quality — atomic (one sentence, at most 300 characters, one evidence statement), judgeable (at least 4
   words; a factual rubric whose wording leans on a pronoun names its leaf's entity), non-overlapping (content
   Jaccard of two descriptions >= 0.7, or the same evidence), 5 to 8 rubrics;
4. evidence sufficiency — non-empty `source_leaf_ids` inside the selection; a factual rubric's evidence is a
   statement of one of its source leaves, verbatim;
5. merge faithfulness — every capitalised name in the question is the root's or a selected leaf's (its path,
   focus, contrast or statements), and the question quotes no rubric;
6. scoring validity — weights in [−1, 1] and not 0; a negative weight is suspect unless the rubric is logical and
   describes content to reject ("incorrect", "confuses", "unsupported", ...).

Decisions where METHOD §11 is silent:
- Problems of dimension 2 cannot be repaired: the pair is dropped with that reason. Every other problem is repaired
  (REVISE is preferred over DROP): the question is re-merged from the selected leaves, rubrics pointing outside the
  selection lose those ids (and are removed if none is left), ungrounded evidence is replaced by an unused statement
  of the rubric's leaf, weights are clamped (a suspect negative weight is made positive), overlapping, zero-weight
  and irreparable rubrics are removed, a pronoun-led factual rubric is prefixed with its entity, and the set is
  topped up to 5 from unused leaf statements or cut to the 8 heaviest; ids are renumbered R1, R2, ...
- The repaired pair must pass `validate_pair`; if it does not, the pair is dropped ("unrepairable"). A KEEP must
  pass it too, so no pair is ever written half-formed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from learning.deeprubric.offline import mentions
from learning.deeprubric.records import AuditVerdict, Leaf, Pair, Problem, Rubric
from learning.deeprubric.select import MIN_SELECTED
from learning.deeprubric.synthesis import MAX_RUBRICS, MIN_RUBRICS, merge
from learning.deeprubric.text import entity_spans, lower_first, normalise, overlap, sentences, words

MAX_DESCRIPTION_CHARS = 300
MIN_DESCRIPTION_WORDS = 4
MAX_RUBRIC_OVERLAP = 0.7
PRONOUNS = frozenset("he she it they this these those his her its their him them".split())
REJECT_CUES = ("incorrect", "wrong", "confus", "misattribut", "irrelevant", "unsupported", "speculat", "invent",
               "fabricat", "mislead")
DIMENSIONS = ("alignment", "deep_research", "rubric_quality", "evidence", "merge", "scoring")


class Auditor(Protocol):
    async def audit(self, pair: Pair) -> AuditVerdict:
        """KEEP, REVISE (with the repaired pair) or DROP (with a reason)."""
        ...


def _p(dim: str, code: str, rid: str | None, msg: str, repairable: bool = True) -> Problem:
    return Problem(dim, code, rid, msg, repairable)


def _statements(leaves: dict[str, Leaf], ids: Sequence[str]) -> list[str]:
    return [s.text for i in ids if i in leaves for s in leaves[i].statements]


def _leans_on_pronoun(r: Rubric, leaves: dict[str, Leaf]) -> bool:
    named = any(mentions(leaves[i].focus, r.description) for i in r.source_leaf_ids if i in leaves)
    return r.type == "factual" and not named and bool(PRONOUNS & set(words(r.description)))


def find_problems(pair: Pair) -> list[Problem]:
    """Every finding of the six rules (see the module docstring)."""
    out: list[Problem] = []
    leaves = {x.id: x for x in pair.leaves}
    selected = set(pair.selected_leaf_ids)
    if len(selected) < MIN_SELECTED:
        out.append(_p("deep_research", "too_few_leaves", None, f"{len(selected)} selected leaves", False))
    if len({s.title for x in pair.leaves for s in x.statements}) < 2:
        out.append(_p("deep_research", "single_source", None, "all evidence comes from one page", False))
    q = pair.question.lower()
    for x in pair.leaves:
        if x.focus.lower() not in q:
            out.append(_p("alignment", "leaf_not_asked", None, f"leaf {x.id} ({x.focus}) is not in the question"))
    support = " ".join([pair.root] + [" ".join([x.focus, x.contrast, *x.path, *(s.text for s in x.statements)])
                                      for x in pair.leaves])
    for name in dict.fromkeys(entity_spans(pair.question)):
        if not mentions(name, support):
            out.append(_p("merge", "unsupported_entity", None, f"{name!r} is in no selected leaf"))
    seen_evidence: set[str] = set()
    for n, r in enumerate(pair.rubrics):
        if r.type not in ("factual", "logical"):
            out.append(_p("rubric_quality", "bad_type", r.id, f"type {r.type!r}"))
        if normalise(r.description) and normalise(r.description) in normalise(pair.question):
            out.append(_p("merge", "question_lists_rubric", r.id, "the question quotes this rubric"))
        if len(words(r.description)) < MIN_DESCRIPTION_WORDS:
            out.append(_p("rubric_quality", "not_judgeable", r.id, "description too short to judge"))
        if len(sentences(r.description)) > 1 or len(r.description) > MAX_DESCRIPTION_CHARS or len(r.evidence) > 1:
            out.append(_p("rubric_quality", "not_atomic", r.id, "more than one claim"))
        if _leans_on_pronoun(r, leaves):
            out.append(_p("rubric_quality", "not_self_contained", r.id, "leans on a pronoun, names no entity"))
        if any(overlap(r.description, o.description) >= MAX_RUBRIC_OVERLAP for o in pair.rubrics[:n]) or (
                r.evidence and r.evidence[0] in seen_evidence):
            out.append(_p("rubric_quality", "overlap", r.id, "repeats an earlier rubric"))
        seen_evidence.update(r.evidence[:1])
        if not r.source_leaf_ids:
            out.append(_p("evidence", "no_source_leaf", r.id, "no source_leaf_ids"))
        elif set(r.source_leaf_ids) - selected:
            out.append(_p("evidence", "leaf_outside_selection", r.id,
                          f"cites {sorted(set(r.source_leaf_ids) - selected)}"))
        if r.type == "factual":
            allowed = _statements(leaves, r.source_leaf_ids)
            if not r.evidence:
                out.append(_p("evidence", "evidence_missing", r.id, "factual rubric without evidence"))
            elif any(e not in allowed for e in r.evidence):
                out.append(_p("evidence", "evidence_not_grounded", r.id, "evidence is no statement of its leaves"))
        if not -1.0 <= r.weight <= 1.0:
            out.append(_p("scoring", "weight_out_of_range", r.id, f"weight {r.weight}"))
        if r.weight == 0:
            out.append(_p("scoring", "zero_weight", r.id, "weight 0"))
        elif r.weight < 0 and (r.type == "factual" or not any(c in r.description.lower() for c in REJECT_CUES)):
            out.append(_p("scoring", "suspect_negative", r.id, "negative weight on content a good answer needs"))
    if not MIN_RUBRICS <= len(pair.rubrics) <= MAX_RUBRICS:
        out.append(_p("rubric_quality", "rubric_count", None, f"{len(pair.rubrics)} rubrics"))
    return out


def _factual(x: Leaf, statement: str) -> Rubric:
    desc = f"States that {lower_first(statement)}"
    if not mentions(x.focus, desc):
        desc = f"About {x.focus}, states that {lower_first(statement)}"
    return Rubric("", "factual", desc, 0.8, (x.id,), (statement,))


def repair(pair: Pair, problems: Sequence[Problem]) -> Pair:
    """The pair with every repairable problem fixed (see the module docstring); validate the result."""
    leaves = {x.id: x for x in pair.leaves}
    selected = set(pair.selected_leaf_ids)
    question, trace = pair.question, pair.merge_trace
    if any(p.dimension in ("alignment", "merge") and p.rubric_id is None for p in problems) or any(
            p.code == "question_lists_rubric" for p in problems):
        question, steps = merge(pair.root, pair.leaves)
        trace = tuple(steps)
    flagged = {(p.rubric_id, p.code) for p in problems if p.rubric_id}
    used = {e for r in pair.rubrics for e in r.evidence[:1] if (r.id, "overlap") not in flagged}
    fixed: list[Rubric] = []
    for r in pair.rubrics:
        ids = tuple(i for i in r.source_leaf_ids if i in selected)
        if not ids or r.weight == 0 or (r.id, "overlap") in flagged or r.type not in ("factual", "logical"):
            continue
        weight = max(-1.0, min(1.0, r.weight))
        if (r.id, "suspect_negative") in flagged:
            weight = abs(weight)
        desc = " ".join(r.description.split())
        if (r.id, "not_atomic") in flagged and r.type == "logical":
            desc = sentences(desc)[0][:MAX_DESCRIPTION_CHARS] if desc else desc
        if r.type == "factual":
            allowed = _statements(leaves, ids)
            evidence = next((e for e in r.evidence if e in allowed), None)
            if evidence is None:
                evidence = next((e for e in allowed if e not in used), None)
                if evidence is None:
                    continue
                used.add(evidence)
            leaf = next(leaves[i] for i in ids if evidence in _statements(leaves, [i]))
            rebuilt = _factual(leaf, evidence)
            needs = {"not_atomic", "not_self_contained", "evidence_not_grounded", "evidence_missing"}
            if any((r.id, c) in flagged for c in needs) or evidence not in r.evidence:
                desc = rebuilt.description
            r = replace(r, evidence=(evidence,))
        fixed.append(replace(r, description=desc, weight=weight, source_leaf_ids=ids))
    for x in pair.leaves:  # top up to the minimum from statements no rubric uses yet
        for s in x.statements:
            if len(fixed) >= MIN_RUBRICS:
                break
            if s.text not in used and all(overlap(s.text, f.description) < MAX_RUBRIC_OVERLAP for f in fixed):
                fixed.append(_factual(x, s.text))
                used.add(s.text)
    if len(fixed) > MAX_RUBRICS:
        keep = sorted(sorted(range(len(fixed)), key=lambda i: -abs(fixed[i].weight))[:MAX_RUBRICS])
        fixed = [fixed[i] for i in keep]
    rubrics = tuple(replace(r, id=f"R{n}") for n, r in enumerate(fixed, 1))
    return replace(pair, question=question, merge_trace=trace, rubrics=rubrics)


def validate_pair(pair: Pair, max_rubrics: int | None = None) -> list[str]:
    """Why `pair` may not be written (empty: it may): the invariants of METHOD §11.3-§11.4."""
    errors: list[str] = []
    leaves = {x.id: x for x in pair.leaves}
    if not pair.question.strip():
        errors.append("empty question")
    if tuple(x.id for x in pair.leaves) != pair.selected_leaf_ids or len(leaves) != len(pair.leaves):
        errors.append("leaves do not match selected_leaf_ids")
    if len(pair.rubrics) < MIN_RUBRICS or (max_rubrics is not None and len(pair.rubrics) > max_rubrics):
        errors.append(f"{len(pair.rubrics)} rubrics")
    if len({r.id for r in pair.rubrics}) != len(pair.rubrics):
        errors.append("rubric ids repeat")
    for r in pair.rubrics:
        if r.type not in ("factual", "logical") or not r.description.strip():
            errors.append(f"{r.id}: bad type or empty description")
        if not -1.0 <= r.weight <= 1.0 or r.weight == 0:
            errors.append(f"{r.id}: weight {r.weight}")
        if not r.source_leaf_ids or set(r.source_leaf_ids) - set(pair.selected_leaf_ids):
            errors.append(f"{r.id}: source_leaf_ids outside the selection")
        if r.type == "factual" and (not r.evidence or any(e not in _statements(leaves, r.source_leaf_ids)
                                                          for e in r.evidence)):
            errors.append(f"{r.id}: evidence is not a statement of its leaves")
    return errors


def audit_pair(pair: Pair) -> AuditVerdict:
    """KEEP (no finding), REVISE (every finding repaired) or DROP (reason: the first code that cannot be repaired)."""
    problems = find_problems(pair)
    hard = [p for p in problems if not p.repairable]
    if hard:
        return AuditVerdict("DROP", tuple(problems), reason=hard[0].code)
    if not problems:
        if validate_pair(pair):
            return AuditVerdict("DROP", (), reason="invalid")
        return AuditVerdict("KEEP", ())
    revised = repair(pair, problems)
    if validate_pair(revised, MAX_RUBRICS) or [p for p in find_problems(revised) if not p.repairable]:
        return AuditVerdict("DROP", tuple(problems), reason="unrepairable")
    return AuditVerdict("REVISE", tuple(problems), revised=revised)


class OfflineAuditor:
    """The rule-based audit (`audit_pair`)."""

    async def audit(self, pair: Pair) -> AuditVerdict:
        return audit_pair(pair)


__all__ = [
    "DIMENSIONS",
    "MAX_DESCRIPTION_CHARS",
    "MAX_RUBRIC_OVERLAP",
    "MIN_DESCRIPTION_WORDS",
    "Auditor",
    "OfflineAuditor",
    "audit_pair",
    "find_problems",
    "repair",
    "validate_pair",
]
