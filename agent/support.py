"""Verified citations (issue 48): each cited sentence of a report is checked against the passage it cites, and the
report is repaired where the passage does not say what the sentence claims.

A claim is a sentence (or a list item, or a table cell) of the rendered answer that carries `[n]` markers. Its
support by a passage is one number in [0, 1]:

    support = COSINE_WEIGHT · max(0, MiniLM cosine(claim, "title. text")) + (1 − COSINE_WEIGHT) · overlap

where overlap is the share of the claim's content words (three letters or more, not a stop word; numbers of two
digits or more) that the passage's title or text contains, words compared by their first five letters. The cosine
alone rates a sentence on the passage's topic high even when the passage says something else; the overlap alone
misses a paraphrase. A claim is supported by a passage at `SUPPORT_MIN` or above (calibrated: docs/citations.md).

Repair, never fabricate:
- the cited passages that support the claim are kept (status `supported`; a cited one that does not is dropped);
- when none does, the retrieved passage that supports it best, if it reaches `SUPPORT_MIN`, is cited instead
  (`reattributed`);
- otherwise the claim keeps its text, loses its markers, and is marked unsupported in the text (`unsupported`).
Only passages this session retrieved are ever cited; references are renumbered in order of first use.

`check_support` is pure apart from the `embed` function it is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from store.records import Snippet

Embed = Callable[[Sequence[str]], Sequence[Sequence[float]]]
"""Texts → L2-normalised vectors (store.embeddings.embed_texts), so a dot product is the cosine similarity."""

COSINE_WEIGHT = 0.5
SUPPORT_MIN = 0.5
"""The support at or above which a passage supports a claim. Calibrated on 75 hand-labelled claims of 96 held-out
sessions (docs/citations.md): at 0.5 the check drops 32 citations, 94 % of them ones a reader finds unsupported
(false drops 6 %), and catches 83 % of the unsupported ones; 0.45 drops fewer with more false drops (7 %), 0.6 passes
the 10 % false-drop bound (13 %)."""
UNSUPPORTED_MARK = "*(unsupported)*"
MAX_CLAIMS = 200  # a very long answer: the first 200 cited claims are checked, the rest kept as written and counted

Status = Literal["supported", "reattributed", "unsupported"]
STATUS_WORDS: dict[str, str] = {"supported": "supported", "reattributed": "re-attributed", "unsupported": "unsupported"}
"""How each status reads to a person (the chat, the exports)."""

_MARKS = re.compile(r"(?:\s*\[\d+\])+")
_MARK = re.compile(r"\[(\d+)\]")
_WORDS = re.compile(r"[0-9a-z\u00c0-\uffff]+")
_STOP = frozenset("""
the and for are was were has have had not but with from this that these those which who whom whose what when where
why how its his her their them they you your our out into over under about after before than then there here also
been being can could would should may might will shall just only very more most much many such some any each both
all other another one two three per via upon onto off own same too nor yet did does doing done made make makes
answer question according source sources passage passages cited cite text report
""".split())


@dataclass(frozen=True, slots=True)
class ClaimSupport:
    """One cited claim: what it cited, what it cites after the check, and the support that decided it."""

    text: str  # the claim as shown, without its markers
    cited: tuple[str, ...]  # snippet ids the answer cited for it (only retrieved ones reach the report)
    kept: tuple[str, ...]  # snippet ids it cites after the check (empty: unsupported)
    score: float  # the best support among `kept`, or among `cited` when it is unsupported
    status: Status

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "cited": list(self.cited), "kept": list(self.kept), "score": self.score,
                "status": self.status}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimSupport:
        status = d.get("status")
        if status not in ("supported", "reattributed", "unsupported"):
            raise ValueError(f"unknown claim status {status!r}")
        return cls(str(d.get("text", "")), tuple(str(i) for i in d.get("cited", ())),
                   tuple(str(i) for i in d.get("kept", ())), float(d.get("score", 0.0)), status)


@dataclass(frozen=True, slots=True)
class SupportCheck:
    """The check of a report's citations. `verified` is False when the scorer could not run (`note` says why); the
    report is then shown as written and says it is unverified."""

    claims: tuple[ClaimSupport, ...]
    verified: bool = True
    note: str = ""
    unchecked: int = 0  # cited claims past MAX_CLAIMS, kept as written

    @property
    def shown(self) -> bool:
        """Whether there is anything to tell a reader: claims were checked, or the check could not run."""
        return bool(self.claims) or not self.verified

    def counts(self) -> dict[str, int]:
        out = {"supported": 0, "reattributed": 0, "unsupported": 0}
        for c in self.claims:
            out[c.status] += 1
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"verified": self.verified, "note": self.note, "unchecked": self.unchecked, **self.counts(),
                "claims": [c.as_dict() for c in self.claims]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SupportCheck:
        return cls(tuple(ClaimSupport.from_dict(c) for c in d.get("claims", ())), bool(d.get("verified", False)),
                   str(d.get("note", "")), int(d.get("unchecked", 0)))


def support_summary(check: SupportCheck) -> str:
    """One line for a terminal: "3 supported, 1 re-attributed, 0 unsupported", or why it is unverified."""
    if not check.verified:
        return f"not verified ({check.note})"
    n = check.counts()
    more = f", {check.unchecked} not checked" if check.unchecked else ""
    return f"{n['supported']} supported, {n['reattributed']} re-attributed, {n['unsupported']} unsupported{more}"


def support_sentence(check: SupportCheck) -> str | None:
    """The check in one sentence for the report and the chat ("Citations checked against their passages: 3
    supported, 1 re-attributed …"), or why it is unverified; None when there is nothing to tell."""
    if not check.shown:
        return None
    if not check.verified:
        return f"Citations not verified ({' '.join(check.note.split())[:200]}): check each one against its source."
    n = check.counts()
    parts = [f"{n['supported']} supported"]
    if n["reattributed"]:
        parts.append(f"{n['reattributed']} re-attributed to a passage that supports them")
    if n["unsupported"]:
        parts.append(f"{n['unsupported']} unsupported (marked {UNSUPPORTED_MARK}, citation removed)")
    more = f"; {check.unchecked} more not checked" if check.unchecked else ""
    return f"Citations checked against their passages: {', '.join(parts)}{more}."


@dataclass(frozen=True, slots=True)
class Repaired:
    """A body after the check: its text, the snippet ids in new reference order, and the check."""

    body: str
    order: tuple[str, ...]
    check: SupportCheck


# --- scoring (pure) ---------------------------------------------------------------------------------------------------


def content_words(text: str) -> set[str]:
    """The claim words the overlap counts, each as its first five letters (a crude stem: "founded" ~ "founder")."""
    out = set()
    for w in _WORDS.findall(text.lower()):
        if w.isdigit():
            if len(w) >= 2:
                out.add(w)
        elif len(w) >= 3 and w not in _STOP:
            out.add(w[:5])
    return out


def _overlap(words: set[str], passage_words: set[str]) -> float:
    return len(words & passage_words) / len(words) if words else 0.0


def overlap(claim: str, passage: Snippet) -> float:
    """The share of the claim's content words found in the passage's title or text (0 for a claim without any)."""
    return _overlap(content_words(claim), content_words(f"{passage.title} {passage.text}"))


def support_parts(claims: Sequence[str], passages: Sequence[Snippet], embed: Embed) -> tuple[np.ndarray, np.ndarray]:
    """The two halves of the support of every (claim, passage) pair, each shape (claims, passages): the cosine
    (clipped at 0) and the word overlap. One `embed` call; each text is tokenised once."""
    shape = (len(claims), len(passages))
    if not claims or not passages:
        return np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=np.float32)
    vectors = np.asarray(embed([*claims, *(f"{p.title}. {p.text}" for p in passages)]), dtype=np.float32)
    cos = np.clip(vectors[: len(claims)] @ vectors[len(claims):].T, 0.0, 1.0)
    passage_words = [content_words(f"{p.title} {p.text}") for p in passages]
    lex = np.array([[_overlap(content_words(c), pw) for pw in passage_words] for c in claims],
                   dtype=np.float32).reshape(shape)
    return cos, lex


def support_matrix(claims: Sequence[str], passages: Sequence[Snippet], embed: Embed) -> np.ndarray:
    """Support of every (claim, passage) pair, shape (claims, passages) (see the module docstring)."""
    cos, lex = support_parts(claims, passages, embed)
    return COSINE_WEIGHT * cos + (1.0 - COSINE_WEIGHT) * lex


def decide(cited: Sequence[str], scores: dict[str, float], min_support: float = SUPPORT_MIN
           ) -> tuple[tuple[str, ...], float, Status]:
    """What a claim cites after the check, from the support of every retrieved passage (by id) for it."""
    kept = tuple(i for i in cited if scores.get(i, 0.0) >= min_support)
    if kept:
        return kept, max(scores[i] for i in kept), "supported"
    best = max(scores, key=lambda i: scores[i], default=None)
    if best is not None and scores[best] >= min_support:
        return (best,), scores[best], "reattributed"
    return (), max((scores.get(i, 0.0) for i in cited), default=0.0), "unsupported"


# --- the report body ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Piece:
    """A stretch of the body: a claim with markers, or text between claims (`numbers` empty)."""

    text: str
    numbers: tuple[int, ...] = ()


_BOUNDARY = re.compile(r"(?<=[.!?])(?=\s+[A-Z\u00C0-\u024F\"'\u201c(\[\\*])")
_ABBREVIATION = re.compile(r"(?:^|[\s(.])(?:[A-Za-z]|c|ca|fl|b|d|e\.g|i\.e|vs|etc|St|Dr|Mr|Mrs|Ms|Jr|Sr|No|Mt)\.$")
_LEAD = re.compile(r"(\s*(?:\[\u2026\]|\u2026|\.\.\.)?\s*(?:\[\d+\]\s*)+)(?=\S|$)")


def _split_line(line: str) -> list[str]:
    """A line's units: table cells (a row starts with "|"), else sentences; joined they give the line back.

    A sentence ends at . ! or ? before a capital, a quote, a bracket or a backslash, unless the word before the stop
    is an initial or a common abbreviation ("c. 1243", "O.F.M. (", "J. R. R. Tolkien")."""
    if line.lstrip().startswith("|"):
        return re.split(r"(?<=\|)", line)
    out, start = [], 0
    for m in _BOUNDARY.finditer(line):
        if _ABBREVIATION.search(line[max(start, m.start() - 8): m.start()]):
            continue
        out.append(line[start: m.start()])
        start = m.start()
    return [*out, line[start:]]


def _pieces(body: str) -> list[_Piece]:
    """The body cut into units, each unit's markers read off it; a marker group that opens a unit ("Claim. [1]
    Next.") belongs to the unit before it."""
    out: list[_Piece] = []
    for li, line in enumerate(body.split("\n")):
        if li:
            out.append(_Piece("\n"))
        units: list[str] = []
        for unit in _split_line(line):  # markers (after a snippet's "[…]") that open a unit close the one before
            lead = _LEAD.match(unit)
            if lead and units and _MARK.search(lead.group(1)) and not unit.lstrip().startswith("|"):
                units[-1] += lead.group(1).rstrip()
                unit = unit[len(lead.group(1).rstrip()):]
            units.append(unit)
        for unit in units:
            numbers = tuple(dict.fromkeys(int(n) for n in _MARK.findall(unit)))
            out.append(_Piece(unit, numbers))
    return out


def claim_text(unit: str) -> str:
    """A unit without its markers, list bullet, table bars and emphasis: the words that are claimed."""
    text = _MARKS.sub("", unit).replace("[\u2026]", " ")  # "[…]": where a snippet was cut, not a word
    text = re.sub(r"\\boxed\{[^{}]*\}", " ", text)  # the exact-answer box is the answer, not this sentence's claim
    text = re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])\s+", "", text)
    return " ".join(text.replace("|", " ").replace("**", "").split())


def _rewrite(unit: str, new: Sequence[int], unsupported: bool) -> str:
    """The unit with its first marker group replaced by `new` (or the unsupported mark) and any other removed."""
    first = _MARKS.search(unit)
    if first is None:
        return unit
    repl = "".join(f" [{n}]" for n in new) if new else f" {UNSUPPORTED_MARK}"
    head, tail = unit[: first.start()], _MARKS.sub("", unit[first.end():])
    return f"{head}{repl}{tail}"


def check_support(body: str, references: Sequence[Snippet], retrieved: Sequence[Snippet], embed: Embed,
                  min_support: float = SUPPORT_MIN) -> Repaired:
    """Check every cited claim of `body` (markers [n] name `references[n-1]`) against the passages, and repair it.

    Args:
        body: the rendered answer with [n] markers.
        references: the passages the markers number, in order.
        retrieved: every passage this session retrieved (the only ones a claim may be re-attributed to).
        embed: texts → L2-normalised vectors (MiniLM).

    Raises:
        Whatever `embed` raises (the caller shows the report unverified).
    """
    pieces = _pieces(body)
    for piece in pieces:  # a number no reference has is dropped (its marker removed below, never shown)
        piece.numbers = tuple(n for n in piece.numbers if 1 <= n <= len(references))
    # a marker on no words (". [1]") claims nothing: it is kept as written, not checked
    texts = {id(p): claim_text(p.text) for p in pieces if p.numbers}
    claims = [p for p in pieces if p.numbers and re.search(r"[^\W\d_]{2}", texts[id(p)])]
    checked, unchecked = claims[:MAX_CLAIMS], max(0, len(claims) - MAX_CLAIMS)
    passages = list({s.id: s for s in [*references, *retrieved]}.values())
    matrix = support_matrix([texts[id(p)] for p in checked], passages, embed)
    results: dict[int, ClaimSupport] = {}
    for row, piece in zip(matrix, checked, strict=True):
        cited = tuple(dict.fromkeys(references[n - 1].id for n in piece.numbers))
        scores = {p.id: float(s) for p, s in zip(passages, row, strict=True)}
        kept, score, status = decide(cited, scores, min_support)
        results[id(piece)] = ClaimSupport(texts[id(piece)], cited, kept, round(score, 3), status)

    def ids_of(piece: _Piece) -> tuple[str, ...]:  # unchecked claims keep what they cited
        found = results.get(id(piece))
        return found.kept if found else tuple(dict.fromkeys(references[n - 1].id for n in piece.numbers))

    order: list[str] = []
    for piece in pieces:  # new numbers in order of first use
        order += [i for i in ids_of(piece) if i not in order]
    number = {sid: k + 1 for k, sid in enumerate(order)}
    text = []
    for piece in pieces:
        found = results.get(id(piece))
        if piece.numbers:
            text.append(_rewrite(piece.text, [number[i] for i in ids_of(piece)],
                                 found is not None and found.status == "unsupported"))
        else:
            text.append(_MARKS.sub("", piece.text) if _MARK.search(piece.text) else piece.text)
    check = SupportCheck(tuple(results[id(p)] for p in checked), True, "", unchecked)
    return Repaired("".join(text), tuple(order), check)
