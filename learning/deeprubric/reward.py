"""The DeepRubric RL reward (METHOD §11.6): pure maths over a trajectory's measured features and criterion scores.

reward = 0.5·rubric + 0.15·format + 0.1·search + 0.2·citation + 0.05·length, and 0.15·format only without an answer.

| term     | definition here |
|----------|-----------------|
| rubric   | Σ w·(s/4) / Σ|w| over the pair's criteria, each scored 0–4 by the judge (factual ones shown with evidence) |
| format   | 0.5·[has <answer>] + 0.2·[has <cite id=…>] + 0.1·[≥1 tool query] + 0.2·[more than one clean <think>] |
| search   | min(#queries / 6, 1) |
| citation | the project's citation check (learning/judge/citations.py): valid cited ids / cited ids; 0 if none cited |
| length   | min(answer tokens / 3000, 1) |

Decisions where METHOD is silent (this project's):
- **A negative weight** counts against the answer exactly as the formula says: w·(s/4) with w < 0 subtracts, so the
  rubric term lies in [−1, 1] (−1: every criterion is negative and fully met). Σ|w| is the normaliser, as written.
- **Unscored criteria** (the judge failed on them) leave both sums; when no criterion could be scored, or the
  criteria weigh nothing (Σ|w| = 0), the rubric term is None and the trajectory is *unscorable* (the trainer drops
  it from its group, never scoring it as 0) — unless there is no answer, when the reward is 0.15·format anyway.
- **"Has <answer>"** means a non-empty `<answer>` block in the Answer stage; a forced `<answer>` tag with nothing
  after it is no answer. The rubric, citation and length terms are only computed when there is one.
- **Clean `<think>`**: a closed `<think>…</think>` block with non-empty text and no other scaffold tag inside;
  "more than one" means at least two, anywhere in the assistant's own text (tool outputs excluded).
- **Queries** are the trajectory's tool calls with a non-empty query (any tool), counted as the agent ran them.
- **Answer tokens** are the policy tokens of the Answer stage's own turns (sampled and forced, never tool output):
  the tokenizer that wrote the answer, no re-tokenizing.
- **Citation** is the share of cited ids that name a snippet this trajectory retrieved (DR Tulu's R_fmt, the
  project's existing check), not DR Tulu's per-claim recall/precision scorer: that scorer needs a judge call per
  claim, and the share is what the project already computes for every judgement. With nothing cited it is 0.
- **Offline criterion scores** (no judge endpoint) come from the offline judge's MiniLM similarity, mapped onto 0–4
  with the offline judge's own thresholds (`score_from_similarity`); results are labelled approximate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agent.parse import extract_answer, find_citations, strip_think
from learning.judge.citations import check_citations
from learning.judge.offline import SIM_FULL, SIM_PARTIAL
from store.records import Trajectory

__all__ = [
    "WEIGHTS",
    "Breakdown",
    "Criterion",
    "Features",
    "RewardWeights",
    "combine",
    "features",
    "format_term",
    "length_term",
    "rubric_term",
    "score_from_similarity",
    "search_term",
]

SCORE_MAX = 4  # the judge rates each criterion 0..4
SEARCH_TARGET = 6  # search = min(#queries / 6, 1)
LENGTH_TARGET = 3000  # length = min(answer tokens / 3000, 1)
# Similarity bands onto 0..4: the offline judge's 0/1/2 thresholds (SIM_PARTIAL → half, SIM_FULL → full) with one
# band below each of them, so an offline 0/1/2 score s maps to 2s at the band edges.
SIM_BANDS = (SIM_PARTIAL - 0.10, SIM_PARTIAL, (SIM_PARTIAL + SIM_FULL) / 2, SIM_FULL)

_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.IGNORECASE | re.DOTALL)
_ANY_TAG = re.compile(r"</?[A-Za-z_][\w-]*\b[^<>]*>")


@dataclass(frozen=True, slots=True)
class RewardWeights:
    """The §11.6 weights (the `longform_rubric` manager's defaults)."""

    rubric: float = 0.5
    format: float = 0.15
    search: float = 0.1
    citation: float = 0.2
    length: float = 0.05


WEIGHTS = RewardWeights()


@dataclass(frozen=True, slots=True)
class Criterion:
    """One criterion as scored: its weight in [−1, 1] and its 0–4 score (None: the judge could not score it)."""

    weight: float
    score: float | None


@dataclass(frozen=True, slots=True)
class Features:
    """What the non-rubric terms read off a trajectory."""

    has_answer: bool
    has_cite: bool
    queries: int
    clean_thinks: int
    answer_tokens: int
    cited: int
    valid_cited: int


@dataclass(frozen=True, slots=True)
class Breakdown:
    """One trajectory's reward and its terms (None where a term is not computed: no answer, or unscorable)."""

    reward: float | None
    rubric: float | None
    format: float
    search: float
    citation: float | None
    length: float | None
    has_answer: bool

    def as_metrics(self, prefix: str = "") -> dict[str, float]:
        """The computed terms as a flat dict of floats (absent terms left out)."""
        out = {"reward": self.reward, "rubric": self.rubric, "format": self.format, "search": self.search,
               "citation": self.citation, "length": self.length}
        return {prefix + k: float(v) for k, v in out.items() if v is not None}


def rubric_term(criteria: Sequence[Criterion]) -> float | None:
    """Σ w·(s/4) / Σ|w| over the scored criteria; None when nothing was scored or the weights sum to 0 in size."""
    scored = [c for c in criteria if c.score is not None]
    total = sum(abs(c.weight) for c in scored)
    if not scored or total == 0:
        return None
    for c in scored:
        if not 0 <= c.score <= SCORE_MAX or not math.isfinite(c.weight):  # type: ignore[operator]
            raise ValueError(f"a criterion score must be in 0..{SCORE_MAX} with a finite weight, got {c}")
    return sum(c.weight * (c.score / SCORE_MAX) for c in scored) / total  # type: ignore[operator]


def format_term(f: Features) -> float:
    """0.5·[answer] + 0.2·[cite] + 0.1·[≥1 query] + 0.2·[>1 clean think]."""
    return 0.5 * f.has_answer + 0.2 * f.has_cite + 0.1 * (f.queries >= 1) + 0.2 * (f.clean_thinks > 1)


def search_term(queries: int) -> float:
    """min(#queries / 6, 1)."""
    return min(max(queries, 0) / SEARCH_TARGET, 1.0)


def length_term(answer_tokens: int) -> float:
    """min(answer tokens / 3000, 1)."""
    return min(max(answer_tokens, 0) / LENGTH_TARGET, 1.0)


def citation_term(f: Features) -> float:
    """Valid cited ids / cited ids; 0 when nothing is cited."""
    return f.valid_cited / f.cited if f.cited else 0.0


def combine(f: Features, rubric: float | None, w: RewardWeights = WEIGHTS) -> Breakdown:
    """The §11.6 reward from a trajectory's features and its rubric term (see the module docstring)."""
    fmt, search = format_term(f), search_term(f.queries)
    if not f.has_answer:
        return Breakdown(w.format * fmt, None, fmt, search, None, None, False)
    citation, length = citation_term(f), length_term(f.answer_tokens)
    if rubric is None:
        return Breakdown(None, None, fmt, search, citation, length, True)
    total = w.rubric * rubric + w.format * fmt + w.search * search + w.citation * citation + w.length * length
    return Breakdown(total, rubric, fmt, search, citation, length, True)


def score_from_similarity(similarity: float) -> int:
    """A best-sentence cosine similarity as a 0–4 criterion score (the offline approximation)."""
    return sum(1 for edge in SIM_BANDS if similarity >= edge)


def _answer_stage_text(t: Trajectory) -> str:
    return "".join(x.text for x in t.turns if x.stage == "answer" and x.kind != "tool_output")


def answer_body(t: Trajectory) -> str:
    """The `<answer>` block's text (think blocks removed); "" when there is no `<answer>` tag or it is empty."""
    text = _answer_stage_text(t)
    if "<answer" not in text.lower():
        return ""
    return strip_think(extract_answer(text)).strip()


def features(t: Trajectory) -> Features:
    """The measured features of one trajectory (see the module docstring for each definition)."""
    body = answer_body(t)
    own = "".join(x.text for x in t.turns if x.kind != "tool_output")
    thinks = sum(1 for m in _THINK_BLOCK.finditer(own) if m.group(1).strip() and not _ANY_TAG.search(m.group(1)))
    check = check_citations(t)
    tokens = sum(len(x.token_ids) for x in t.turns if x.stage == "answer" and x.kind != "tool_output")
    return Features(
        has_answer=bool(body), has_cite=bool(find_citations(body)) if body else False,
        queries=sum(1 for c in t.tool_calls if c.query.strip()), clean_thinks=thinks,
        answer_tokens=tokens if body else 0, cited=check.cited, valid_cited=check.valid,
    )  # fmt: skip
