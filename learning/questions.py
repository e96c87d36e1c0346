"""Question pools for training: a user file, or questions built from the bundled Wikipedia demo corpus.

The bundled pool asks about passage titles of the demo corpus (so `local_search` can answer every question from the
shipped index) with a few fixed question shapes. The shapes are ours; the titles are the corpus's (attribution in
agent/demo_corpus/ATTRIBUTION.md).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from agent.ingest import load_demo_corpus
from learning.errors import LearningError

SHAPES = (
    "Who or what is {title}, and what is it best known for?",
    "Summarise the key facts about {title}, citing the sources.",
    "When and where is {title} documented, and what do the sources say about it?",
)
MAX_QUESTION_CHARS = 4000


class QuestionPoolError(LearningError):
    """The question file is missing, empty or malformed."""


def bundled_questions(n: int, seed: int = 0) -> list[str]:
    """`n` distinct questions about titles of the bundled corpus (deterministic for a seed)."""
    titles = sorted({d.title for d in load_demo_corpus() if d.title and 3 <= len(d.title) <= 60})
    rng = random.Random(seed)
    picked = rng.sample(titles, min(n, len(titles)))
    return [SHAPES[i % len(SHAPES)].format(title=t) for i, t in enumerate(picked)]


def load_questions(path: Path, minimum: int = 2) -> list[str]:
    """Questions from a .txt file (one per line) or .jsonl (a "question" field per line), de-duplicated in order.

    Raises:
        QuestionPoolError: unreadable, empty, or a bad line (named by number).
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise QuestionPoolError(f"cannot read the question file {path}: {exc}") from exc
    out: list[str] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                q = json.loads(line)["question"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise QuestionPoolError(f"{path}:{n}: expected a JSON object with a 'question' field") from exc
        else:
            q = line
        if not isinstance(q, str) or not q.strip() or len(q) > MAX_QUESTION_CHARS:
            raise QuestionPoolError(f"{path}:{n}: a question must be non-empty text of at most {MAX_QUESTION_CHARS} "
                                    "characters")
        if q.strip() not in out:
            out.append(q.strip())
    if len(out) < minimum:
        raise QuestionPoolError(f"{path}: needs at least {minimum} distinct question(s), found {len(out)}")
    return out
