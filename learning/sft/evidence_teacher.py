"""The evidence-chain teacher: scaffold trajectories written from gold evidence, no LLM endpoint needed.

For a question with a gold evidence chain (HotpotQA supporting facts, MuSiQue decompositions, DeepRubric leaves)
it writes what a good research agent would: a plan whose deep analysis names the hops, a rubric checklist of what a
correct answer must contain and a research plan; one real `local_search` per hop, the first with the question itself
and the others with a query written from the hop (never the gold sentence), kept only when its results hold the gold
passage (when the question misses the first hop's passage, the hop's written query follows; each written query may
be reformulated once, which stays in the trajectory as a model that recovers from a miss; a second miss rejects the
question); a state evaluation
after every result and a review that tick the rubric items against the snippet ids found; and an answer in the
requested format citing exactly those snippets (`\\boxed{}` for exact answers).

Every section's wording is drawn from several phrasings with a seeded generator, so the student learns the structure
rather than one template. Citations only ever name snippet ids a tool returned in this trajectory. The text is
written to fit the research graph's turn boundaries and the default per-stage token caps (agent.config).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.nodes.tools import render_output
from agent.protocols import SearchTool
from agent.tools.ids import CallIdFactory
from learning.sft.questions import Hop, SFTQuestion, clip, keywords, main_title
from learning.sft.trajectory import EVIDENCE_NOT_FOUND, Segment, Trajectory
from store.records import Snippet

# /2: the answer comes first, quotes of at most CITE_CHARS. /3: the state evaluation names the entity the next search
# is about (the bridge a hop found), so the student's next query copies a name it just wrote.
# /4: the answer is grounded in a verbatim window of the retrieved passage that holds it, quoted in the last think,
# the review and the answer's citation: the /3 student boxed a plausible entity from the wrong passage.
# /5: the first search is the question itself (the hop's written query is its one reformulation): on held-out items
# one search with the question found 0.67-0.84 of the gold passages, the /3 student's own hop queries 0.50-0.64
# (it compressed or looped them), and copying the question is the one query a 135M student writes reliably.
TEACHER_NAME = "evidence-chain/5"
TOOL = "local_search"


class EvidenceMissing(Exception):
    """A hop's gold passage was not found by the query nor by its one reformulation."""

    reason = EVIDENCE_NOT_FOUND


@dataclass(frozen=True, slots=True)
class _Search:
    query: str
    results: tuple[Snippet, ...]
    gold: Snippet | None  # the hop's gold passage among the results, if found
    hop: int  # index of the hop it served


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def is_gold(snippet: Snippet, hop: Hop) -> bool:
    """Whether a retrieved snippet is the hop's gold passage (same title, same opening text)."""
    if _norm(snippet.title) != _norm(hop.title):
        return False
    a, b = _norm(snippet.text)[:80], _norm(hop.text)[:80]
    return a[:40] in b or b[:40] in a


def _reformulate(hop: Hop, question: str, first: str) -> str:
    name = main_title(hop.title)
    retry = " ".join([name, *keywords(question, 5, drop=name)])
    if _norm(retry) == _norm(first):
        retry = " ".join([name, *keywords(hop.need, 4, drop=name)])
    return retry


def question_query(question: str) -> str:
    """The first search of every trajectory: the question as asked, without its trailing question mark (the agent's
    question-first search keeps the mark, as vanilla RAG does; `/5` data was written with this form)."""
    return " ".join(question.split()).rstrip(" ?")


def answer_window(text: str, answer: str, limit: int) -> str:
    """A verbatim piece of `text` of at most `limit` characters that contains `answer` (case-insensitive): the
    sentence holding it, or a word-bounded window around it inside that sentence; "" when the text does not contain
    the answer (yes/no answers, for example) or the answer alone is longer than `limit`."""
    flat = " ".join(text.split())
    needle = " ".join(answer.split()).lower()
    if not needle or len(needle) > limit:
        return ""
    found = re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", flat, re.IGNORECASE)  # a word, not "re-trans|latin|g"
    if found is None:
        return ""
    at = found.start()
    start = flat.rfind(". ", 0, at)
    start = 0 if start < 0 else start + 2
    end = flat.find(". ", at + len(needle))
    end = len(flat) if end < 0 else end + 1
    if end - start > limit:  # centre a window on the answer, then cut back to whole words
        lo = max(start, at - (limit - len(needle)) // 2)
        hi = min(end, lo + limit)
        lo = max(start, hi - limit)
        if lo > start:
            lo = flat.find(" ", lo, at) + 1 or lo
        if hi < end:
            cut = flat.rfind(" ", at + len(needle), hi)
            hi = cut if cut > 0 else hi
        start, end = lo, hi
    return flat[start:end].strip()


def _pick(rng: random.Random, options: Sequence[str]) -> str:
    return options[rng.randrange(len(options))]


class EvidenceChainTeacher:
    """Writes one trajectory per (question, seed); searches with the project's own `local_search`."""

    name = TEACHER_NAME

    def __init__(self, search: SearchTool, tool_name: str = TOOL) -> None:
        """`search` is the project's tool (`agent.tools.local_search.LocalSearch` over the demo or user index)."""
        self.search = search
        self.tool_name = tool_name

    async def _search(self, query: str, ids: CallIdFactory, hop: Hop, n: int) -> _Search:
        results = tuple(await self.search(query, {}, ids()))
        return _Search(query, results, next((s for s in results if is_gold(s, hop)), None), n)

    async def write(self, q: SFTQuestion, fmt: str, max_tool_calls: int | None, seed: int) -> Trajectory:
        """The trajectory for one question (`max_tool_calls` None: a budget drawn with the seed, at least what the
        searches needed).

        Raises:
            EvidenceMissing: a hop's gold passage could not be retrieved, or the searches exceed the budget (the
                trajectory is rejected, never written).
            ValueError: the question has no evidence chain.
        """
        if not q.hops:
            raise ValueError(f"question {q.id!r} has no gold evidence; the evidence-chain teacher needs hops")
        rng = random.Random(f"{q.id}/{seed}")
        ids = CallIdFactory(seed=rng.getrandbits(32))
        searches: list[_Search] = []
        for n, hop in enumerate(q.hops):
            s = None
            if n == 0:  # the question first; a miss there is followed by the hop's own search and reformulation
                s = await self._search(question_query(q.question), ids, hop, n)
                searches.append(s)
            if s is None or s.gold is None:
                s = await self._search(hop.query, ids, hop, n)
                searches.append(s)
            if s.gold is None:
                retry = await self._search(_reformulate(hop, q.question, hop.query), ids, hop, n)
                searches.append(retry)
                if retry.gold is None:
                    raise EvidenceMissing(f"hop {n + 1} ({hop.title!r}): the gold passage was not retrieved by "
                                          f"{hop.query!r} nor by {retry.query!r}")
        if max_tool_calls is None:
            # Vary the budget the system prompt states: sometimes exactly what is needed, sometimes more.
            max_tool_calls = max(len(searches), rng.choice((len(searches), len(searches) + 1, 5, 10)))
        if len(searches) > max_tool_calls:
            raise EvidenceMissing(f"{len(searches)} searches needed, the budget is {max_tool_calls}")
        return _Writer(q, fmt, max_tool_calls, searches, rng, self.tool_name).trajectory()


# -- wording -----------------------------------------------------------------------------------------------------------

_THINK_OPEN = (
    "The question asks: {q}",
    "I need to answer: {q}",
    "Task: {q}",
    "Let me work out what is being asked. {q}",
)
_THINK_HOPS = {
    1: ("One fact answers it, so one targeted search should be enough.",
        "This is a single-fact question; a short plan and one search."),
    2: ("It chains two facts: the first search finds an intermediate fact, the second uses it.",
        "Two pieces of evidence are needed, and the second depends on the first.",
        "This is a two-hop question, so I should search step by step rather than guess."),
    3: ("It chains several facts, each search building on the one before.",
        "Several hops: I must not skip one, and each answer feeds the next search.",
        "A multi-hop question; I will resolve one link at a time."),
}
_THINK_COMPARE = (
    "It compares two entities, so I need the same fact about each of them.",
    "A comparison: one search per entity, then compare.",
)
_COMPLEXITY = (
    "Complexity: {level} retrieval, light reasoning.",
    "Complexity: {level}; the reasoning is a chain of lookups.",
    "How hard: {level} retrieval over Wikipedia passages.",
)
_EXPLICIT = ("Explicit needs: {needs}.", "What is asked: {needs}.", "Explicit needs: {needs}.")
_IMPLICIT = (
    "Implicit needs and gaps: the intermediate facts are unknown until searched; names may be ambiguous.",
    "Implicit needs and gaps: each hop depends on the previous one, so a wrong intermediate fact spoils the answer.",
    "Gaps: nothing is known yet; similarly named entities could mislead the search.",
)
_COMPARE_GAPS = (
    "Implicit needs and gaps: both entities must be checked on the same attribute before comparing them.",
    "Gaps: the comparison needs the same fact for each entity; one passage each.",
)
_NEGATIVE = (
    "Does not state anything no retrieved snippet supports.",
    "Does not guess from memory.",
    "Does not confuse the entity with similarly named ones.",
    "Does not leave the final answer implicit.",
)
_AFTER_HIT = (
    "Snippet {sid} ({title}) answers step {k}: {fact}",
    "Step {k} is covered by {sid} ({title}): {fact}",
    "{sid} from {title} gives what step {k} needed: {fact}",
)
_AFTER_MISS = (
    "The results do not mention what step {k} needs; the query was too vague. I will reformulate with the entity's "
    "name.",
    "None of these snippets covers step {k}. Reformulating the query.",
    "Step {k} is still open: these passages are about other things. I will search again with different words.",
)
_NEXT = (
    "Checklist item {k} remains open, so the plan holds: next, {need}.",
    "Next step of the plan: {need}.",
    "The plan still holds; now {need}.",
)
# The same, naming the entity the next search is about: the held-out sessions of the /2 student lost the entity
# between steps (a second query about "Professor Brown" after a first one that found the wrong president).
_NEXT_NAMED = (
    "Checklist item {k} remains open. Step {j} points to {bridge}, so next I search for {bridge}.",
    "Next step of the plan: {bridge} (found in step {j}), and {need}.",
    "The plan still holds; step {j} led to {bridge}, so now {bridge}: {need}.",
)
_DONE = (
    "Every checklist item is covered by a retrieved snippet; the evidence is sufficient.",
    "All rubric items are satisfied by the snippets found, so I can review and answer.",
    "The evidence now covers the whole checklist. Time to review.",
)
CITE_CHARS = 120  # longest quote inside a <cite>
_LEAD = ("The answer is", "In short, the answer is", "The evidence points to", "Answer:")
_FOUND_ANSWER = (
    "Snippet {sid} ({title}) answers step {k}: \"{quote}\" So the answer is {answer}.",
    "{sid} from {title} says \"{quote}\", which gives the answer: {answer}.",
    "Step {k} is covered by {sid} ({title}): \"{quote}\" The answer is therefore {answer}.",
)
_REVIEW_ANSWER = (
    "item {n} ← {sid}: \"{quote}\" gives the final answer, {answer}",
    "item {n} (final answer) ← {sid}, which reads \"{quote}\": {answer}",
)


class _Writer:
    """Composes the segments of one trajectory from the searches made."""

    def __init__(self, q: SFTQuestion, fmt: str, budget: int, searches: list[_Search], rng: random.Random,
                 tool: str) -> None:
        self.q, self.fmt, self.budget, self.searches, self.rng, self.tool = q, fmt, budget, searches, rng, tool
        self.gold = [s.gold for s in searches if s.gold is not None]  # one per hop, in hop order
        # The gold snippet whose text contains the answer (the last hop's first) and the verbatim window quoted.
        self.answer_at: Snippet | None = None
        self.answer_quote = ""
        for g in reversed(self.gold):
            quote = answer_window(g.text, q.answer, CITE_CHARS)
            if quote:
                self.answer_at, self.answer_quote = g, quote
                break

    def pick(self, options: Sequence[str], **kw: object) -> str:
        return _pick(self.rng, options).format(**kw)

    def trajectory(self) -> Trajectory:
        traj = Trajectory(self.q.id, TEACHER_NAME, self.fmt, self.budget)
        first = self.searches[0]
        traj.segments.append(Segment("model", self.plan() + self.call(first.query)))
        for n, s in enumerate(self.searches):
            traj.segments.append(Segment("tool", render_output(s.results, None)))
            traj.tool_calls.append({"tool": self.tool, "query": s.query, "snippet_ids": [r.id for r in s.results],
                                    "error": None})
            nxt = self.searches[n + 1] if n + 1 < len(self.searches) else None
            traj.segments.append(Segment("model", self.after(s, nxt)))
        return traj

    def call(self, query: str) -> str:
        return f'\n<call_tool name="{self.tool}">{query}</call_tool>'

    # -- stage 1 ---------------------------------------------------------------------------------------------------

    def plan(self) -> str:
        q, hops = self.q, self.q.hops
        n = min(len(hops), 3)
        hops_note = _THINK_COMPARE if q.kind == "comparison" else _THINK_HOPS[n]
        think = f"{self.pick(_THINK_OPEN, q=q.question)} {self.pick(hops_note)}"
        needs = "; ".join(f"({k}) {h.need}" for k, h in enumerate(hops, 1))
        level = ("single-hop" if n == 1 else "two-hop" if n == 2 else f"{len(hops)}-hop")
        gaps = _COMPARE_GAPS if q.kind == "comparison" else _IMPLICIT
        analysis = " ".join((self.pick(_COMPLEXITY, level=level), self.pick(_EXPLICIT, needs=needs),
                             self.pick(gaps)))
        checklist = "\n".join(f"- {k}. Identifies {h.need}." for k, h in enumerate(hops, 1))
        checklist += f"\n- {len(hops) + 1}. States the final answer to the question, with a citation."
        negatives = self.rng.sample(_NEGATIVE, 2)
        rubric = ("Knowledge Checklist:\n" + checklist + "\nNegative Constraints:\n"
                  + "\n".join(f"- {x}" for x in negatives))
        steps = [self.pick(("Step 1: search with the question as asked, which may already find {need}.",
                            "Step 1: search the question itself first; it should bring up {need}.",
                            "Step 1: the question as it stands, to find {need}."), need=hops[0].need)]
        steps += [f"Step {k}: search for {h.need}." for k, h in enumerate(hops[1:], 2)]
        steps.append(self.pick(("If a search misses, reformulate it with the entity's name.",
                                "If a result is off-topic, search again with other words before moving on.",
                                "Fallback: reformulate any search that finds nothing relevant.")))
        return (f"<think>{think}</think>\n<structured_plan>\n<deep_analysis>{analysis}</deep_analysis>\n"
                f"<rubric>{rubric}</rubric>\n<research_plan>{' '.join(steps)}</research_plan>\n</structured_plan>")

    # -- stage 2-4 -------------------------------------------------------------------------------------------------

    def after(self, s: _Search, nxt: _Search | None) -> str:
        k = s.hop + 1
        if s.gold is None:
            think = self.pick(_AFTER_MISS, k=k)
            evaluation = self.pick(("Checklist item {k} is not covered yet.", "Item {k} still open."), k=k)
        else:
            if nxt is None and s.gold is self.answer_at:  # the last result holds the answer: quote it, name it
                think = self.pick(_FOUND_ANSWER, sid=s.gold.id, title=s.gold.title, k=k, quote=self.answer_quote,
                                  answer=self.q.answer)
            else:
                fact = clip(self.q.hops[s.hop].statement, 160)
                think = self.pick(_AFTER_HIT, sid=s.gold.id, title=s.gold.title, k=k, fact=fact)
            covered = ", ".join(str(i) for i in range(1, k + 1))
            evaluation = f"Checklist items {covered} covered." if k > 1 else "Checklist item 1 covered."
        head = f"<think>{think}</think>\n"
        if nxt is not None:
            if nxt.hop != s.hop:
                bridge = self.bridge(s.gold, s.hop, nxt) if s.gold is not None else ""
                need = self.q.hops[nxt.hop].need
                evaluation += " " + (self.pick(_NEXT_NAMED, k=nxt.hop + 1, j=k, bridge=bridge, need=need) if bridge
                                     else self.pick(_NEXT, k=nxt.hop + 1, need=need))
            return f"{head}<state_evaluation>{evaluation}</state_evaluation>{self.call(nxt.query)}"
        evaluation += " " + self.pick(_DONE)
        return (f"{head}<state_evaluation>{evaluation}</state_evaluation>\n{self.review()}\n{self.answer()}")

    def bridge(self, found: Snippet, hop: int, nxt: _Search) -> str:
        """The entity the next search is about: the hop's own answer (MuSiQue), else the next gold passage's title
        (HotpotQA). "" (then the plain wording) unless the passage just found mentions it and the next query names
        it: the student must learn to carry forward what it read, never a name from nowhere."""
        own = self.q.hops[hop].answer
        name = own if own else main_title(self.q.hops[nxt.hop].title)
        ok = name and _norm(name) in _norm(found.text) and _norm(name) in _norm(nxt.query)
        return name if ok else ""

    def review(self) -> str:
        items = [f"item {k} ← {g.id} ({g.title})" for k, g in enumerate(self.gold, 1)]
        n = len(self.gold) + 1
        if self.answer_at is not None:
            items.append(self.pick(_REVIEW_ANSWER, n=n, sid=self.answer_at.id, quote=self.answer_quote,
                                   answer=self.q.answer))
        else:
            items.append(f"item {n} (final answer: {self.q.answer}) ← {self.gold[-1].id}")
        verification = "Knowledge verification: " + "; ".join(items) + "."
        directives = self.pick((
            "Directives: state only what these snippets support and cite each claim.",
            "Constraints as directives: no unsupported claims; every sentence carries its snippet id.",
            "Directives: answer directly, cite the snippets, add nothing from memory.",
        ))
        shape = {"exact_answer": "the exact answer in \\boxed{} first, then the cited evidence",
                 "short_form": "one short paragraph: the answer first, then the cited evidence",
                 "long_form": "a short report: the answer, then a section on the evidence chain"}[self.fmt]
        cmap = ", ".join(f"{g.id} for step {k}" for k, g in enumerate(self.gold, 1))
        plan = f"Write {shape}. Citation map: {cmap}."
        return (f"<review>\n<rubric_review>{verification} {directives}</rubric_review>\n"
                f"<writing_plan>{plan}</writing_plan>\n</review>")

    def answer(self) -> str:
        # The answer comes first and each quote is short: a small student that copies long quotes drifts into
        # loops before it reaches the answer (the stage-2 adapter did, on held-out questions).
        # The passage that holds the answer is quoted where it says it (the window around the answer).
        cites = [f'<cite id="{g.id}">{self.answer_quote if g is self.answer_at else clip(h.statement, CITE_CHARS)}'
                 f'</cite>' for g, h in zip(self.gold, self.q.hops, strict=True)]
        answer = self.q.answer
        if self.fmt == "exact_answer":
            body = f"\\boxed{{{answer}}} " + " ".join(cites)
        elif self.fmt == "short_form":
            body = f"{self.pick(_LEAD)} {answer}. " + " ".join(cites)
        else:
            steps = "\n".join(f"- {c}" for c in cites)
            body = (f"## Answer\n\n**{answer}**\n\n## Evidence\n\n{steps}\n\n"
                    f"Together, these passages answer the question: {answer}.")
        return f"<answer>{body}</answer>"
