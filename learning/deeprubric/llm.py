"""The LLM mode of DeepRubric (METHOD §11.2–11.4): proposer, extractor, gate, synthesiser and auditor over any
OpenAI-compatible endpoint, through the judge client (`learning.judge.client.JudgeClient`: JSON-schema response
format with its fallbacks, strict parsing, one repair request, concurrency limit, backoff, disk cache, usage).

Every step renders a prompt file (`learning/prompts/deeprubric_*.md`), asks for JSON of a schema, and checks the
answer with the same rules the offline pipeline is held to. A check that fails raises `_Invalid` with a short code
and a message naming everything wrong; the client then sends its ONE repair request, quoting that message. If the
repaired answer fails too, the step's output is dropped and counted by `<step>:<code>` in the `Ledger`, never kept:

- propose: `facets.check_children` over the sub-queries (length, overlap, duplicates, required facets). After a
  failed repair the last answer goes to the tree builder, whose `repair_children` removes each breaking sub-query
  (counted as rejected sub-queries); a node left without children is a leaf.
- extract: each statement a verbatim piece (whitespace collapsed) of a passage of the node, at most 240
  characters. After a failed repair the verbatim statements of the last answer are kept and every other one is
  dropped and counted (`extract:not_verbatim`, `extract:too_long`).
- gate: a boolean `expand`. After a failed repair branching goes on (the offline gate's behaviour; the builder's
  other stops still apply).
- synthesise: 3-5 selected leaves with statements, a question, 5-8 rubrics citing only selected leaves, factual
  evidence that is a statement of its leaves, weights in [-1, 1] and not 0, a merge trace whose sources exist.
  After a failed repair the tree gives no pair: `Skip("synthesis_invalid:<code>")`.
- audit: KEEP / REVISE / DROP; a REVISE carries a question and 5-8 rubrics held to the synthesis rules. After a
  failed repair the pair is dropped: `DROP` with reason `audit_invalid:<code>`.

An endpoint that stays unavailable (or rejects the request) is a failure of that step too (`<step>:unavailable`,
`<step>:rejected`), with the same outcome. Nothing raises out of a step except `Skip`, which the build counts.

Decisions where METHOD §11 is silent:
- A statement whose passage id is wrong but whose text is a verbatim piece of another passage of the same node is
  kept with that passage's id (the text is grounded; only the label was wrong).
- Evidence of a factual rubric may be a statement of its source leaves or a verbatim piece of one (at least 25
  characters); it is stored as the whole statement, so `audit.validate_pair` holds.
- A sub-query's facet is the one its cue words show (`facets.facet_of`, which `check_children` counts), else the
  facet the model named.
- Rubric ids are renumbered R1, R2, ... in the model's order; the merge trace gets a final step `Q` holding the
  question when the model's last step does not.
- The root keeps the offline summary and information points (the seed page's first sentences).
- Sampling: temperature 0.4 as the released code (METHOD §11.2); tests pass 0.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from learning.deeprubric.audit import DIMENSIONS
from learning.deeprubric.facets import OPTIONAL_FACETS, REQUIRED_FACETS, check_children, facet_of
from learning.deeprubric.records import (
    AuditVerdict,
    Leaf,
    MergeStep,
    Node,
    Pair,
    Passage,
    Problem,
    Rubric,
    SelectionStep,
    Statement,
    Tree,
    stable_hex,
)
from learning.deeprubric.select import MAX_SELECTED, MIN_SELECTED
from learning.deeprubric.synthesis import MAX_RUBRICS, MIN_RUBRICS, Skip, reference_answer
from learning.deeprubric.text import MIN_STATEMENT_CHARS, STATEMENT_CHARS, collapse
from learning.deeprubric.tree import Proposal
from learning.errors import JudgeError, JudgeOutputInvalid, JudgeUnavailable
from learning.judge.types import JsonJudge, Usage
from learning.prompts import render

SYSTEM_MESSAGE = (
    "You build evaluation data for deep-research agents from retrieved evidence. Use only the material you are "
    "shown. Reply with a single JSON object of the requested shape and nothing else."
)
TEMPERATURE = 0.4  # METHOD §11.2
STEPS = ("propose", "extract", "gate", "synthesise", "audit")
_CODE = re.compile(r"wrong shape: \[([a-z_]+)\]")
FACETS = [*REQUIRED_FACETS, *OPTIONAL_FACETS]

# --- JSON schemas (strict-mode shape: every property required, no extra properties) ------------------------------

_STR = {"type": "string"}


def _obj(props: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": dict(props), "required": list(props), "additionalProperties": False}


def _arr(items: Mapping[str, Any], max_items: int) -> dict[str, Any]:
    return {"type": "array", "items": dict(items), "maxItems": max_items}


RUBRIC_SCHEMA = _obj({
    "id": _STR, "type": {"type": "string", "enum": ["factual", "logical"]}, "description": _STR,
    "weight": {"type": "number"}, "source_leaf_ids": _arr(_STR, MAX_SELECTED), "evidence": _arr(_STR, 2),
})  # fmt: skip


def subquery_schema(n: int) -> dict[str, Any]:
    item = _obj({"query": _STR, "facet": {"type": "string", "enum": FACETS}, "focus": _STR, "contrast": _STR})
    return _obj({"sub_queries": _arr(item, n)})


def extract_schema(n: int) -> dict[str, Any]:
    return _obj({"statements": _arr(_obj({"text": {"type": "string", "maxLength": 400}, "passage_id": _STR}), n)})


GATE_SCHEMA = _obj({"expand": {"type": "boolean"}, "reason": _STR})
SYNTHESIS_SCHEMA = _obj({
    "selected_leaf_ids": _arr(_STR, MAX_SELECTED),
    "selection_trace": _arr(_obj({"leaf_id": _STR, "chosen": {"type": "boolean"}, "reason": _STR}), 12),
    "merge_trace": _arr(_obj({"id": _STR, "level": {"type": "integer"}, "sources": _arr(_STR, MAX_SELECTED),
                              "query": _STR}), 6),
    "question": _STR,
    "rubrics": _arr(RUBRIC_SCHEMA, MAX_RUBRICS),
})  # fmt: skip
AUDIT_SCHEMA = _obj({
    "decision": {"type": "string", "enum": ["KEEP", "REVISE", "DROP"]},
    "drop_reason": {"type": "string", "enum": [*DIMENSIONS, "none"]},
    "problems": _arr(_obj({"dimension": {"type": "string", "enum": list(DIMENSIONS)}, "rubric_id": _STR,
                           "message": _STR}), 8),
    "revised_question": _STR,
    "revised_rubrics": _arr(RUBRIC_SCHEMA, MAX_RUBRICS),
})  # fmt: skip


# --- the ledger --------------------------------------------------------------------------------------------------


class Ledger:
    """What the LLM steps asked, cost, repaired, failed and dropped since the last `take()` (the build records one
    snapshot per tree line and per audit line, so the statistics are sums over the files and survive resuming)."""

    def __init__(self) -> None:
        self.usage = Usage()
        self.steps: Counter[str] = Counter()  # step calls (a repaired call is one step call, two requests)
        self.repaired: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  # "<step>:<code>": a step output that failed after its repair
        self.dropped: Counter[str] = Counter()  # "<step>:<code>": items removed from a salvaged answer

    def take(self) -> dict[str, Any]:
        """The counts as JSON-ready data, and start again from zero."""
        u = self.usage
        out = {
            "requests": u.calls, "cached": u.cached_calls, "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens, "cost_usd": round(u.cost_usd, 6),
            "steps": dict(self.steps), "repaired": dict(self.repaired), "failures": dict(self.failures),
            "dropped": dict(self.dropped),
        }  # fmt: skip
        self.__init__()  # type: ignore[misc]
        return out


def sum_ledgers(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of `Ledger.take()` snapshots."""
    total: dict[str, Any] = {"requests": 0, "cached": 0, "prompt_tokens": 0, "completion_tokens": 0,
                             "cost_usd": 0.0}
    counters: dict[str, Counter[str]] = {k: Counter() for k in ("steps", "repaired", "failures", "dropped")}
    for r in records:
        for k in total:
            total[k] += r.get(k, 0)
        for k, c in counters.items():
            c.update(r.get(k, {}))
    total["cost_usd"] = round(total["cost_usd"], 6)
    return {**total, **{k: dict(sorted(c.items())) for k, c in counters.items()}}


# --- asking, checking and the repair ------------------------------------------------------------------------------


class _Invalid(ValueError):
    """A check failed; the code is counted, the message goes into the repair request."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code


def _fail(errors: Sequence[tuple[str, str]]) -> None:
    """Raise `_Invalid` naming every error (the first one's code is the one counted)."""
    if errors:
        raise _Invalid(errors[0][0], "; ".join(m for _, m in errors))


def _failure_code(exc: JudgeError) -> str:
    if not isinstance(exc, JudgeOutputInvalid):
        return "unavailable" if isinstance(exc, JudgeUnavailable) else "rejected"
    text = str(exc)
    if (m := _CODE.search(text)) is not None:
        return m.group(1)
    if "wrong shape" in text or "missing required keys" in text or "expected a JSON" in text:
        return "schema"
    return "invalid_json"


def _reason(step: str, code: str | None) -> str:
    """The counted reason of a failed step: `<step>_invalid:<code>`, or `<step>_unavailable` / `_rejected`."""
    return f"{step}_{code}" if code in ("unavailable", "rejected") else f"{step}_invalid:{code}"


class _Outcome:
    """One step call's result: `value` when the answer (or its repair) passed, else `code` and the last answer
    the check saw (`last`, for salvage)."""

    def __init__(self, value: Any = None, code: str | None = None, last: Any = None) -> None:
        self.value, self.code, self.last = value, code, last


class LLMSteps:
    """The shared part of the five steps: the client, the ledger, the prompt messages."""

    def __init__(self, client: JsonJudge, ledger: Ledger | None = None, temperature: float = TEMPERATURE,
                 max_tokens: int | None = None) -> None:
        self.client = client
        self.ledger = ledger if ledger is not None else Ledger()
        self.temperature = temperature
        self.max_tokens = max_tokens

    @property
    def model(self) -> str:
        return self.client.model

    async def ask(self, step: str, template: str, variables: Mapping[str, str], schema: Mapping[str, Any],
                  check: Callable[[Any], Any]) -> _Outcome:
        """Render, ask, check (one repair on a failed check), account; never raises a JudgeError."""
        seen: dict[str, Any] = {}

        def validate(data: Any) -> Any:
            seen["last"] = data
            try:
                return check(data)
            except _Invalid:
                raise
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise _Invalid("schema", f"unexpected shape ({type(exc).__name__}: {exc})") from None

        messages = [{"role": "system", "content": SYSTEM_MESSAGE},
                    {"role": "user", "content": render(template, **variables)}]
        self.ledger.steps[step] += 1
        try:
            call = await self.client.complete_json(messages, schema, name=f"deeprubric_{step}", validate=validate,
                                                   max_tokens=self.max_tokens, temperature=self.temperature)
        except JudgeError as exc:
            self.ledger.usage = self.ledger.usage + (exc.usage or Usage())
            code = _failure_code(exc)
            self.ledger.failures[f"{step}:{code}"] += 1
            return _Outcome(code=code, last=seen.get("last") if _CODE.search(str(exc)) else None)
        self.ledger.usage = self.ledger.usage + call.usage
        if call.repaired:
            self.ledger.repaired[step] += 1
        return _Outcome(value=call.data)


# --- rendering helpers ---------------------------------------------------------------------------------------------


def _path_text(path: Sequence[Node], node: Node) -> str:
    return " > ".join(n.query for n in (*path, node))


def _statements_text(node: Node) -> str:
    return "\n".join(f"- {s.text}" for s in node.statements) or "(none)"


def _leaf_text(leaf: Leaf) -> str:
    lines = [f"[{leaf.id}] facet: {leaf.facet}; path: {' > '.join(leaf.path)}"]
    lines += [f"  - {s.text}" for s in leaf.statements]
    return "\n".join(lines)


def _s(x: Any) -> str:
    return collapse(str(x)) if x is not None else ""


# --- proposer, extractor, gate ------------------------------------------------------------------------------------


class LLMProposer:
    """Facet-diverse sub-queries, held to `facets.check_children` (see the module docstring)."""

    def __init__(self, steps: LLMSteps) -> None:
        self.steps = steps

    async def propose(self, node: Node, path: Sequence[Node], n: int, taken: frozenset[str]) -> list[Proposal]:
        ancestors = [x.query for x in (*path, node)]

        def check(data: Any) -> list[Proposal]:
            out: list[Proposal] = []
            for item in list(data["sub_queries"])[:n]:
                query = _s(item.get("query"))
                named = _s(item.get("facet"))
                facet = facet_of(query)
                if facet == "overview" and named in FACETS:
                    facet = named  # type: ignore[assignment]
                out.append(Proposal(query=query, facet=facet, focus=_s(item.get("focus")) or query,
                                    contrast=_s(item.get("contrast"))))
            problems = check_children([p.query for p in out], ancestors)
            _fail([("check_children", p) for p in problems])
            return out

        outcome = await self.steps.ask("propose", "deeprubric_subqueries", {
            "path": _path_text(path, node), "node": f"{node.query} (focus: {node.focus}; facet: {node.facet})",
            "statements": _statements_text(node), "taken": ", ".join(sorted(taken)) or "(none)", "n": str(n),
        }, subquery_schema(n), check)  # fmt: skip
        if outcome.value is not None:
            return outcome.value  # type: ignore[no-any-return]
        if outcome.code == "check_children" and outcome.last is not None:
            # The tree builder removes each sub-query that breaks the rules, and counts it.
            return [Proposal(query=_s(i.get("query")), facet=facet_of(_s(i.get("query"))),
                             focus=_s(i.get("focus")) or _s(i.get("query")), contrast=_s(i.get("contrast")))
                    for i in list(outcome.last["sub_queries"])[:n]]
        return []


def resolve_statement(text: str, passage_id: str, passages: Sequence[Passage]) -> Passage | None:
    """The passage `text` is a verbatim piece of: the named one, else the first of the node's that holds it."""
    needle = collapse(text)
    if not needle:
        return None
    named = [p for p in passages if p.id == passage_id]
    for p in [*named, *passages]:
        if needle in collapse(p.text):
            return p
    return None


def _statements_of(data: Any, passages: Sequence[Passage]) -> tuple[list[Statement], list[tuple[str, str]]]:
    kept: list[Statement] = []
    errors: list[tuple[str, str]] = []
    for i, item in enumerate(data["statements"], 1):
        text = _s(item.get("text"))
        passage = resolve_statement(text, _s(item.get("passage_id")), passages)
        if passage is None:
            errors.append(("not_verbatim", f"statement {i} is not a verbatim piece of any passage: {text[:120]!r}"))
        elif len(text) > STATEMENT_CHARS:
            errors.append(("too_long", f"statement {i} has {len(text)} characters (at most {STATEMENT_CHARS})"))
        else:
            kept.append(Statement(text=text, passage_id=passage.id, title=passage.title))
    return kept, errors


class LLMExtractor:
    """Statements that are verbatim pieces of the node's passages; anything else is dropped and counted."""

    def __init__(self, steps: LLMSteps, max_statements: int = 6) -> None:
        self.steps = steps
        self.max_statements = max_statements

    async def extract(self, node: Node, passages: Sequence[Passage]) -> list[Statement]:
        if not passages:
            return []

        def check(data: Any) -> list[Statement]:
            kept, errors = _statements_of(data, passages)
            _fail(errors)
            return kept

        block = "\n\n".join(f"<passage id=\"{p.id}\" title=\"{p.title}\">\n{p.text}\n</passage>" for p in passages)
        outcome = await self.steps.ask("extract", "deeprubric_extract",
                                       {"query": node.query, "passages": block, "n": str(self.max_statements)},
                                       extract_schema(self.max_statements), check)
        if outcome.value is not None:
            return outcome.value  # type: ignore[no-any-return]
        if outcome.code in ("not_verbatim", "too_long") and outcome.last is not None:
            kept, errors = _statements_of(outcome.last, passages)
            for code, _ in errors:
                self.steps.ledger.dropped[f"extract:{code}"] += 1
            return kept
        return []


class LLMGate:
    """Whether branching below a node would add new decision-relevant evidence (a failed answer: branch)."""

    def __init__(self, steps: LLMSteps) -> None:
        self.steps = steps

    async def expand(self, node: Node, path: Sequence[Node]) -> bool:
        def check(data: Any) -> bool:
            if not isinstance(data["expand"], bool):
                raise _Invalid("schema", "`expand` must be true or false")
            return data["expand"]

        outcome = await self.steps.ask("gate", "deeprubric_gate", {
            "path": _path_text(path, node), "query": node.query, "statements": _statements_text(node),
        }, GATE_SCHEMA, check)  # fmt: skip
        return True if outcome.value is None else bool(outcome.value)


# --- rubrics, synthesis and audit ----------------------------------------------------------------------------------


def ground_evidence(text: str, statements: Sequence[str]) -> str | None:
    """The leaf statement `text` is (whitespace collapsed) or is a verbatim piece of (>= 25 characters), else None."""
    needle = collapse(text)
    for s in statements:
        if needle == collapse(s):
            return s
    if len(needle) >= MIN_STATEMENT_CHARS:
        for s in statements:
            if needle in collapse(s):
                return s
    return None


def parse_rubrics(items: Sequence[Any], selected: Sequence[str], leaves: Mapping[str, Leaf],
                  errors: list[tuple[str, str]]) -> list[Rubric]:
    """Rubrics from model JSON, renumbered R1.., each problem appended to `errors` as (code, message)."""
    n = len(items)
    if n < MIN_RUBRICS:
        errors.append(("too_few_rubrics", f"{n} rubrics; write {MIN_RUBRICS} to {MAX_RUBRICS}"))
    elif n > MAX_RUBRICS:
        errors.append(("too_many_rubrics", f"{n} rubrics; write {MIN_RUBRICS} to {MAX_RUBRICS}"))
    out: list[Rubric] = []
    for i, item in enumerate(items, 1):
        rid, kind, desc = f"R{i}", _s(item.get("type")), _s(item.get("description"))
        label = f"rubric {i} ({_s(item.get('id')) or rid})"
        if kind not in ("factual", "logical"):
            errors.append(("bad_type", f"{label}: type must be factual or logical"))
        if not desc:
            errors.append(("empty_description", f"{label}: empty description"))
        try:
            weight = float(item.get("weight"))
        except (TypeError, ValueError):
            weight = 0.0
        if not -1.0 <= weight <= 1.0 or weight == 0:
            errors.append(("bad_weight", f"{label}: weight must be in [-1, 1] and not 0"))
        sources = tuple(dict.fromkeys(_s(x) for x in item.get("source_leaf_ids") or ()))
        outside = [x for x in sources if x not in selected]
        if not sources:
            errors.append(("no_source_leaf", f"{label}: source_leaf_ids is empty"))
        elif outside:
            errors.append(("leaf_outside_selection", f"{label}: cites {outside}, outside the selected leaves "
                           f"{list(selected)}"))
        evidence: list[str] = []
        if kind == "factual":
            allowed = [s.text for x in sources if x in leaves for s in leaves[x].statements]
            raw = [_s(e) for e in item.get("evidence") or () if _s(e)]
            if not raw:
                errors.append(("evidence_missing", f"{label}: a factual rubric needs evidence from its leaves"))
            for e in raw:
                grounded = ground_evidence(e, allowed)
                if grounded is None:
                    errors.append(("evidence_not_grounded", f"{label}: evidence {e[:100]!r} is not a statement of "
                                   "its source leaves"))
                elif grounded not in evidence:
                    evidence.append(grounded)
        kind = kind if kind in ("factual", "logical") else "logical"
        out.append(Rubric(rid, kind, desc, weight, sources, tuple(evidence)))  # type: ignore[arg-type]
    return out


def final_merge(steps: Sequence[MergeStep], question: str, fallback_sources: Sequence[str]) -> tuple[MergeStep, ...]:
    """The merge trace ending with `Q` = the question (appended when the last step is not it)."""
    out = list(steps)
    if out and out[-1].query == question:
        last = out[-1]
        out[-1] = MergeStep("Q", last.level, last.sources, question)
        return tuple(out)
    used = {s for m in out for s in m.sources}
    tops = [m.id for m in out if m.id not in used] or list(fallback_sources)
    level = max((m.level for m in out), default=0) + 1
    return (*out, MergeStep("Q", level, tuple(tops), question))


class LLMSynthesiser:
    """Leaf selection, bottom-up merge and rubrics written together by the model (METHOD §11.3)."""

    def __init__(self, steps: LLMSteps) -> None:
        self.steps = steps

    async def synthesise(self, tree: Tree, leaves: Sequence[Leaf]) -> Pair:
        usable = [x for x in leaves if x.statements]
        if len(usable) < MIN_SELECTED:
            raise Skip("too_few_leaves", f"{len(usable)} leaves with statements of {len(leaves)}")
        by_id = {x.id: x for x in usable}
        all_ids = {x.id for x in leaves}

        def check(data: Any) -> Pair:
            errors: list[tuple[str, str]] = []
            selected = list(dict.fromkeys(_s(x) for x in data["selected_leaf_ids"]))
            unknown = [x for x in selected if x not in by_id]
            if unknown:
                errors.append(("unknown_leaf", f"selected_leaf_ids {unknown} are not leaves with statements"))
            selected = [x for x in selected if x in by_id]
            if not MIN_SELECTED <= len(selected) <= MAX_SELECTED:
                errors.append(("selection_size", f"{len(selected)} usable selected leaves; select {MIN_SELECTED} "
                               f"to {MAX_SELECTED}"))
            question = _s(data["question"])
            if not question:
                errors.append(("empty_question", "the question is empty"))
            rubrics = parse_rubrics(list(data["rubrics"]), selected, by_id, errors)
            steps: list[MergeStep] = []
            for m in data["merge_trace"]:
                mid, sources = _s(m.get("id")), tuple(_s(x) for x in m.get("sources") or ())
                known = set(selected) | {s.id for s in steps}
                if not mid or not sources or set(sources) - known:
                    errors.append(("bad_merge_trace", f"merge step {mid or '?'}: sources {list(sources)} must be "
                                   "selected leaves or earlier merge steps"))
                steps.append(MergeStep(mid, int(m.get("level") or 1), sources, _s(m.get("query"))))
            if not steps:
                errors.append(("bad_merge_trace", "merge_trace is empty"))
            reasons = {_s(s.get("leaf_id")): _s(s.get("reason")) for s in data["selection_trace"]}
            if set(reasons) - all_ids:
                errors.append(("unknown_leaf", f"selection_trace names {sorted(set(reasons) - all_ids)}, not leaves"))
            _fail(errors)
            chosen = [by_id[x] for x in selected]
            trace = [SelectionStep(x, True, by_id[x].facet, 0.0, reasons.get(x) or "chosen") for x in selected]
            trace += [SelectionStep(x.id, False, x.facet, 0.0, reasons.get(x.id) or
                                    ("not chosen" if x.statements else "no statements"))
                      for x in leaves if x.id not in selected]
            return Pair(
                id=f"dr-{stable_hex(tree.key)}", tree_id=tree.id, key=tree.key, mode="llm", root=tree.seed_title,
                question=question, answer=reference_answer(chosen), selected_leaf_ids=tuple(selected),
                leaves=tuple(chosen), rubrics=tuple(rubrics), selection_trace=tuple(trace),
                merge_trace=final_merge(steps, question, selected),
            )  # fmt: skip

        outcome = await self.steps.ask("synthesise", "deeprubric_synthesis", {
            "root": tree.seed_title, "leaves": "\n".join(_leaf_text(x) for x in usable),
            "min_leaves": str(MIN_SELECTED), "max_leaves": str(MAX_SELECTED),
            "min_rubrics": str(MIN_RUBRICS), "max_rubrics": str(MAX_RUBRICS),
        }, SYNTHESIS_SCHEMA, check)  # fmt: skip
        if outcome.value is None:
            raise Skip(_reason("synthesis", outcome.code))
        return outcome.value  # type: ignore[no-any-return]


def _rubrics_text(pair: Pair) -> str:
    return "\n".join(json.dumps({"id": r.id, "type": r.type, "description": r.description, "weight": r.weight,
                                 "source_leaf_ids": list(r.source_leaf_ids), "evidence": list(r.evidence)},
                                ensure_ascii=False) for r in pair.rubrics)


class LLMAuditor:
    """KEEP / REVISE / DROP on METHOD §11.4's six dimensions; a REVISE is held to the synthesis rules."""

    def __init__(self, steps: LLMSteps) -> None:
        self.steps = steps

    async def audit(self, pair: Pair) -> AuditVerdict:
        leaves = {x.id: x for x in pair.leaves}

        def check(data: Any) -> AuditVerdict:
            decision = _s(data["decision"]).upper()
            if decision not in ("KEEP", "REVISE", "DROP"):
                raise _Invalid("schema", "decision must be KEEP, REVISE or DROP")
            problems = tuple(
                Problem(_s(p.get("dimension")), "llm", _s(p.get("rubric_id")) or None, _s(p.get("message")),
                        decision != "DROP")
                for p in data["problems"])  # fmt: skip
            if decision == "KEEP":
                return AuditVerdict("KEEP", problems)
            if decision == "DROP":
                reason = _s(data["drop_reason"])
                return AuditVerdict("DROP", problems, reason=reason if reason in DIMENSIONS else "unspecified")
            errors: list[tuple[str, str]] = []
            question = _s(data["revised_question"])
            if not question:
                errors.append(("empty_question", "a REVISE needs a non-empty revised_question"))
            rubrics = parse_rubrics(list(data["revised_rubrics"]), pair.selected_leaf_ids, leaves, errors)
            _fail(errors)
            steps = [m for m in pair.merge_trace if m.id != "Q"]
            revised = replace(pair, question=question, rubrics=tuple(rubrics),
                              merge_trace=final_merge(steps, question, pair.selected_leaf_ids))
            return AuditVerdict("REVISE", problems, revised=revised)

        outcome = await self.steps.ask("audit", "deeprubric_audit", {
            "question": pair.question, "leaves": "\n".join(_leaf_text(x) for x in pair.leaves),
            "rubrics": _rubrics_text(pair), "min_rubrics": str(MIN_RUBRICS), "max_rubrics": str(MAX_RUBRICS),
        }, AUDIT_SCHEMA, check)  # fmt: skip
        if outcome.value is None:
            return AuditVerdict("DROP", (), reason=_reason("audit", outcome.code))
        return outcome.value  # type: ignore[no-any-return]


def llm_steps(client: JsonJudge, temperature: float = TEMPERATURE, max_tokens: int | None = None,
              max_statements: int = 6) -> tuple[LLMProposer, LLMExtractor, LLMGate, LLMSynthesiser, LLMAuditor, Ledger]:
    """The five LLM steps over one client, sharing one ledger."""
    steps = LLMSteps(client, Ledger(), temperature, max_tokens)
    return (LLMProposer(steps), LLMExtractor(steps, max_statements), LLMGate(steps), LLMSynthesiser(steps),
            LLMAuditor(steps), steps.ledger)


__all__ = [
    "AUDIT_SCHEMA",
    "GATE_SCHEMA",
    "STEPS",
    "SYNTHESIS_SCHEMA",
    "LLMAuditor",
    "LLMExtractor",
    "LLMGate",
    "LLMProposer",
    "LLMSteps",
    "LLMSynthesiser",
    "Ledger",
    "extract_schema",
    "final_merge",
    "ground_evidence",
    "llm_steps",
    "parse_rubrics",
    "resolve_statement",
    "subquery_schema",
    "sum_ledgers",
]
