"""Pure text helpers of DeepRubric: sentences, tokens, overlap, entity spans and statement trimming.

Decisions where METHOD §11 is silent:
- A "token" (the sub-query limit of under 12 tokens) is a run of word characters or one punctuation mark
  (`token_count`); it over-counts slightly compared with a subword tokenizer on ordinary words, so a query that
  passes here also passes a model's own count of words.
- Overlap between two texts is the Jaccard similarity of their content tokens (lower-cased words minus a short stop
  list); duplicate statements are those whose normalised text is equal or whose overlap is at least
  `NEAR_DUPLICATE`.
- A statement longer than 240 characters is cut at the last clause boundary (`;` or `,`) that keeps it within the
  limit, never with an ellipsis, so every statement stays a verbatim piece of its passage.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

STATEMENT_CHARS = 240  # METHOD §11.2: leaf statements are trimmed to at most 240 characters
MIN_STATEMENT_CHARS = 25  # shorter "sentences" are headings, list debris or fragments
NEAR_DUPLICATE = 0.85  # content-token Jaccard at or above which two statements are the same evidence

_WORD = re.compile(r"\w+", re.UNICODE)
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_SENTENCE_END = re.compile(r"[.!?][\"'’”)\]]?\s+")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr c ca vs no mt gen col lt sgt capt rev prof inc ltd co corp fr sen gov pres est approx "
    "jan feb mar apr jun jul aug sep sept oct nov dec u.s e.g i.e etc al".split()
)
STOPWORDS = frozenset(
    "a an the and or but of in on at to for from by with without about as is are was were be been being it its "
    "this that these those he she they his her their them who whom which what when where why how than then there "
    "into onto over under after before during also not no nor so such can could would should may might will do "
    "does did has have had more most other some any each many much very one two both between within while".split()
)
# Words that open a sentence without starting a name ("The", "In 1990", "However").
_NOT_NAME_START = frozenset(
    "the a an in on at to for from by with as after before during however although though while when where since "
    "this that these those it its he she they his her their there here some many most several one two other "
    "both each according despite following later early late also but and or if unlike like among".split()
)
_NAME_JOINERS = frozenset({"of", "the", "de", "du", "la", "le", "von", "van", "der", "den", "da", "di"})
_CAPITALISED = re.compile(r"^[A-Z][\w'’.-]*$|^[0-9]+[A-Za-z]*$")


def normalise(text: str) -> str:
    """Lower-cased word tokens joined by single spaces (punctuation and spacing do not count)."""
    return " ".join(_WORD.findall(text.lower()))


def collapse(text: str) -> str:
    """Whitespace collapsed to single spaces, stripped (as the search tools return passage text)."""
    return " ".join(text.split())


def words(text: str) -> list[str]:
    """Lower-cased word tokens."""
    return _WORD.findall(text.lower())


def content_tokens(text: str) -> frozenset[str]:
    """Lower-cased words that are not stop words."""
    return frozenset(w for w in words(text) if w not in STOPWORDS)


def token_count(text: str) -> int:
    """Words plus punctuation marks (see the module docstring)."""
    return len(_TOKEN.findall(text))


def jaccard(a: Iterable[str], b: Iterable[str]) -> float:
    """|A ∩ B| / |A ∪ B| of two token collections (0 when both are empty)."""
    sa, sb = set(a), set(b)
    union = sa | sb
    return len(sa & sb) / len(union) if union else 0.0


def overlap(a: str, b: str) -> float:
    """Content-token Jaccard of two texts."""
    return jaccard(content_tokens(a), content_tokens(b))


def sentences(text: str) -> list[str]:
    """Split a passage into sentences, verbatim (after collapsing whitespace).

    A full stop after a known abbreviation or a single capital letter (an initial) does not end a sentence.
    """
    text = collapse(text)
    out: list[str] = []
    start = 0
    for m in _SENTENCE_END.finditer(text):
        before = text[start : m.start() + 1]
        last = before.split()[-1] if before.split() else ""
        stem = last.rstrip(".").lower()
        if text[m.start()] == "." and (stem in _ABBREVIATIONS or re.fullmatch(r"[a-z]", stem)):
            continue
        nxt = text[m.end() : m.end() + 1]
        if nxt and not (nxt.isupper() or nxt.isdigit() or nxt in "\"'“‘("):
            continue
        out.append(text[start : m.end()].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def trim_statement(sentence: str, limit: int = STATEMENT_CHARS) -> str | None:
    """The sentence, or its longest verbatim prefix ending at a clause boundary within `limit`; None if none fits.

    A prefix shorter than half the limit carries too little to stand as evidence and is refused.
    """
    sentence = sentence.strip()
    if len(sentence) <= limit:
        return sentence if len(sentence) >= MIN_STATEMENT_CHARS else None
    head = sentence[:limit]
    cut = max(head.rfind(";"), head.rfind(","))
    if cut < limit // 2:
        return None
    return head[:cut].rstrip()


def is_duplicate(text: str, seen: Sequence[str]) -> bool:
    """Whether `text` repeats one of `seen` (equal normalised text, or near-duplicate content tokens)."""
    norm = normalise(text)
    tokens = content_tokens(text)
    for other in seen:
        if normalise(other) == norm or jaccard(tokens, content_tokens(other)) >= NEAR_DUPLICATE:
            return True
    return False


def entity_spans(text: str, max_words: int = 5) -> list[str]:
    """Capitalised name spans in `text` ("Alexander of Hales", "University of Paris"), in order of appearance.

    A span is a run of capitalised words, possibly joined by "of", "the", "de", ...; a sentence-opening word that
    rarely starts a name ("The", "In", "However") is skipped; spans of one short word and joiners at the edges are
    dropped; spans are cut to `max_words`.
    """
    spans: list[str] = []
    for sentence in sentences(text):
        raw = sentence.split()
        toks = [t.strip(",;:()\"“”'‘’[]") for t in raw]
        i = 0
        while i < len(toks):
            tok = toks[i]
            if not _CAPITALISED.match(tok) or (i == 0 and tok.lower() in _NOT_NAME_START) or tok[:1].isdigit():
                i += 1
                continue
            j = i + 1
            while j < len(toks) and not _breaks(raw[j - 1], raw[j]) and (
                _CAPITALISED.match(toks[j]) or (toks[j].lower() in _NAME_JOINERS and j + 1 < len(toks)
                                                 and _CAPITALISED.match(toks[j + 1]))
            ):
                j += 1
            span = [t.rstrip(".") for t in toks[i:j]]
            while span and span[-1].lower() in _NAME_JOINERS:
                span.pop()
            span = span[:max_words]
            while span and span[-1].lower() in _NAME_JOINERS:
                span.pop()
            name = " ".join(span)
            # One capitalised word opening a sentence is usually not a name ("Originally", "Traditional").
            single_opener = len(span) == 1 and i == 0
            if name and not single_opener and (len(span) > 1 or len(name) >= 4) and name.lower() not in STOPWORDS:
                spans.append(name)
            i = j
    return spans


def _breaks(left: str, right: str) -> bool:
    """Whether punctuation between two raw tokens ends a name ("Hythria, Fardohnya", "Sona (Sinhala")."""
    return left[-1:] in ",;:)]\"”’" or right[:1] in "([\"“‘"


def lower_first(sentence: str) -> str:
    """The sentence with its first word lower-cased when that word is a common sentence opener (never a name)."""
    first, _, rest = sentence.partition(" ")
    if first.lower() in _NOT_NAME_START and first[:1].isupper() and first[1:].islower():
        return first.lower() + (" " + rest if rest else "")
    return sentence


__all__ = [
    "MIN_STATEMENT_CHARS",
    "NEAR_DUPLICATE",
    "STATEMENT_CHARS",
    "STOPWORDS",
    "collapse",
    "content_tokens",
    "entity_spans",
    "is_duplicate",
    "jaccard",
    "lower_first",
    "normalise",
    "overlap",
    "sentences",
    "token_count",
    "trim_statement",
    "words",
]
