"""The project's held-out questions, the guard that keeps them out of training, and the per-session figures a small
model can move (issue 38): gold-passage recall of the searches, citation precision and recall, cover-EM.

The held-out set is `learning/sft/data/heldout` (shipped, so nothing at run time needs ../shared/data):
- 16 HotpotQA and 16 MuSiQue questions paired with the bundled corpus, drawn before any training
  (`learning.sft.split`), with their gold supporting passages;
- 8 2WikiMultihopQA development questions whose answers the bundled corpus holds (no gold passages: they count for
  cover-EM and the judge only).
All are asked in the `exact_answer` format (`<answer>\\boxed{...}</answer>`, METHOD's format table).

Decisions (the papers are silent):
- A passage is gold when its title is one of the item's supporting titles (titles are unique in the bundled corpus
  for these items; the corpus is a set of Wikipedia paragraphs keyed by title).
- Citation precision is the share of the report's references that are gold; a report that cites nothing scores 0
  (it gives the reader no correct source), so dropping citations can never raise it. Citation recall is the share
  of the gold titles the report cites.
- Cover-EM is scored on the last `\\boxed{}` when there is one, else on the whole answer body (`boxed` says which),
  against the gold answer and its aliases; except that a yes/no gold is scored on the boxed answer only (issue 62:
  on the whole body, "No item was found…" counted as a correct "no").
- The short answer is the last `\\boxed{}` with citation markers and tags removed; `answer_f1` is its token F1
  against the gold answers (0 when there is none), `answer_words` the answer body's length in words.
- Questions are matched for the guard after Unicode NFKC, case folding and whitespace collapsing, so a copy with
  other spacing or capitals is still caught.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from agent.parse import strip_tags
from agent.report import Report
from agent.support import UNSUPPORTED_MARK
from learning.errors import LearningError
from learning.eval.datasets import EvalItem, bench_spec
from learning.eval.scoring import (
    extract_prediction,
    last_boxed,
    normalize_answer,
    short_form_scores,
    support_recall,
)
from store.heldout import HeldoutGuard
from store.heldout import normalize_question as normalize_question  # re-exported; its home is the bank's guard
from store.records import Trajectory

HELDOUT_DIR = Path(__file__).resolve().parents[1] / "sft" / "data" / "heldout"
SOURCES = ("hotpotqa", "musique", "2wikimultihopqa")
FIGURES = ("gold_recall", "citation_precision", "citation_recall", "cover_em", "boxed", "cited", "answer_f1",
           "answer_words")
YES_NO = frozenset({"yes", "no"})


class HeldOutQuestionError(LearningError):
    """A held-out question was about to be trained on."""


@dataclass(frozen=True, slots=True)
class HeldoutItem:
    """One held-out question with what it is scored against."""

    id: str  # "<source>:<the dataset's own id>"
    source: str
    question: str
    answers: tuple[str, ...]  # the gold answer first, then its aliases
    gold_titles: tuple[str, ...]  # the supporting passages' titles; empty where the dataset has none
    format: str = "exact_answer"


def _item(source: str, e: EvalItem) -> HeldoutItem:
    return HeldoutItem(f"{source}:{e.id}", source, e.question, tuple(e.answers),
                       tuple(e.metadata.get("supporting_titles") or ()), e.format)


def load_heldout(folder: Path = HELDOUT_DIR, sources: Sequence[str] = SOURCES) -> list[HeldoutItem]:
    """Every held-out item of `folder`, source by source in `sources` order, each in its file's order.

    Raises:
        learning.eval.datasets.EvalError: a file is missing or malformed (named in the message).
    """
    return [_item(s, e) for s in sources for e in bench_spec(s).loader(Path(folder))]


def heldout_index(items: Iterable[HeldoutItem]) -> dict[str, str]:
    """normalised question -> held-out id."""
    return {normalize_question(i.question): i.id for i in items}


def heldout_ids(questions: Iterable[str], index: Mapping[str, str]) -> list[str]:
    """The held-out ids among `questions` (in order, once each)."""
    found = (index.get(normalize_question(q)) for q in questions)
    return list(dict.fromkeys(i for i in found if i is not None))


@lru_cache(maxsize=1)
def heldout_guard() -> HeldoutGuard:
    """The rubric bank's guard over the shipped held-out questions (store.heldout; issue 62)."""
    return HeldoutGuard.of((i.id, i.question) for i in load_heldout())


def refuse_heldout(questions: Iterable[str], index: Mapping[str, str], where: str = "training") -> None:
    """Raise `HeldOutQuestionError` naming every held-out question among `questions`."""
    ids = heldout_ids(questions, index)
    if ids:
        raise HeldOutQuestionError(
            f"{len(ids)} held-out question(s) in {where}: {', '.join(ids)}; held-out questions are for evaluation "
            "only (learning/sft/data/heldout); remove them from the question pool")


def session_figures(item: HeldoutItem, trajectory: Trajectory, report: Report) -> dict[str, float | None]:
    """The held-out figures of one session (None where the item has no gold passages).

    gold_recall: the share of the gold passages that the session's searches returned (recall, not precision).
    citation_precision / citation_recall / cited: see the module docstring.
    cover_em, boxed: the answer against the gold answers; whether it wrote a `\\boxed{}`.
    """
    # The report's mark on a sentence whose cited id was invented is the report's own note, not the model's words: the
    # figures read the answer as the model wrote it (before issue 64 the invented id was removed and nothing added).
    body = re.sub(rf" ?{re.escape(UNSUPPORTED_MARK)}", "", report.body) if report.answer_found else ""
    short = short_answer(body)
    yes_no = any(normalize_answer(a) in YES_NO for a in item.answers)
    scored = (short or "") if yes_no else extract_prediction(body)  # a yes/no gold: the short answer only
    cover = short_form_scores(scored, item.answers)["cover_em"] if scored else 0.0
    cited = [s.title for s in report.references]
    out: dict[str, float | None] = {
        "cover_em": cover, "boxed": float(short is not None), "cited": float(bool(cited)),
        "answer_f1": short_form_scores(short, item.answers)["f1"] if short else 0.0,
        "answer_words": float(len(body.split())),
        "gold_recall": None, "citation_precision": None, "citation_recall": None,
    }  # fmt: skip
    if item.gold_titles:
        out["gold_recall"] = support_recall(item.gold_titles, [s.title for s in trajectory.snippets.values()])
        out["citation_precision"] = gold_share(item.gold_titles, cited)
        out["citation_recall"] = support_recall(item.gold_titles, cited) if cited else 0.0
    return out


def short_answer(body: str) -> str | None:
    """The short answer of an answer body: its last `\\boxed{}` with `[n]` markers and tags removed; None when
    there is none or nothing is left (a tag or a citation marker is never an answer)."""
    boxed = last_boxed(body)
    if boxed is None:
        return None
    text = " ".join(strip_tags(extract_prediction(boxed)).split())
    return text or None


def gold_share(gold_titles: Sequence[str], cited_titles: Sequence[str]) -> float:
    """The share of the cited titles that are gold (compared stripped and case-folded); 0 when nothing is cited,
    so dropping citations can never raise it. The held-out citation precision, and the verifiable training term's
    `cited_gold` (learning/judge/verifiable.py), so the two never drift apart."""
    gold = {t.strip().casefold() for t in gold_titles}
    return sum(1 for t in cited_titles if t.strip().casefold() in gold) / len(cited_titles) if cited_titles else 0.0
