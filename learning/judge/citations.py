"""Citation check: do the answer's `<cite id=...>` ids exist among the session's retrieved snippets (DR Tulu R_fmt)?

`check_citations` is pure. `support_check` optionally asks the judge, per cited claim, whether the cited snippets
support it (one small JSON call per claim, bounded; failures are counted, never scored as "unsupported").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from agent.parse import Citation, extract_answer, find_citations, strip_think
from agent.support import COSINE_WEIGHT, SUPPORT_MIN, support_parts
from learning.errors import JudgeError
from learning.judge.types import CitationCheck, JsonJudge, Usage
from learning.prompts import messages
from store.records import Trajectory

MAX_SUPPORT_CLAIMS = 16  # claims checked per trajectory at most (cost bound); the rest stay unchecked
EVIDENCE_CHARS = 1500  # each cited snippet's text is cut to this in the support prompt
CLAIM_CHARS = 1000


def answer_text(trajectory: Trajectory) -> str:
    """The final answer as written: the body of the last `<answer>` block of the Answer-stage turns.

    Without an `<answer>` tag the Answer-stage text itself is used; `<think>` blocks are dropped.
    """
    text = "".join(t.text for t in trajectory.turns if t.stage == "answer" and t.kind != "tool_output")
    body = extract_answer(text) if "<answer" in text.lower() else text
    return strip_think(body).strip()


def cited_ids(trajectory: Trajectory) -> list[str]:
    """Every cited id in the answer, in order, one entry per occurrence."""
    return [i for c in find_citations(answer_text(trajectory)) for i in c.ids]


def check_citations(trajectory: Trajectory) -> CitationCheck:
    """Count cited ids and those that name a snippet this session retrieved; precision = valid / cited.

    Every occurrence counts (citing the same valid id twice counts twice); precision is None when nothing is cited.
    """
    ids = cited_ids(trajectory)
    known = trajectory.snippets
    valid = sum(1 for i in ids if i in known)
    return CitationCheck(cited=len(ids), valid=valid, precision=(valid / len(ids)) if ids else None)


class SupportVerdict(BaseModel):
    """The judge's verdict on one claim."""

    model_config = ConfigDict(extra="forbid")

    supported: bool
    reason: str


@dataclass(frozen=True, slots=True)
class ClaimVerdict:
    """One checked claim: the ids it cites (valid ones), and the verdict or the error that prevented one."""

    claim: str
    ids: tuple[str, ...]
    supported: bool | None
    reason: str = ""
    error: str | None = None


@dataclass(frozen=True, slots=True)
class SupportResult:
    """The citation check with the support counts filled in, the verdicts, their cost, and how many calls failed."""

    check: CitationCheck
    verdicts: tuple[ClaimVerdict, ...]
    usage: Usage
    failed: int


def checkable_claims(trajectory: Trajectory, limit: int = MAX_SUPPORT_CLAIMS) -> list[Citation]:
    """Cited claims with a non-empty text and at least one valid id (invalid ids only), the first `limit` of them."""
    known = trajectory.snippets
    out: list[Citation] = []
    for c in find_citations(answer_text(trajectory)):
        ids = tuple(i for i in c.ids if i in known)
        if c.claim and ids:
            out.append(Citation(ids=ids, claim=c.claim))
        if len(out) >= limit:
            break
    return out


def automatic_facts(claims: Sequence[Citation], trajectory: Trajectory) -> list[str]:
    """Per claim, what the reports' support check (agent/support.py) found for its cited passages, as one line for
    the judge: the same facts the offline judge and the report use. Without the embedding model, says so."""
    from store.embeddings import embed_texts

    snippets = trajectory.snippets
    passages = list(dict.fromkeys(i for c in claims for i in c.ids))
    try:  # one embedding call for every claim and passage
        cos, lex = support_parts([c.claim for c in claims], [snippets[i] for i in passages], embed_texts)
    except Exception as exc:  # noqa: BLE001 - the judge decides without it
        return [f"not available ({type(exc).__name__})"] * len(claims)
    support = COSINE_WEIGHT * cos + (1.0 - COSINE_WEIGHT) * lex
    col = {i: k for k, i in enumerate(passages)}
    out = []
    for row, c in enumerate(claims):
        words = [f"{i}: support {support[row, col[i]]:.2f} (word overlap {lex[row, col[i]]:.2f})" for i in c.ids]
        out.append(f"{'; '.join(words)}. The report's check counts a passage as supporting at {SUPPORT_MIN} or above "
                   "(half MiniLM similarity, half the share of the claim's content words the passage contains).")
    return out


async def support_check(client: JsonJudge, trajectory: Trajectory, *, limit: int = MAX_SUPPORT_CLAIMS) -> SupportResult:
    """Ask the judge, for each cited claim, whether its cited snippets support it (concurrently, bounded).

    A failed call (unavailable endpoint, invalid output) leaves that claim unchecked and is counted in `failed`;
    `support_checked` counts only the claims that got a verdict.
    """
    base = check_citations(trajectory)
    claims = checkable_claims(trajectory, limit)
    snippets = trajectory.snippets
    schema = SupportVerdict.model_json_schema()
    facts = await asyncio.to_thread(automatic_facts, claims, trajectory)

    async def one(c: Citation, fact: str) -> tuple[ClaimVerdict, Usage]:
        evidence = "\n\n".join(
            f'<snippet id="{i}">\n{snippets[i].title}\n{snippets[i].text[:EVIDENCE_CHARS]}\n</snippet>' for i in c.ids
        )
        try:
            call = await client.complete_json(
                messages("citation_support", claim=c.claim[:CLAIM_CHARS], evidence=evidence, automatic=fact),
                schema,
                name="citation_support",
                validate=SupportVerdict.model_validate,
                max_tokens=256,
            )
        except JudgeError as exc:
            return ClaimVerdict(c.claim, c.ids, None, error=f"{type(exc).__name__}: {exc}"), exc.usage or Usage()
        verdict: SupportVerdict = call.data
        return ClaimVerdict(c.claim, c.ids, verdict.supported, verdict.reason), call.usage

    results: Sequence[tuple[ClaimVerdict, Usage]] = await asyncio.gather(*(one(c, f) for c, f in zip(claims, facts,
                                                                                                   strict=True)))
    verdicts = tuple(v for v, _ in results)
    usage = sum((u for _, u in results), Usage())
    checked = [v for v in verdicts if v.supported is not None]
    check = base.model_copy(
        update={"support_checked": len(checked), "supported": sum(1 for v in checked if v.supported)}
    )
    return SupportResult(check=check, verdicts=verdicts, usage=usage, failed=len(verdicts) - len(checked))
