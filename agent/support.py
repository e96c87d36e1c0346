"""Verified citations (issues 48 and 64): each cited claim of a report is checked against the passage it cites, and
the report is repaired where the passage does not say what the claim says.

A claim is the clause before a citation marker group: a sentence (or a list item, or a table cell) of the rendered
answer with one group of `[n]` markers is one claim; a sentence with several groups ("A [1], and B [2].") is one
claim per group, each the words since the group before. Its support by a passage is one number in [0, 1]:

    support = COSINE_WEIGHT · max(0, MiniLM cosine(claim, "title. text")) + (1 − COSINE_WEIGHT) · overlap

where overlap is the share of the claim's content words (three letters or more, not a stop word; numbers of two
digits or more) that the passage's title or text contains, words compared by their first five letters. The cosine
alone rates a sentence on the passage's topic high even when the passage says something else; the overlap alone
misses a paraphrase. A passage supports a claim at `SUPPORT_MIN` or above (calibrated: docs/citations.md) when no
veto applies (agent/vetoes.py): a passage that contradicts the claim (negation, another number, roles swapped,
another entity in the slot, an antonym, another quantifier, or a claim about the source itself) never supports it,
and neither does one that never states a number or a name of the claim (for a group citing several passages, the
group together must state them).

Repair, never fabricate, and leave every citation where it was written:
- the cited passages that support the claim are kept (status `supported`; a cited one that does not is dropped);
- when none does, the retrieved passage that supports it best, with no veto at all, is cited instead
  (`reattributed`);
- otherwise the claim keeps its text, its marker group is replaced by the unsupported mark (`unsupported`), and the
  veto that ruled its passage out, if one did, is kept beside it.
A marker group on no words (". [1]", "| 1066 [1] |") claims nothing the check can read: it stays as written and is
counted as not checked, as the claims past `MAX_CLAIMS` are. Only passages this session retrieved are ever cited;
references are renumbered in order of first use.

`check_support` is pure apart from the `embed` function it is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from agent.vetoes import ClaimFacts, PassageFacts, Veto, claim_facts, is_contradiction, passage_facts, vetoes
from store.records import Snippet

Embed = Callable[[Sequence[str]], Sequence[Sequence[float]]]
"""Texts → L2-normalised vectors (store.embeddings.embed_texts), so a dot product is the cosine similarity."""

COSINE_WEIGHT = 0.5
SUPPORT_MIN = 0.5
"""The support at or above which a passage supports a claim. Calibrated on 75 hand-labelled claims of 96 held-out
sessions (docs/citations.md): at 0.5 the check drops 32 citations, 94 % of them ones a reader finds unsupported
(false drops 6 %), and catches 83 % of the unsupported ones; 0.45 drops fewer with more false drops (7 %), 0.6 passes
the 10 % false-drop bound (13 %)."""
GROUP_MIN = 0.35
"""A passage cited in the same marker group as a supporting one may state the numbers or names that one lacks when
its own support reaches this (below SUPPORT_MIN: it supports only part of the claim). Not calibrated: chosen so that
the half of a two-part sentence ("Haymo died in 1244 and Delhi has hot summers [1][2]", 0.48) counts."""
UNSUPPORTED_MARK = "*(unsupported)*"
MAX_CLAIMS = 200  # a very long answer: the first 200 cited claims are checked, the rest kept as written and counted
MAX_CLAIM_CHARS = 4000  # a claim's words past this are not read (MiniLM reads 256 tokens; the rules cap themselves)

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
    veto: str = ""  # why the cited passage cannot support it, when a veto ruled it out ("" otherwise)

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "cited": list(self.cited), "kept": list(self.kept), "score": self.score,
                "status": self.status, "veto": self.veto}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimSupport:
        status = d.get("status")
        if status not in ("supported", "reattributed", "unsupported"):
            raise ValueError(f"unknown claim status {status!r}")
        return cls(str(d.get("text", "")), tuple(str(i) for i in d.get("cited", ())),
                   tuple(str(i) for i in d.get("kept", ())), float(d.get("score", 0.0)), status,
                   str(d.get("veto", "")))


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
    vetoed = sum(bool(c.veto) for c in check.claims)
    why = (f" {vetoed} of the re-attributed and unsupported ones cited a passage that contradicts them or does not "
           "state their numbers or names." if vetoed else "")
    more = f"; {check.unchecked} more not checked" if check.unchecked else ""
    return f"Citations checked against their passages: {', '.join(parts)}{more}.{why}"


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


def decide(cited: Sequence[str], scores: Mapping[str, float], min_support: float = SUPPORT_MIN,
           found: Mapping[str, tuple[Veto, ...]] | None = None) -> tuple[tuple[str, ...], float, Status, str]:
    """What a claim cites after the check: (kept ids, score, status, the veto that ruled out its citation or "").

    `scores` is the support of every retrieved passage (by id) for the claim, `found` the vetoes of each passage
    that reaches `min_support`. The cited passages that reach it and do not contradict the claim are kept when,
    together, they state every number and name of the claim; another passage cited with them that states what
    they do not, contradicts nothing and reaches `GROUP_MIN` is kept beside them ("A in 1244 and B [1][2]").
    Otherwise the best passage with no veto at all is cited instead; failing that the claim is unsupported.
    """
    found = found or {}
    fair = [i for i in dict.fromkeys(cited) if not is_contradiction(found.get(i, ()))]
    candidates = [i for i in fair if scores.get(i, 0.0) >= min_support]
    unstated = _unstated([found.get(i, ()) for i in candidates])
    if candidates and unstated:  # another passage of the same group may state what these do not
        helpers = [i for i in fair if i not in candidates and scores.get(i, 0.0) >= GROUP_MIN
                   and unstated - _unstated([found.get(i, ())])]
        if helpers and not _unstated([found.get(i, ()) for i in (*candidates, *helpers)]):
            candidates = [i for i in fair if i in candidates or i in helpers]
            unstated = frozenset()
    if candidates and not unstated:
        return tuple(candidates), max(scores[i] for i in candidates), "supported", ""
    why = _why(cited, scores, found, min_support)
    clean = [i for i in scores if scores[i] >= min_support and not found.get(i) and i not in cited]
    best = max(clean, key=lambda i: scores[i], default=None)
    if best is not None:
        return (best,), scores[best], "reattributed", why
    return (), max((scores.get(i, 0.0) for i in cited), default=0.0), "unsupported", why


def _unstated(found: Sequence[tuple[Veto, ...]]) -> frozenset[str]:
    """The facts (numbers, names) that none of these passages states: each passage's missing ones, intersected."""
    if not found:
        return frozenset()
    missing = [frozenset().union(*(v.missing for v in f)) for f in found]
    return frozenset.intersection(*missing)


def _why(cited: Sequence[str], scores: Mapping[str, float], found: Mapping[str, tuple[Veto, ...]],
         min_support: float) -> str:
    """The veto of the best-supported cited passage that reached `min_support`, as a reader would read it."""
    vetoed = [i for i in cited if scores.get(i, 0.0) >= min_support and found.get(i)]
    if not vetoed:
        return ""
    best = max(vetoed, key=lambda i: scores[i])
    return "; ".join(v.text() for v in found[best][:2])[:300]


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
    text = text.replace(UNSUPPORTED_MARK, " ")  # an invented id's mark (agent/report.py), not a word of the claim
    text = re.sub(r"\\boxed\{[^{}]*\}", " ", text)  # the exact-answer box is the answer, not this sentence's claim
    text = re.sub(r"^\s*(?:[-*\u2022]|\d+[.)])\s+", "", text)
    return " ".join(text.replace("|", " ").replace("**", "").split())


@dataclass(frozen=True, slots=True)
class _Group:
    """One marker group of a unit: where it is, the reference numbers it names that exist, and the claim before it
    ("" when it is not checked)."""

    start: int
    end: int
    numbers: tuple[int, ...]
    claim: str


def _groups(unit: str, references: int) -> list[_Group]:
    """The unit's marker groups that name an existing reference, each with its claim: the whole unit when it has
    one group, else the words since the group before (and, for the last, the words after it)."""
    found = []
    for m in _MARKS.finditer(unit):
        numbers = tuple(dict.fromkeys(n for n in map(int, _MARK.findall(m.group(0))) if 1 <= n <= references))
        if numbers:
            found.append((m.start(), m.end(), numbers))
    out, prev = [], 0
    for k, (start, end, numbers) in enumerate(found):
        if len(found) == 1:
            words = unit
        else:
            words = unit[prev:start] + (unit[end:] if k == len(found) - 1 else "")
        out.append(_Group(start, end, numbers, claim_text(words[:MAX_CLAIM_CHARS])))
        prev = end
    return out


def _has_words(claim: str) -> bool:
    return re.search(r"[^\W\d_]{2}", claim) is not None


def check_support(body: str, references: Sequence[Snippet], retrieved: Sequence[Snippet], embed: Embed,
                  min_support: float = SUPPORT_MIN) -> Repaired:
    """Check every cited claim of `body` (markers [n] name `references[n-1]`) against the passages, and repair it.

    Args:
        body: the rendered answer with [n] markers.
        references: the passages the markers number, in order.
        retrieved: every passage this session retrieved (the only ones a claim may be re-attributed to).
        embed: texts → L2-normalised vectors (MiniLM).

    Raises:
        Whatever `embed` raises (the caller shows the report unverified). A failure of the vetoes is not raised:
        the body comes back as written, with a check that says it is not verified and why.
    """
    pieces = _pieces(body)
    groups = {id(p): _groups(p.text, len(references)) for p in pieces if p.numbers}
    readable = [(p, g) for p in pieces for g in groups.get(id(p), ()) if _has_words(g.claim)]
    checked = readable[:MAX_CLAIMS]
    unchecked = sum(len(gs) for gs in groups.values()) - len(checked)  # no words, or past MAX_CLAIMS
    passages = list({s.id: s for s in [*references, *retrieved]}.values())
    matrix = support_matrix([g.claim for _, g in checked], passages, embed)
    results: dict[tuple[int, int], ClaimSupport] = {}
    try:
        read: dict[str, PassageFacts] = {}
        for row, (piece, group) in zip(matrix, checked, strict=True):
            cited = tuple(dict.fromkeys(references[n - 1].id for n in group.numbers))
            scores = {p.id: float(x) for p, x in zip(passages, row, strict=True)}
            found = _vetoes(claim_facts(group.claim), passages, scores, min_support, read, cited)
            kept, score, status, why = decide(cited, scores, min_support, found)
            results[(id(piece), group.start)] = ClaimSupport(group.claim, cited, kept, round(score, 3), status, why)
    except Exception as exc:  # noqa: BLE001 - a fault in the rules: the report says it is not verified, never supported
        note = f"the contradiction check failed ({type(exc).__name__}: {exc})"
        return Repaired(body, tuple(s.id for s in references), SupportCheck((), False, note[:300]))

    def ids_of(piece: _Piece, group: _Group) -> tuple[str, ...]:  # unchecked claims keep what they cited
        found = results.get((id(piece), group.start))
        return found.kept if found else tuple(dict.fromkeys(references[n - 1].id for n in group.numbers))

    order: list[str] = []
    for piece in pieces:  # new numbers in order of first use
        for group in groups.get(id(piece), ()):
            order += [i for i in ids_of(piece, group) if i not in order]
    number = {sid: k + 1 for k, sid in enumerate(order)}
    text = []
    for piece in pieces:
        if not piece.numbers:
            text.append(_MARKS.sub("", piece.text) if _MARK.search(piece.text) else piece.text)
            continue
        out, at = [], 0
        for m in _MARKS.finditer(piece.text):
            out.append(piece.text[at: m.start()])
            at = m.end()
            group = next((g for g in groups[id(piece)] if g.start == m.start()), None)
            if group is None:
                continue  # names no reference: removed, never shown
            found = results.get((id(piece), group.start))
            new = [number[i] for i in ids_of(piece, group)]
            if found is not None and found.status == "unsupported":
                out.append(f" {UNSUPPORTED_MARK}")
            elif new == list(group.numbers) and len(new) == len(_MARK.findall(m.group(0))):
                out.append(m.group(0))  # unchanged: as written
            else:
                out.append("".join(f" [{n}]" for n in new))
        out.append(piece.text[at:])
        text.append("".join(out))
    check = SupportCheck(tuple(results[(id(p), g.start)] for p, g in checked), True, "", unchecked)
    return Repaired("".join(text), tuple(order), check)


def _vetoes(claim: ClaimFacts, passages: Sequence[Snippet], scores: Mapping[str, float], min_support: float,
            read: dict[str, PassageFacts], cited: Sequence[str]) -> dict[str, tuple[Veto, ...]]:
    """The vetoes of every passage that reaches `min_support`, or `GROUP_MIN` when cited (the others cannot support
    the claim anyway); each passage is read once per check (`read`)."""
    out: dict[str, tuple[Veto, ...]] = {}
    for p in passages:
        if scores[p.id] < (GROUP_MIN if p.id in cited else min_support):
            continue
        if p.id not in read:
            read[p.id] = passage_facts(p.title, p.text)
        out[p.id] = vetoes(claim, read[p.id])
    return out
