"""Experience items (issue 62, memory (b)): what worked in one session, kept as a rubric-bank item for similar
questions, with no model call.

The reflection meta-policy (`writer.py`) asks the policy to diagnose an attempt in two free-text blocks; at 135M
parameters those blocks are mostly generic. An experience item is the concrete alternative that ExpeL and
ReasoningBank report gains from: the search query that found a useful passage, the passages cited and the short
answer given. It is written into the same two blocks, so retrieval, injection, deletion and the held-out guard treat
it exactly as a reflection.

Decisions (the papers are silent; issue 62 names the content):
- Which passages were useful is the caller's: the gold supporting titles for the study's best-case memory (training
  questions carry gold), the cited titles of a session the judge or the user rated well in production. A session
  none of whose searches returned a useful passage gives no item (None): there is no working query to pass on.
- The query kept is the first call, in order, whose results held a useful passage; the titles listed are the useful
  passages that session retrieved (at most `MAX_TITLES`), then what it cited.
- Everything in the item came from the model or a tool, so it is untrusted: tags are removed (a `</answer>` in a
  stored query must not close a block of the prompt it is injected into), backticks and line breaks flattened, each
  piece cut to `MAX_PIECE_CHARS`.
- The item's score is the caller's figure in [0, 1] (the study: the answer's token F1).
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.parse import strip_tags
from store.records import BankItem, Trajectory

MAX_TITLES = 4
MAX_PIECE_CHARS = 160
EXPERIENCE_JUDGE = "experience"  # the `judge_model` of an experience item: no judge wrote it


def clean(text: str, limit: int = MAX_PIECE_CHARS) -> str:
    """Untrusted text made safe to quote on one line of a prompt: scaffold tags and backticks out, whitespace collapsed,
    cut to `limit` characters."""
    text = " ".join(strip_tags(text).replace("`", "'").split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _fold(title: str) -> str:
    return title.strip().casefold()


def working_query(trajectory: Trajectory, useful_titles: Sequence[str]) -> tuple[str, list[str]] | None:
    """The first search whose results held a useful passage, and the useful titles the session retrieved (in the
    order found); None when no search found one."""
    useful = {_fold(t) for t in useful_titles if t.strip()}
    found: list[str] = []
    query: str | None = None
    for call in trajectory.tool_calls:
        hits = [s.title for s in call.snippets if _fold(s.title) in useful]
        if hits and query is None and call.query.strip():
            query = call.query
        found += [t for t in hits if _fold(t) not in {_fold(f) for f in found}]
    return (query, found) if query is not None else None


def experience_item(
    *,
    question: str,
    trajectory: Trajectory,
    useful_titles: Sequence[str],
    cited_titles: Sequence[str],
    short_answer: str | None,
    score: float,
    session_id: str,
    policy_version: str,
) -> BankItem | None:
    """The experience item of one session, or None when none of its searches found a useful passage.

    Raises:
        ValueError: `score` is not in [0, 1].
    """
    if isinstance(score, bool) or not 0.0 <= float(score) <= 1.0:
        raise ValueError(f"score must be in [0, 1], got {score!r}")
    found = working_query(trajectory, useful_titles)
    if found is None:
        return None
    query, titles = found
    titles = [clean(t) for t in titles[:MAX_TITLES]]
    cited = [clean(t) for t in dict.fromkeys(cited_titles)][:MAX_TITLES]
    answer = clean(short_answer) if short_answer else ""
    rubrics = [f"- Search the passages with a query like `{clean(query)}`.",
               f"- The passages that held the answer: {'; '.join(titles)}."]
    takeaways = [f"- The search `{clean(query)}` returned {titles[0]}, a passage that held the answer."]
    if cited:
        takeaways.append(f"- Cited: {'; '.join(cited)}.")
    if answer:
        takeaways.append(f"- Short answer given: \\boxed{{{answer}}}.")
    return BankItem.new(question=question, rubrics="\n".join(rubrics), takeaways="\n".join(takeaways),
                        score=float(score), judge_model=EXPERIENCE_JUDGE, policy_version=policy_version,
                        session_id=session_id)
