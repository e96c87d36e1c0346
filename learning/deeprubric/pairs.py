"""Query–rubric pairs as training questions and evaluation items: reading a `pairs.jsonl` strictly, and turning a
pair's criteria into the stagewise judge's persistent Answer-stage rubrics (issue 15 item 6).

Only the fields the trainer and the benchmark need are required of a line: `question` and `rubrics` (each with
`description`, `type` logical|factual and `weight` in [−1, 1]); `id`, `evidence` and `source_leaf_ids` are read when
present. The rest of a build's record (trees, traces) is kept by `deeprubric build` and ignored here, so hand-written
pairs files work too.

Mapping onto the judge's rubrics (METHOD D3 scale; a decision of this project, open point 8):
- polarity: a negative weight is a *negative* rubric ("the answer should not …", scored 2 when it is avoided), a
  positive weight a positive one; weight 0 carries no signal and is left out;
- weight: |w| ∈ (0, 1] onto the judge's 1–3 scale by thirds, ceil(3·|w|): (0, ⅓] → 1 minor, (⅓, ⅔] → 2
  important, (⅔, 1] → 3 critical;
- id: stable from the pair's id and the criterion's id (`rubric_id`), so rerunning training keeps one copy per
  criterion in the rubric buffer; title: the criterion's description (shortened), description: the whole criterion
  with its evidence quoted for factual ones.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learning.errors import LearningError
from learning.judge.buffer import rubric_id
from learning.judge.types import Rubric

__all__ = ["PairCriterion", "PairsFileError", "QueryPair", "is_pairs_file", "judge_weight", "load_pairs",
           "persistent_rubrics", "persistent_by_question"]

MAX_QUESTION_CHARS = 4000
TITLE_CHARS = 120


class PairsFileError(LearningError, ValueError):
    """A pairs file is unreadable or one of its lines is not a usable pair (the message names the line)."""


@dataclass(frozen=True, slots=True)
class PairCriterion:
    """One criterion of a pair."""

    id: str
    type: str  # "logical" | "factual"
    description: str
    weight: float  # in [-1, 1]
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QueryPair:
    """A question and the criteria its answer is checked against."""

    id: str
    question: str
    criteria: tuple[PairCriterion, ...]
    answer: str = ""  # the build's short reference answer, when present
    line: int = 0


def _criterion(raw: Any, where: str, k: int) -> PairCriterion:
    if not isinstance(raw, Mapping):
        raise PairsFileError(f"{where}: rubric {k} must be a JSON object")
    desc, kind, weight = raw.get("description"), raw.get("type"), raw.get("weight")
    if not isinstance(desc, str) or not desc.strip():
        raise PairsFileError(f"{where}: rubric {k} needs a non-empty 'description'")
    if kind not in ("logical", "factual"):
        raise PairsFileError(f"{where}: rubric {k} 'type' must be 'logical' or 'factual', got {kind!r}")
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) \
            or not -1 <= weight <= 1:
        raise PairsFileError(f"{where}: rubric {k} 'weight' must be a number in [-1, 1], got {weight!r}")
    evidence = raw.get("evidence") or ()
    if not isinstance(evidence, list | tuple) or not all(isinstance(e, str) for e in evidence):
        raise PairsFileError(f"{where}: rubric {k} 'evidence' must be a list of strings")
    rid = raw.get("id")
    return PairCriterion(str(rid) if rid else f"R{k}", kind, " ".join(desc.split()), float(weight),
                         tuple(e.strip() for e in evidence if e.strip()))


def parse_pair(raw: Any, where: str, line: int = 0) -> QueryPair:
    """One pairs-file record as a QueryPair (PairsFileError naming `where` on a wrong shape)."""
    if not isinstance(raw, Mapping):
        raise PairsFileError(f"{where}: expected a JSON object with 'question' and 'rubrics'")
    q = raw.get("question")
    if not isinstance(q, str) or not q.strip() or len(q) > MAX_QUESTION_CHARS:
        raise PairsFileError(f"{where}: 'question' must be non-empty text of at most {MAX_QUESTION_CHARS} characters")
    rubrics = raw.get("rubrics")
    if not isinstance(rubrics, list) or not rubrics:
        raise PairsFileError(f"{where}: 'rubrics' must be a non-empty list")
    criteria = tuple(_criterion(r, where, k) for k, r in enumerate(rubrics, start=1))
    if len({c.id for c in criteria}) != len(criteria):
        raise PairsFileError(f"{where}: rubric ids must be unique within a pair")
    if not any(c.weight > 0 for c in criteria):
        raise PairsFileError(f"{where}: at least one rubric needs a positive weight")
    pid = raw.get("id")
    answer = raw.get("answer") if isinstance(raw.get("answer"), str) else ""
    return QueryPair(str(pid) if pid else f"line-{line}", " ".join(q.split()), criteria, answer, line)


def load_pairs(path: Path, minimum: int = 1) -> list[QueryPair]:
    """Every pair of a `pairs.jsonl` file, in order; a question asked twice keeps its first pair.

    Raises:
        PairsFileError: unreadable file, a line that is not a pair (named `PATH:LINE`), duplicate ids, or fewer than
            `minimum` distinct questions.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PairsFileError(f"cannot read the pairs file {path}: {exc}") from exc
    pairs: list[QueryPair] = []
    seen_q: set[str] = set()
    seen_id: set[str] = set()
    for n, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        where = f"{path}:{n}"
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PairsFileError(f"{where}: not valid JSON ({exc.msg})") from exc
        pair = parse_pair(raw, where, n)
        if pair.id in seen_id:
            raise PairsFileError(f"{where}: pair id {pair.id!r} appears twice")
        seen_id.add(pair.id)
        if pair.question in seen_q:
            continue
        seen_q.add(pair.question)
        pairs.append(pair)
    if len(pairs) < minimum:
        raise PairsFileError(f"{path}: needs at least {minimum} distinct question(s), found {len(pairs)}")
    return pairs


def is_pairs_file(path: Path) -> bool:
    """True when `path` is a .jsonl whose first non-empty line is a JSON object with a 'rubrics' field."""
    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8") as f:
            for text in f:
                if text.strip():
                    raw = json.loads(text)
                    return isinstance(raw, Mapping) and "rubrics" in raw
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


def judge_weight(weight: float) -> int:
    """|w| ∈ (0, 1] onto the judge's 1–3 scale by thirds: ceil(3·|w|), kept in [1, 3]."""
    return min(3, max(1, math.ceil(3 * abs(weight) - 1e-9)))


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:.-") + "…"


def persistent_rubrics(pair: QueryPair) -> tuple[Rubric, ...]:
    """The pair's criteria as persistent Answer-stage rubrics of the stagewise judge (module docstring)."""
    out: list[Rubric] = []
    for c in pair.criteria:
        if c.weight == 0:
            continue
        description = c.description
        if c.type == "factual" and c.evidence:
            description += " Evidence: " + " ".join(f'"{e}"' for e in c.evidence)
        out.append(Rubric(
            id=rubric_id("answer", f"deeprubric {pair.id} {c.id}", persistent=True), stage="answer",
            title=_shorten(c.description, TITLE_CHARS), description=description, weight=judge_weight(c.weight),
            polarity="negative" if c.weight < 0 else "positive", persistent=True,
        ))  # fmt: skip
    return tuple(out)


def persistent_by_question(pairs: Sequence[QueryPair]) -> dict[str, tuple[Rubric, ...]]:
    """question → its persistent rubrics, for the trainer."""
    return {p.question: persistent_rubrics(p) for p in pairs}
