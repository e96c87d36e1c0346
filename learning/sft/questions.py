"""Questions for SFT trajectories, with the gold evidence an evidence-chain teacher needs (METHOD §10.1).

Three input shapes are read, each into the same typed `SFTQuestion`:
- HotpotQA records (a JSON list with `supporting_facts` and `context`): the hops are the supporting paragraphs,
  the statements their supporting sentences;
- MuSiQue records (a JSON list with `question_decomposition` and `paragraphs`): one hop per decomposition step;
- JSONL, one object a line: `{"id", "question", "answer" | "answers", "format"?, "hops": [{"query", "title",
  "text", "statement"?}]}` (hops optional: an LLM teacher needs none), which is also how DeepRubric pairs arrive.

A malformed file raises `QuestionFileError` naming the line (JSONL) or the item (JSON), before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learning.errors import LearningError

FORMATS = ("exact_answer", "short_form", "long_form")
STATEMENT_CHARS = 240  # DeepRubric leaf statements are at most 240 characters (METHOD §11.2); the same cap here


class QuestionFileError(LearningError, ValueError):
    """The questions file cannot be read; the message names the file and the line or item."""


@dataclass(frozen=True, slots=True)
class Hop:
    """One step of the evidence chain: what to look for, and the passage that answers it."""

    need: str  # what this hop finds, in words (for the plan); may refer to earlier hops as "step k"
    query: str  # a search query written from the hop (never the gold sentence)
    title: str  # gold passage title
    text: str  # gold passage text (matched against retrieved snippets)
    statement: str  # the supporting sentence(s), at most STATEMENT_CHARS
    answer: str = ""  # the hop's own answer, when the data gives it (MuSiQue)


@dataclass(frozen=True, slots=True)
class SFTQuestion:
    """A question with its answers and (optionally) its gold evidence chain."""

    id: str
    question: str
    answers: tuple[str, ...]
    hops: tuple[Hop, ...] = ()
    source: str = ""  # hotpotqa | musique | jsonl
    kind: str = ""  # bridge | comparison | compositional | ""
    format: str | None = None  # a fixed format label, or None (the teacher picks)

    @property
    def answer(self) -> str:
        """The main answer."""
        return self.answers[0] if self.answers else ""


_STOP = frozenset(
    "a an the of in on at to for from by with and or is are was were be been which what who whom whose when where "
    "why how did does do that this these those it its as into than both same either any if same".split()
)
_WORD = re.compile(r"[\w'’.-]+", re.UNICODE)


def clip(text: str, limit: int = STATEMENT_CHARS) -> str:
    """Whitespace-normalised text cut at a word boundary to at most `limit` characters."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + "…"


def keywords(text: str, limit: int = 8, drop: str = "") -> list[str]:
    """Content words of `text` in order, without stop words or words already in `drop`."""
    dropped = {w.lower().strip(".'’") for w in _WORD.findall(drop)}
    out: list[str] = []
    for w in _WORD.findall(text):
        w = w.strip(".'’-")
        low = w.lower()
        if not w or low in _STOP or low in dropped or low in (o.lower() for o in out):
            continue
        out.append(w)
        if len(out) == limit:
            break
    return out


def main_title(title: str) -> str:
    """The title without a trailing parenthetical ("Lilu (mythology)" -> "Lilu")."""
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip() or title


def _sentence_with(text: str, needle: str) -> str:
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    low = needle.lower()
    hit = next((s for s in sentences if low and low in s.lower()), sentences[0] if sentences else text)
    return clip(hit)


# -- HotpotQA ---------------------------------------------------------------------------------------------------------


def _hotpot(rec: Mapping[str, Any], where: str) -> SFTQuestion:
    try:
        question, answer = str(rec["question"]), str(rec["answer"])
        context = {str(t): [str(s) for s in sents] for t, sents in rec["context"]}
        facts = [(str(t), int(i)) for t, i in rec["supporting_facts"]]
        qid = str(rec.get("_id") or rec.get("id"))
    except (KeyError, TypeError, ValueError) as exc:
        raise QuestionFileError(f"{where}: not a HotpotQA record ({type(exc).__name__}: {exc})") from exc
    titles = list(dict.fromkeys(t for t, _ in facts))
    if not titles or any(t not in context for t in titles):
        raise QuestionFileError(f"{where}: supporting_facts name a title that is not in the record's context")
    # Titles the question names come first: they can be searched before anything is known.
    titles.sort(key=lambda t: main_title(t).lower() not in question.lower())
    kind = str(rec.get("type", ""))
    hops = []
    for n, title in enumerate(titles):
        sents = context[title]
        statement = clip(" ".join(sents[i].strip() for i, t in ((i, t) for t, i in facts if t == title)
                                   if 0 <= i < len(sents)) or sents[0])
        name = main_title(title)
        named = name.lower() in question.lower()
        if kind == "comparison" or n == 0:
            need = f"what the question needs about {name}" if named else "the entity the question describes"
        else:
            need = "the entity the first passage points to, and the fact the question asks about it"
        query = " ".join([name, *keywords(question, 6, drop=name)]) if (named or n > 0) else " ".join(
            keywords(question, 9))
        hops.append(Hop(need=need, query=query, title=title, text=" ".join(s.strip() for s in sents),
                        statement=statement))
    return SFTQuestion(qid, question, (answer,), tuple(hops), "hotpotqa", kind or "bridge")


# -- MuSiQue ----------------------------------------------------------------------------------------------------------

_REF = re.compile(r"#(\d+)")


def _hop_text(raw: str, answers: Sequence[str] | None) -> str:
    """'#1 >> spouse' -> 'spouse of <answer 1>'; '#k' -> the k-th answer (or 'step k' in the plan)."""

    def ref(m: re.Match[str]) -> str:
        k = int(m.group(1))
        if answers is None:
            return f"(the answer of step {k})"
        return answers[k - 1] if 0 < k <= len(answers) else m.group(0)

    text = raw.strip()
    if ">>" in text:
        subject, relation = (p.strip() for p in text.split(">>", 1))
        text = f"{relation} of {subject}"
    return " ".join(_REF.sub(ref, text).rstrip("?").split())


def _musique(rec: Mapping[str, Any], where: str) -> SFTQuestion:
    try:
        question, answer = str(rec["question"]), str(rec["answer"])
        aliases = tuple(str(a) for a in rec.get("answer_aliases") or ())
        paragraphs = {int(p["idx"]): (str(p["title"]), str(p["paragraph_text"])) for p in rec["paragraphs"]}
        steps = [(str(d["question"]), str(d["answer"]), int(d["paragraph_support_idx"]))
                 for d in rec["question_decomposition"]]
        qid = str(rec["id"])
    except (KeyError, TypeError, ValueError) as exc:
        raise QuestionFileError(f"{where}: not a MuSiQue record ({type(exc).__name__}: {exc})") from exc
    hop_answers = [a for _, a, _ in steps]
    hops = []
    for raw, hop_answer, idx in steps:
        if idx not in paragraphs:
            raise QuestionFileError(f"{where}: paragraph_support_idx {idx} is not among the record's paragraphs")
        title, text = paragraphs[idx]
        hops.append(Hop(need=_hop_text(raw, None), query=_hop_text(raw, hop_answers), title=title, text=text,
                        statement=_sentence_with(text, hop_answer), answer=hop_answer))
    return SFTQuestion(qid, question, (answer, *aliases), tuple(hops), "musique", "compositional")


# -- JSONL -------------------------------------------------------------------------------------------------------------


def _jsonl_item(obj: Any, where: str) -> SFTQuestion:
    if not isinstance(obj, dict):
        raise QuestionFileError(f"{where}: expected a JSON object")
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        raise QuestionFileError(f"{where}: `question` must be a non-empty string")
    answers = obj.get("answers", [obj["answer"]] if "answer" in obj else [])
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise QuestionFileError(f"{where}: `answer` must be a string or `answers` a list of strings")
    fmt = obj.get("format")
    if fmt is not None and fmt not in FORMATS:
        raise QuestionFileError(f"{where}: `format` must be one of {', '.join(FORMATS)}")
    hops = []
    for k, h in enumerate(obj.get("hops") or []):
        if not isinstance(h, dict) or not all(isinstance(h.get(f), str) and h[f].strip() for f in
                                                ("query", "title", "text")):
            raise QuestionFileError(f"{where}: hop {k + 1} needs non-empty `query`, `title` and `text`")
        hops.append(Hop(need=str(h.get("need") or h["query"]), query=h["query"], title=h["title"], text=h["text"],
                        statement=clip(str(h.get("statement") or h["text"])), answer=str(h.get("answer", ""))))
    # A stable id (str hash() is salted per process, which would break resuming a generation run).
    qid = str(obj.get("id") or "q" + hashlib.sha256(question.strip().encode()).hexdigest()[:12])
    return SFTQuestion(qid, question.strip(), tuple(answers), tuple(hops), str(obj.get("source", "jsonl")),
                       str(obj.get("kind", "")), fmt)


def load_questions(path: Path) -> list[SFTQuestion]:
    """Read a questions file (HotpotQA/MuSiQue JSON, or JSONL); ids must be unique.

    Raises:
        QuestionFileError: unreadable file, bad JSON, a record of an unknown shape, or a duplicate id.
    """
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise QuestionFileError(f"{path}: cannot read the questions file ({exc})") from exc
    items: list[SFTQuestion] = []
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(raw.split("\n"), 1):  # not splitlines(): U+2028 may sit inside a string
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise QuestionFileError(f"{path}, line {lineno}: not valid JSON ({exc.msg})") from exc
            items.append(_jsonl_item(obj, f"{path}, line {lineno}"))
    else:
        try:
            records = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise QuestionFileError(f"{path}, line {exc.lineno}: not valid JSON ({exc.msg})") from exc
        if not isinstance(records, list):
            raise QuestionFileError(f"{path}: expected a JSON list of HotpotQA or MuSiQue records")
        for n, rec in enumerate(records):
            where = f"{path}, item {n}"
            if isinstance(rec, dict) and "question_decomposition" in rec:
                items.append(_musique(rec, where))
            elif isinstance(rec, dict) and "supporting_facts" in rec:
                items.append(_hotpot(rec, where))
            else:
                items.append(_jsonl_item(rec, where))
    seen: set[str] = set()
    for q in items:
        if q.id in seen:
            raise QuestionFileError(f"{path}: question id {q.id!r} appears twice")
        seen.add(q.id)
    if not items:
        raise QuestionFileError(f"{path}: no questions")
    return items
