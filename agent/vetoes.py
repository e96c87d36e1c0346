"""Vetoes for the citation check (issue 64): what topic similarity cannot see.

The support score (agent/support.py) is MiniLM's cosine plus word overlap. Both rate a passage on the claim's topic
high even when it says the opposite: "X was not born in 1950" against "X (born 1950)", "runs for 2 minutes" against
"runs for 20 minutes", "Federer defeated Nadal" against "Nadal defeated Federer". A veto is a rule over the words of
the claim and of the passage that finds such a contradiction; a vetoed passage never supports the claim, whatever
its score.

Why rules and not a model: no NLI or fact-checking model installs offline from the package registry as a pinned,
first-party package (the spaCy English pipelines there are third-party re-uploads of unclear provenance), so the
vetoes are rules over the current score. They cost about 0.1 ms per claim and passage, where MiniLM's score costs
tens of milliseconds per claim.

Two kinds of veto:
- a contradiction: the passage says something else (negation, roles swapped, another name in the same slot or
  another occupation, an antonym, another quantifier, or the claim is about the source rather than the world);
- a missing fact: a number, a name, or an "all" or "only" of the claim that the passage never states. For a claim
  citing several passages at once these are judged against all of them together.

They were written against hand-made adversarial sets (tests/agent/data/support_adversarial*.jsonl): what they
catch and what they miss is measured there, per kind.

Everything here is pure: text in, `Veto`s out. The rules read English; a claim in another language meets only the
number and name rules, which read any script.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

VetoKind = Literal["meta", "number", "entity", "negation", "role", "antonym", "quantifier"]

MAX_RULE_CHARS = 20_000
"""The rules read at most this much of a claim or a passage: a passage longer than that is cut, and a claim is
never that long once it is cut into clauses. It bounds the time a hostile input can take."""


@dataclass(frozen=True, slots=True)
class Veto:
    """Why a passage cannot support a claim. `missing` is set for a fact the passage never states (a number, a
    name): with several cited passages, the claim stands when another of them states it."""

    kind: VetoKind
    detail: str
    missing: frozenset[str] = frozenset()

    def text(self) -> str:
        return f"{self.kind}: {self.detail}"


# --- words ------------------------------------------------------------------------------------------------------

_TAG = re.compile(r"<[^<>]{0,200}>")
_MD_LINK = re.compile(r"!?\[([^\[\]]{0,300})\]\([^()\s]{0,500}\)")
_URL = re.compile(r"\b(?:https?|ftp)://\S+|\bwww\.\S+", re.IGNORECASE)
_ACRONYM = re.compile(r"\b(?:[A-Z]\.){2,}")
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*(?:st|nd|rd|th|s)?(?![^\W_])"  # 13,200 42.195 1990s 3rd (not 2 of "2km")
                    r"|[^\W\d_][^\W_]*(?:['\u2019][^\W\d_]+)*|\d+[^\W\d_]+\w*"  # words, "km2", "2km"
                    r"|[;:()\[\]\u2014]|,|"
                    r"\.\.\.|\u2026|\.")

_FUNCTION = frozenset("""
a an the this that these those it its he she his her him they them their there here we our you your i my me
and or but nor so yet for of in on at by to from with without into onto upon over under about after before
during while when where which who whom whose what why how as than then also too very just only even still
is are was were be been being am has have had do does did can could would should may might will shall must
not no never none neither all some any each every both most many much few several other another such same own
according however although though because since until unless whether if either also later earlier today
one first
""".split())
"""Words that are never a name, even capitalised at the start of a sentence."""

_BE = frozenset("is are was were be been being am".split())
_SKIP_AFTER_CUE = _BE | frozenset("a an the to ever yet even really have has had do does did been be any".split())

_IRREGULAR = {
    "won": "win", "lost": "lose", "led": "lead", "wrote": "write", "written": "write", "began": "begin",
    "begun": "begin", "fell": "fall", "fallen": "fall", "rose": "rise", "risen": "rise", "grew": "grow",
    "grown": "grow", "sold": "sell", "bought": "buy", "built": "build", "made": "make", "took": "take",
    "taken": "take", "gave": "give", "given": "give", "ran": "run", "beaten": "beat", "bore": "bear", "died": "die",
    "dies": "die", "dying": "die", "met": "meet", "saw": "see", "seen": "see", "went": "go", "gone": "go",
    "came": "come", "became": "become", "taught": "teach", "fought": "fight", "held": "hold", "told": "tell",
    "sang": "sing", "sung": "sing", "spoke": "speak", "spoken": "speak", "chose": "choose", "chosen": "choose",
    "drew": "draw", "drawn": "draw", "flew": "fly", "flown": "fly", "flies": "fly", "shrank": "shrink",
    "shrunk": "shrink", "sank": "sink", "sunk": "sink", "struck": "strike", "froze": "freeze", "frozen": "freeze",
    "paid": "pay", "sent": "send", "spent": "spend", "stood": "stand", "thought": "think", "caught": "catch",
    "brought": "bring", "kept": "keep", "felt": "feel", "lay": "lie", "laid": "lay", "ate": "eat", "eaten": "eat",
    "hid": "hide", "hidden": "hide", "rode": "ride", "ridden": "ride", "swam": "swim", "wore": "wear",
    "worn": "wear", "won't": "will", "children": "child", "men": "man", "women": "woman", "people": "person",
}


def fold(text: str) -> str:
    """Without accents ("Léopold" → "Leopold"): the same name written with or without them."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def stem(word: str) -> str:
    """A crude English stem, for matching a word of the claim with one of the passage: irregular forms mapped
    ("won" → "win"), a plural or tense ending cut, then the first five letters ("acquired" ~ "acquires")."""
    return lemma(word)[:5]


def lemma(word: str) -> str:
    """The word with irregular forms mapped and a plural or tense ending cut ("invented" → "invent")."""
    w = fold(word.lower().replace("\u2019", "'"))
    if w.endswith("'s"):
        w = w[:-2]
    w = _IRREGULAR.get(w, w)
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 4 and w.endswith("ied"):
        w = w[:-3] + "y"
    else:
        for suffix in ("ing", "ed", "s"):  # "males" → male, "crosses" → crosse → cross (below)
            if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not w.endswith("ss"):
                w = w[: -len(suffix)]
                break
    return w[:-1] if len(w) > 4 and w.endswith("e") else w  # "bridge" ~ "bridges" → bridg


def plain(text: str) -> str:
    """The words a reader sees: tags, Markdown links (their label kept), URLs and emphasis removed, acronyms with
    dots joined ("U.S." → "US"), cut at MAX_RULE_CHARS."""
    text = text[:MAX_RULE_CHARS]
    text = _TAG.sub(" ", text)
    text = _MD_LINK.sub(r" \1 ", text)
    text = _URL.sub(" ", text)
    text = re.sub(r"\\boxed\{[^{}]*\}", " ", text)
    text = _ACRONYM.sub(lambda m: m.group(0).replace(".", "") + " ", text)
    text = re.sub(r"[*_`~#>|\\]+", " ", text)
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class Token:
    """A word, a number or a clause's punctuation, with the forms the rules compare."""

    text: str  # as written
    low: str
    stem: str
    lemma: str  # the stem before it is cut to five letters ("invented" → invent, "inventor" → inventor)
    cap: bool  # starts with a capital letter (or is a number-free all-caps acronym)
    initial: bool  # first word of its sentence
    number: bool
    boundary: bool  # punctuation that ends a clause


def _end(out: list[Token], text: str, m: re.Match[str]) -> int:
    """Where the last token ends, if it ends right before the match (no space between), else -1."""
    last = out[-1].text
    return m.start() if text[max(0, m.start() - len(last)): m.start()] == last else -1


def tokens(text: str) -> tuple[Token, ...]:
    """The words, numbers and clause punctuation of `text` (already `plain`)."""
    out: list[Token] = []
    start = True
    for m in _TOKEN.finditer(text):
        t = m.group(0)
        if (t in ("...", "\u2026") and out and not out[-1].boundary and out[-1].low not in _FUNCTION
                and m.start() == _end(out, text, m)):
            out.pop()  # a word cut short by the ellipsis ("developed by Stud…"): not a word the passage must have
        if t in (".", "...", "\u2026"):
            start = True
            out.append(Token(".", ".", ".", ".", False, False, False, True))
            continue
        boundary = t in ";:()[]\u2014,"
        number = t[0].isdigit()
        low = t.lower()
        lem = low if number or boundary else lemma(t)
        out.append(Token(t, low, lem[:5], lem, t[0].isupper(), start and not boundary, number, boundary))
        if not boundary:
            start = False
    return tuple(out)


def _content(tok: Token) -> bool:
    return not tok.boundary and not tok.number and len(tok.low) >= 3 and tok.low not in _FUNCTION


def _is_name(tok: Token) -> bool:
    """A capitalised word that can name a person, place or work (not a function word at a sentence's start)."""
    return tok.cap and not tok.boundary and not tok.number and tok.low not in _FUNCTION and tok.low not in _NUMBER_WORDS


# --- numbers ----------------------------------------------------------------------------------------------------

_NUMBER_WORDS = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17,
    "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
    "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000, "dozen": 12, "third": 3, "fourth": 4, "fifth": 5,
    "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10,
}
"""Number words read as numbers ("one" and "first" are not: "one of the", "the first to" rarely count anything)."""
_SCALE = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}


def _value(text: str) -> float | None:
    t = re.sub(r"(?<=\d)(?:st|nd|rd|th|s)$", "", text.lower())
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", t):
        t = t.replace(",", "")  # 13,200
    elif re.fullmatch(r"\d+,\d{1,2}", t):
        t = t.replace(",", ".")  # 2,5 (a decimal comma)
    try:
        return float(t)
    except ValueError:
        return None


def _fmt(v: float) -> str:
    return str(int(v)) if v == int(v) else f"{v:g}"


def numbers(toks: Sequence[Token]) -> list[tuple[str, float | tuple[float, float], float | None]]:
    """The numbers `toks` state: (as written, value or a decade's range, the value before a scale word: 1.65 of
    "1.65 billion"). Digits, number words ("eighty", "two hundred") and ordinals ("3rd", "fifth") count."""
    out: list[tuple[str, float | tuple[float, float], float | None]] = []
    for i, tok in enumerate(toks):
        value: float | None = None
        if tok.number:
            if re.fullmatch(r"\d{3}0s", tok.low):
                out.append((tok.low, (float(tok.low[:4]), float(tok.low[:4]) + 9), None))
                continue
            value = _value(tok.low)
        elif tok.low in _NUMBER_WORDS:
            if tok.low == "hundred" and i and toks[i - 1].low in _NUMBER_WORDS:
                continue  # "two hundred": read at "two"
            value = float(_NUMBER_WORDS[tok.low])
            if i + 1 < len(toks) and toks[i + 1].low == "hundred":
                value *= 100
        if value is None:
            continue
        base = None
        if i + 1 < len(toks) and toks[i + 1].low in _SCALE:
            base, value = value, value * _SCALE[toks[i + 1].low]
        out.append((tok.text, value, base))
    return out


def passage_numbers(toks: Sequence[Token]) -> frozenset[float]:
    """Every value the passage states (a scaled one also as written: "1.65 billion" gives 1.65 and 1.65e9; a decade
    gives its first year)."""
    values: set[float] = set()
    for _, v, base in numbers(toks):
        values.add(v[0] if isinstance(v, tuple) else v)
        if base is not None:
            values.add(base)
    return frozenset(values)


def number_veto(claim: Sequence[Token], passage: frozenset[float]) -> Veto | None:
    """Every number of the claim (digits, number words, a decade) must be one the passage states: one digit differs
    and the fact differs ("2 minutes" against "20 minutes")."""
    missing = []
    for text, v, _ in numbers(claim):
        ok = any(v[0] <= p <= v[1] for p in passage) if isinstance(v, tuple) else v in passage
        if not ok and text not in missing:
            missing.append(text)
    if not missing:
        return None
    said = ", ".join(_fmt(p) for p in sorted(passage)[:8])
    detail = f"{', '.join(missing)}: not a number the passage states" + (f" (it states {said})" if said else "")
    return Veto("number", detail, frozenset(f"number:{m}" for m in missing))


# --- names and occupations ----------------------------------------------------------------------------------------

_DEMONYMS = {
    "english": "england", "french": "france", "chinese": "china", "spanish": "spain", "italian": "italy",
    "dutch": "netherlands", "swiss": "switzerland", "irish": "ireland", "welsh": "wales", "scottish": "scotland",
    "scots": "scotland", "danish": "denmark", "swedish": "sweden", "norwegian": "norway", "finnish": "finland",
    "polish": "poland", "greek": "greece", "turkish": "turkey", "british": "britain", "flemish": "flanders",
    "icelandic": "iceland", "portuguese": "portugal", "peruvian": "peru", "filipino": "philippines",
    "us": "united states", "usa": "united states", "american": "united states", "uk": "united kingdom",
}

OCCUPATIONS = frozenset("""
actor actress singer songwriter painter sculptor photographer director producer screenwriter writer novelist poet
playwright journalist composer musician pianist guitarist drummer rapper dancer architect engineer physicist chemist
biologist mathematician astronomer economist philosopher historian politician lawyer judge physician surgeon nurse
teacher professor scientist inventor explorer soldier admiral priest bishop monk friar nun footballer cricketer
athlete boxer wrestler swimmer cyclist comedian businessman businesswoman entrepreneur banker farmer designer
illustrator cartoonist editor publisher critic translator theologian psychologist sociologist geologist botanist
zoologist linguist diplomat activist missionary pilot astronaut chef animator conductor violinist cellist
""".split())
"""Nouns naming what a person does: a claim's occupation the passage's sentences about the person lack, where they name
another, describes someone else ("a photographer" against "a film director")."""


def _attested(word: str, passage_stems: frozenset[str], passage_low: str, passage_words: frozenset[str]) -> bool:
    """Whether the passage names `word`: the same stem, one word the prefix of the other ("Peru" ~ "Peruvian"), the
    same letters inside a longer written form ("YouTube" in "youtube.com"), or its country ("English" ~ "England")."""
    low = fold(word.lower().replace("\u2019", "'").removesuffix("'s"))
    if stem(low) in passage_stems or low in passage_low:
        return True
    if len(low) >= 4 and any(len(w) >= 4 and (w.startswith(low) or low.startswith(w)) for w in passage_words):
        return True
    country = _DEMONYMS.get(low)
    if country and country in passage_low:
        return True
    return any(d in passage_words for d, c in _DEMONYMS.items() if c == low)


def name_veto(claim: Sequence[Token], facts: PassageFacts) -> Veto | None:
    """A person, place or title (a capitalised word, not a function word) that the passage never names: the claim
    is about something the passage does not mention ("Hamlet was written by Christopher Marlowe" against a passage
    naming Shakespeare)."""
    missing = []
    for tok in claim:
        if _is_name(tok) and not _attested(tok.text, facts.stems, facts.low, facts.words):
            if tok.text not in missing:
                missing.append(tok.text)
    if not missing:
        return None
    return Veto("entity", f"{', '.join(missing)} is not named in the passage",
                frozenset(f"name:{m.lower()}" for m in missing))


def occupation_veto(claim: Sequence[Token], facts: PassageFacts) -> Veto | None:
    """The claim gives someone an occupation that the passage's sentences about them do not, where they give
    another ("an English poet" against "an English mathematician and writer … the only child of the poet Byron")."""
    claimed = {t.low for t in claim if t.low in OCCUPATIONS}
    if not claimed:
        return None
    about = {t.low for sentence in facts.aligned(claim) for t in sentence if t.low in OCCUPATIONS}
    if claimed & about or not about:
        return None
    other = sorted(about)
    return Veto("entity", f"the claim says {', '.join(sorted(claimed))} where the passage says {', '.join(other)}")


_LINKERS = frozenset("in at of on from to by the a an near into".split())
_SLOT_WINDOW = 10


def _name_run(toks: Sequence[Token], i: int) -> tuple[int, int]:
    """The run of names starting at i (with "of", "de", "van" inside a name)."""
    j = i
    while j < len(toks) and (_is_name(toks[j]) or (toks[j].low in ("of", "de", "van", "von", "da", "del", "la")
                                                    and j + 1 < len(toks) and _is_name(toks[j + 1]) and j > i)):
        j += 1
    return i, j


def slot_veto(claim: Sequence[Token], facts: PassageFacts) -> Veto | None:
    """Another name in the same slot: the claim's "born in Munich" against the passage's "born in Ulm". The slot is
    the word before the name and the small words between ("born" + "in"); the passage must fill the same slot with a
    name, and not name the claim's one within a few words of it (an apposition: "born in Ulm, in Württemberg")."""
    p = facts.tokens
    for i, tok in enumerate(claim):
        if not _is_name(tok) or (i and _is_name(claim[i - 1])):
            continue
        k = i - 1
        linkers: list[str] = []
        while k >= 0 and claim[k].low in _LINKERS and len(linkers) < 2:
            linkers.insert(0, claim[k].low)
            k -= 1
        if k < 0 or not linkers or not _content(claim[k]) or claim[k].cap:
            continue
        anchor = claim[k].stem
        _, end = _name_run(claim, i)
        mine = {t.stem for t in claim[i:end] if _is_name(t)}
        for a in facts.positions.get(anchor, ()):
            j = a + 1
            if [t.low for t in p[j: j + len(linkers)]] != linkers:
                continue
            j += len(linkers)
            if j < len(p) - 1 and p[j].low == "the" and "the" not in linkers:  # "by France" against "by the US"
                j += 1
            if j >= len(p) or not _is_name(p[j]):
                continue
            window = {t.stem for t in p[j: j + _SLOT_WINDOW] if not t.boundary}
            if mine & window:
                continue
            _, pend = _name_run(p, j)
            theirs = " ".join(t.text for t in p[j:pend])
            said = " ".join(t.text for t in claim[i:end])
            return Veto("entity", f"the claim has {said} where the passage has {theirs} "
                                  f"(\"{claim[k].text} {' '.join(linkers)} …\")")
    return None


# --- negation -----------------------------------------------------------------------------------------------------

_CUES = frozenset("not never no none neither nor nobody nothing nowhere cannot without unable spared avoided escaped "
                  "prevented refused".split())
"""Words that deny what follows ("spared from bombing" denies a bombing as "not bombed" does)."""
_CLAUSE_WORDS = frozenset("but while whereas although though however because who which and".split())


def _cue(toks: Sequence[Token], i: int) -> bool:
    """Whether token i negates what follows ("not", "never", "n't", "no longer", "failed to", "lacks"; "No." and
    "no" before a number are not)."""
    t = toks[i]
    if t.low.endswith("n't"):
        return True
    if t.low in ("fail", "failed", "fails") and i + 1 < len(toks) and toks[i + 1].low == "to":
        return True
    if t.low in ("lack", "lacks", "lacked", "lacking"):
        return True
    if t.low == "no" and i + 1 < len(toks) and (toks[i + 1].number or toks[i + 1].text == "."):
        return False
    return t.low in _CUES


def _clauses(toks: Sequence[Token]) -> list[tuple[int, int]]:
    """(start, end) of each clause: cut at punctuation and at clause words ("but", "which", "and" …)."""
    out, start = [], 0
    for i, t in enumerate(toks):
        if t.boundary or t.low in _CLAUSE_WORDS:
            if i > start:
                out.append((start, i))
            start = i + 1
    if start < len(toks):
        out.append((start, len(toks)))
    return out


def _scope(toks: Sequence[Token], i: int, end: int, width: int, lemmas: bool = False) -> list[str]:
    """The stems (or lemmas) a cue at i negates: the next `width` content words (or numbers) before the clause ends,
    auxiliaries skipped ("was not born" → born)."""
    out: list[str] = []
    for t in toks[i + 1: end]:
        if len(out) >= width:
            break
        if t.low in ("longer",) and toks[i].low == "no":
            continue
        if t.number or (_content(t) and t.low not in _SKIP_AFTER_CUE):
            out.append(t.lemma if lemmas else t.stem)
    return out


@dataclass(frozen=True, slots=True)
class Negations:
    """The negated words of a text: `first` the word right after each cue (what is denied), `clauses` the stems
    of each clause holding a cue."""

    first: frozenset[str]  # lemmas
    near: frozenset[str]  # stems of the first three words after each cue
    clauses: tuple[frozenset[str], ...]  # stems
    plain: frozenset[str]  # lemmas that occur at least once outside the first word after a cue (and not in a name)


def negations(toks: Sequence[Token]) -> Negations:
    """What `toks` deny: the word each negation cue denies, the clauses that hold a cue (or a privative word such as
    "wingless"), and the words the text also states without a denial."""
    first: set[str] = set()
    near: set[str] = set()
    clauses: list[frozenset[str]] = []
    negated_positions: set[int] = set()
    for start, end in _clauses(toks):
        has = False
        for i in range(start, end):
            if _cue(toks, i):
                has = True
                scope = _scope(toks, i, end, 1)
                first.update(_scope(toks, i, end, 1, lemmas=True))
                near.update(_scope(toks, i, end, 3))
                for j in range(i + 1, end):  # where the first scope word sits
                    if scope and toks[j].stem == scope[0]:
                        negated_positions.add(j)
                        break
        privative = {stem(t.low[:-4]) for t in toks[start:end] if _privative(t)}  # "some are wingless": no wings
        if has or privative:
            clauses.append(frozenset(t.stem for t in toks[start:end] if _content(t) or t.number) | privative)
    plain = frozenset(t.lemma for j, t in enumerate(toks)  # "the Rio Negro Bridge" asserts no bridge
                      if j not in negated_positions and (_content(t) or t.number) and not (t.cap and not t.initial))
    return Negations(frozenset(first), frozenset(near), tuple(clauses), plain)


def _privative(tok: Token) -> bool:
    """A word that denies what it is made of: "wingless", "flightless", "harmless"."""
    return len(tok.low) > 6 and tok.low.endswith("less") and tok.low not in ("nevertheless", "regardless",
                                                                             "nonetheless", "unless")


def negation_veto(claim: Sequence[Token], facts: PassageFacts) -> Veto | None:
    """Negation and its absence. A claim that denies something ("was not born in 1950") is contradicted by a
    passage that states it and denies nothing about it; a claim that states something ("Penguins can fly") is
    contradicted by a passage that mentions it only to deny it ("They cannot fly")."""
    mine = negations(claim)
    claim_stems = {t.stem for t in claim if _content(t) or t.number}
    if mine.clauses:
        denied = mine.near & facts.stems
        shares = any(c & claim_stems for c in facts.negations.clauses)
        if denied and not shares:
            return Veto("negation", f"the claim denies what the passage states ({', '.join(sorted(denied))})")
    positive = {t.lemma for t in claim if _content(t) and t.stem not in mine.near} - mine.first
    only_denied = {w for w in positive & facts.negations.first if w not in facts.negations.plain}
    if only_denied:
        return Veto("negation", f"the passage denies it ({', '.join(sorted(only_denied))})")
    return None


# --- roles ------------------------------------------------------------------------------------------------------

_SYMMETRIC = frozenset(stem(w) for w in "married marry met meet partnered collaborated played drew tied wed dated "
                                        "divorced merged bordered fought faced joined".split())


_PAST = frozenset(w for w in _IRREGULAR if w not in ("children", "men", "women", "people", "dies", "dying", "flies",
                                                     "won't", "lay"))


def _is_pivot(tok: Token) -> bool:
    """A verb the roles hang on: a lower-case word ending in -ed, a participle in -ing, or an irregular past form
    ("won", "beat", "sold")."""
    if tok.cap or not _content(tok):
        return False
    return tok.low.endswith("ed") or tok.low in _PAST or tok.low == "beat" or (tok.low.endswith("ing")
                                                                                and len(tok.low) > 5)


_PREPOSITIONS = frozenset("after before in on at of since during under over through across into onto near".split())
"""Prepositions that open a setting (time, place), not a party to the act: "fell after the fall of Rome" has no
object, "worked for Edison" has one."""


def _nearest_names(toks: Sequence[Token], i: int, step: int, limit: int = 8) -> frozenset[str]:
    """The stems of the nearest run of names before (step -1) or after (step 1) position i, within its clause
    (a comma ends it) and, after the verb, before any preposition ("fell sharply after the fall of Rome": no object)."""
    j, seen = i + step, 0
    while 0 <= j < len(toks) and seen < limit:
        if toks[j].boundary or toks[j].low in ("which", "who", "whom", "whose"):
            return frozenset()
        if step > 0 and toks[j].low in _PREPOSITIONS:
            return frozenset()
        if _is_name(toks[j]):
            run = []
            while 0 <= j < len(toks) and _is_name(toks[j]):
                run.append(toks[j].stem)
                j += step
            return frozenset(run)
        j += step
        seen += 1
    return frozenset()


_SAME_VERB = {stem(w): stem(c) for c, ws in {
    "defeated": "beat beaten defeated overcame overcome bested", "acquired": "bought acquired purchased",
    "succeeded": "succeeded replaced", "founded": "founded established",
}.items() for w in ws.split()}
"""Verbs that name the same act, so that "Deep Blue was beaten by Kasparov" meets "Deep Blue defeated Kasparov"."""

Roles = dict[str, list[tuple[frozenset[str], frozenset[str], frozenset[str]]]]


def _recipient(toks: Sequence[Token], i: int) -> frozenset[str]:
    """The names after "to", "from" or "into" that follow the patient of the verb at i ("sold Ruth to the Yankees")."""
    j, seen = i + 1, 0
    while j < len(toks) and seen < 8 and not toks[j].boundary:
        if toks[j].low in ("to", "from", "into") and j > i + 1 and any(_is_name(t) for t in toks[i + 1: j]):
            return _nearest_names(toks, j, 1, 3)
        j += 1
        seen += 1
    return frozenset()


def _by(toks: Sequence[Token], i: int) -> int | None:
    """Where the "by" of a passive verb at i is: right after it, or later in the clause after a form of "be"."""
    be = any(t.low in _BE for t in toks[max(0, i - 2): i])
    for j in range(i + 1, min(len(toks), i + (10 if be else 3))):
        if toks[j].boundary:
            return None
        if toks[j].low == "by":
            return j
    return None


def roles(toks: Sequence[Token]) -> Roles:
    """Who did what to whom: per verb (its stem, or the stem of a verb naming the same act), (agent names, patient
    names, recipient names) at each place it occurs. A passive ("was defeated by X") puts X as the agent."""
    out: Roles = {}
    for i, tok in enumerate(toks):
        if not _is_pivot(tok) or tok.stem in _SYMMETRIC:
            continue
        left, right = _nearest_names(toks, i, -1), _nearest_names(toks, i, 1)
        # "was defeated by X", "was launched into orbit in 1990 by X", and the reduced relative "a play written by
        # X": a participle before "by", or after a form of "be" with "by" later in the clause, is passive
        by = _by(toks, i)
        passive = not tok.low.endswith("ing") and by is not None
        recipient = frozenset() if passive else _recipient(toks, i)
        if passive and by is not None:
            left, right = _nearest_names(toks, by, 1), _nearest_names(toks, i, -1)
        if left or right:
            out.setdefault(_SAME_VERB.get(tok.stem, tok.stem), []).append((left, right, recipient))
    return out


def role_veto(claim: Sequence[Token], facts: PassageFacts) -> Veto | None:
    """Agent and patient swapped: "Federer defeated Nadal" against "Nadal defeated Federer" (active or passive on
    either side). The same verb must appear in both, with a name of the claim on the other side of it in the passage
    and none on the same side."""
    for verb, places in roles(claim).items():
        for agent, patient, recipient in places:
            if not (agent and (patient or recipient)):
                continue  # one side unknown ("a game developed by…"): nothing to compare
            own, others = agent - patient - recipient, (patient | recipient) - agent  # "Berlin" of "East Berlin"
            for p_agent, p_patient, p_recipient in facts.roles.get(verb, ()):
                if own & p_agent:
                    continue
                if (own & (p_patient | p_recipient)) or (others & p_agent):
                    return Veto("role", f"who did what to whom is swapped (\"{verb}…\")")
    return None


# --- antonyms and quantifiers ---------------------------------------------------------------------------------------

_PAIRS = (
    ("increase increased increases increasing rise rises rose risen rising grow grows grew grown growing expand "
     "expanded expands expanding gain gained gains climb climbed climbs soar soared",
     "decrease decreased decreases decreasing fall falls fell fallen falling decline declined declines declining "
     "drop dropped drops shrink shrank shrunk shrinks shrinking contract contracted reduce reduced reduces"),
    ("before earlier prior preceded precedes preceding predecessor",
     "after later following followed follows successor"),
    ("north northern northward northwards", "south southern southward southwards"),
    ("east eastern eastward eastwards", "west western westward westwards"),
    ("largest biggest", "smallest"), ("larger bigger", "smaller"), ("highest", "lowest"), ("higher", "lower"),
    ("heavier heaviest", "lighter lightest"), ("faster fastest", "slower slowest"),
    ("longer longest", "shorter shortest"), ("wider widest", "narrower narrowest"), ("deeper deepest", "shallower"),
    ("maximum", "minimum"), ("most", "least"), ("more", "less fewer"), ("oldest", "youngest newest"),
    ("older", "younger newer"), ("earliest", "latest"), ("first", "last"), ("above", "below"), ("upper", "lower"),
    ("inside", "outside"), ("import imports imported", "export exports exported"),
    ("win wins won winning victory victorious", "lose loses lost losing loss defeat"), ("born", "died"),
    ("legal", "illegal"), ("public", "private"), ("male", "female"),
    ("hot hotter hottest warm warmer warmest", "cold colder coldest cool cooler coolest"),
    ("wet wetter", "dry drier"), ("accepted accept accepts", "rejected reject rejects"),
    ("allowed allow allows permitted", "banned ban bans forbade forbidden prohibited"), ("supported", "opposed"),
    ("included", "excluded"), ("success successful", "failure unsuccessful"),
    ("mother father parent parents", "daughter son child children"), ("ancient", "modern"), ("rural", "urban"),
    ("strong stronger", "weak weaker"), ("rich richer", "poor poorer"), ("same", "opposite"),
)
_OPPOSITES: tuple[tuple[frozenset[str], frozenset[str]], ...] = (
    *((frozenset(a.split()), frozenset(b.split())) for a, b in _PAIRS),
    *((frozenset(b.split()), frozenset(a.split())) for a, b in _PAIRS),
    (frozenset({"still"}), frozenset({"no longer"})),  # "still" against "no longer"
)
"""Words that say opposite things of the same subject, as (the claim's side, the passage's side)."""


_CHANGE = frozenset(_PAIRS[0][0].split()) | frozenset(_PAIRS[0][1].split())


def _predicates(toks: Sequence[Token]) -> set[str]:
    """The lower-case words that can carry a predicate: not inside a name ("North Sea"), not an event noun ("the fall
    of Rome")."""
    out = set()
    for i, t in enumerate(toks):
        if t.boundary or (t.cap and not t.initial):
            continue
        if t.low in _CHANGE and i and toks[i - 1].low in ("the", "a", "an", "its", "his", "her", "their") \
                and i + 1 < len(toks) and toks[i + 1].low == "of":
            continue
        out.add(t.low)
    return out


def antonym_veto(claim: Sequence[Token], facts: PassageFacts) -> Veto | None:
    """An antonym of the claim's predicate: the claim says a word of one side, the passage (in the sentences that
    share the claim's words) a word of the other, and neither text has the first side's word. Words inside a name
    ("North Sea") and event nouns ("the fall of") are not predicates."""
    claim_words = _predicates(claim) | {lemma(w) for w in _predicates(claim)}
    denied = negations(claim).first
    aligned = {w for s in facts.aligned(claim) for w in _predicates(s)}
    aligned |= {lemma(w) for w in aligned}
    passage_words = _predicates(facts.tokens)
    passage_words |= {lemma(w) for w in passage_words}
    for w in claim_words:  # "denser" against "less dense"
        if len(w) > 5 and w.endswith("er"):
            if any(f"less {b}" in facts.low for b in (w[:-2], w[:-1], w[:-3])) and w not in passage_words:
                return Veto("antonym", f"the claim says {w} where the passage says less")
    for one, other in _OPPOSITES:
        said = claim_words & one
        if not said or any(stem(w) in denied for w in said) or claim_words & other:
            continue
        against = (aligned | ({"no longer"} if "no longer" in facts.low else set())) & other
        if against and not passage_words & one:
            return Veto("antonym", f"the claim says {', '.join(sorted(said))} where the passage says "
                                   f"{', '.join(sorted(against))}")
    return None


_QUANTIFIERS: dict[str, frozenset[str]] = {
    "all": frozenset("all every each always everyone everything everybody entire entirely universally".split()),
    "none": frozenset("none never nobody nothing neither".split()),
    "most": frozenset("most majority mostly largely".split()),
    "some": frozenset("some several many few certain sometimes often occasionally part partly partially half "
                      "minority".split()),
    "only": frozenset("only sole solely exclusively".split()),
}


def quantifier_classes(toks: Sequence[Token]) -> set[str]:
    """Which quantifiers a text uses: all, none, most, some (also "six of the"), only."""
    words = [t.low for t in toks]
    out = {q for q, ws in _QUANTIFIERS.items() if ws & set(words)}
    for i, w in enumerate(words[:-2]):
        if (toks[i].number or w in _NUMBER_WORDS) and words[i + 1] == "of" and words[i + 2] in ("the", "its", "their"):
            out.add("some")
    starts = {0} | {i + 1 for i, t in enumerate(toks) if t.boundary or t.low in _CLAUSE_WORDS}
    if any(t.low == "no" and i in starts and i + 1 < len(toks) and _content(toks[i + 1]) for i, t in enumerate(toks)):
        out.add("none")  # "No bridge spans …", not "… have no wings"
    return out


def _generic(claim: Sequence[Token], sentences: Iterable[Sequence[Token]]) -> bool:
    """Whether a passage sentence opens on the bare plural the claim quantifies ("Every insect has six legs"
    against "Insects have six legs": a generic plural says all)."""
    words = [t for t in claim if _content(t) and t.low not in _QUANTIFIERS["all"]]
    if not words or not words[0].text[0].islower():
        return False  # "Venus always …": a name, not a kind
    return any(s and s[0].stem == words[0].stem and s[0].low.endswith("s") for s in sentences)


def _after_only(toks: Sequence[Token]) -> set[str]:
    """What "only" is said of: the content words in the four words after it ("only a few spider species")."""
    return {n.stem for i, t in enumerate(toks) if t.low == "only" for n in toks[i + 1: i + 5] if _content(n)}


def quantifier_veto(claim: Sequence[Token], facts: PassageFacts) -> Veto | None:
    """Quantifiers: a claim saying all, or only, needs a passage saying so (of the same thing); a claim saying
    none or most is contradicted by a passage saying another quantity of the same thing ("None of the moons …"
    against "some of the moons …")."""
    mine = quantifier_classes(claim)
    theirs = facts.aligned_quantifiers(claim)
    best = facts.aligned(claim, slack=0)
    if "all" in mine and "all" not in theirs:
        contrary = theirs & {"some", "most", "none"}
        if contrary:
            return Veto("quantifier", f"the claim says all, the passage says {', '.join(sorted(contrary))}")
        if not _generic(claim, best):
            return Veto("quantifier", "the claim says all, the passage does not", frozenset({"quantifier:all"}))
    if "only" in mine:
        if "only" not in facts.quantifiers:
            return Veto("quantifier", "the claim says only, the passage does not", frozenset({"quantifier:only"}))
        if not _after_only(claim) & facts.after_only:
            return Veto("quantifier", "the claim says only of something else than the passage")
    for q in ("none", "most"):
        if q in mine and q not in theirs and theirs - {q}:
            return Veto("quantifier", f"the claim says {q}, the passage says {', '.join(sorted(theirs))}")
    return None


# --- sentences about the source -------------------------------------------------------------------------------------

_SOURCE = (r"(?:source|sources|passage|passages|article|articles|document|documents|snippet|snippets|text|texts|"
           r"reference|references|results?|entry|entries|page|pages|excerpt|extract|website|link|citation)")
_META_VERB = (r"(?:answers?|describes?|discuss(?:es)?|mentions?|explains?|covers?|provides?|gives?|contains?|"
              r"address(?:es)?|confirms?|(?:is|are) (?:about|relevant)|talks? about|deals? with|focus(?:es)? on|"
              r"relates? to|refers? to|lists?|shows?|supports?|indicates?|offers?|presents?|has information)")
_META = (
    re.compile(rf"^\W*(?:this|the|that|these|those|our|each|both|another|above|first|second|cited|\w+ed)\s+"
               rf"(?:\w+\s+){{0,2}}?{_SOURCE}\s+(?:\w+ly\s+)?{_META_VERB}\b(?!\s*(?:that|,))", re.IGNORECASE),
    re.compile(r"\b(?:the|this|your|that)\s+question\b|\bwhat the question asks\b|\basks? about\b", re.IGNORECASE),
    re.compile(rf"\b(?:is|are) (?:covered|answered|described|discussed|explained|addressed) (?:in|by)\b|"
               rf"\b(?:more )?(?:details?|information) (?:can be|is|are) (?:found|available)\b|"
               rf"\bcan be found (?:in|at|on)\b|\bsee (?:the|this) {_SOURCE}\b|^\W*step \d", re.IGNORECASE),
)


def meta_veto(claim_text: str) -> Veto | None:
    """A sentence about the source itself rather than the world ("This source answers the question …", "X gives
    what the question asks about"): no passage supports it, because it claims nothing a passage could state. An
    attribution ("According to the source, …", "The article notes that …") is not one: the rest is checked."""
    for pattern in _META:
        if pattern.search(claim_text):
            return Veto("meta", "the sentence is about the source, not about the world")
    return None


# --- a passage, read once -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PassageFacts:
    """What the rules read of one passage (its title and text), computed once per passage."""

    tokens: tuple[Token, ...]
    sentences: tuple[tuple[Token, ...], ...]
    stems: frozenset[str]
    words: frozenset[str]  # lower-case words
    low: str  # the whole passage in lower case
    numbers: frozenset[float]
    positions: dict[str, tuple[int, ...]]  # stem → where it occurs
    negations: Negations
    roles: Roles
    quantifiers: frozenset[str]
    after_only: frozenset[str]

    def aligned(self, claim: Sequence[Token], slack: int = 1) -> list[tuple[Token, ...]]:
        """The passage's sentences that share the most content words with the claim (at least one; with `slack`,
        also those sharing that many fewer)."""
        mine = {t.stem for t in claim if _content(t)}
        shared = [len(mine & {t.stem for t in s if _content(t)}) for s in self.sentences]
        best = max(shared, default=0)
        return [s for s, n in zip(self.sentences, shared, strict=True) if n and n >= best - slack]

    def aligned_quantifiers(self, claim: Sequence[Token]) -> set[str]:
        """The quantifiers of the sentences that talk about what the claim talks about."""
        return set().union(*(quantifier_classes(s) for s in self.aligned(claim)))


def _sentences(toks: Sequence[Token]) -> tuple[tuple[Token, ...], ...]:
    out, start = [], 0
    for i, t in enumerate(toks):
        if t.text in (".", ";"):
            if i > start:
                out.append(tuple(toks[start:i]))
            start = i + 1
    if start < len(toks):
        out.append(tuple(toks[start:]))
    return tuple(out)


def passage_facts(title: str, text: str) -> PassageFacts:
    """Read a passage once for every claim it is checked against (the title is a sentence of its own)."""
    body = plain(f"{title}. {text}")
    toks = tokens(body)
    positions: dict[str, list[int]] = {}
    for i, t in enumerate(toks):
        positions.setdefault(t.stem, []).append(i)
    low = fold(body.lower())
    return PassageFacts(
        tokens=toks, sentences=_sentences(toks),
        stems=frozenset(t.stem for t in toks if not t.boundary),
        words=frozenset(fold(t.low) for t in toks if not t.boundary), low=low,
        numbers=passage_numbers(toks),
        positions={k: tuple(v) for k, v in positions.items()}, negations=negations(toks), roles=roles(toks),
        quantifiers=frozenset(quantifier_classes(toks)), after_only=frozenset(_after_only(toks)))


@dataclass(frozen=True, slots=True)
class ClaimFacts:
    """A claim, read once: its text as a reader sees it and its tokens."""

    text: str
    tokens: tuple[Token, ...]
    meta: Veto | None


_COVERED = re.compile(r"^\W*(?:step \d+ is (?:covered|answered) by|from)\b[^:]{0,120}:\s*", re.IGNORECASE)


def claim_facts(claim: str) -> ClaimFacts:
    """Read a claim once. A plan's pointer before a colon ("Step 2 is covered by (Rodionov): Rodionov Publishing
    House is …") is dropped and what follows is checked; a leaked "None" before the first name is dropped too."""
    text = plain(claim)
    rest = _COVERED.sub("", text)
    if rest != text and len(re.findall(r"[^\W\d_]{3,}", rest)) >= 3:
        text = rest
    text = re.sub(r"^None\s+(?=[A-Z])", "", text)
    return ClaimFacts(text, tokens(without_attribution(text)), meta_veto(text))


_ATTRIBUTION = re.compile(
    rf"\baccording to [^,.;]{{0,80}}|"
    rf"\b(?:as )?(?:the|this|that|a) (?:\w+ )?{_SOURCE} (?:states?|says?|notes?|reports?|explains?|mentions?|"
    rf"describes?|shows?|confirms?|writes?)(?: that)?\b", re.IGNORECASE)


def without_attribution(text: str) -> str:
    """The claim without its attribution to a source ("According to the source, …", "…, the article notes,"):
    the source's name there is not a fact the passage must state."""
    return _ATTRIBUTION.sub(" ", text)


def vetoes(claim: ClaimFacts, passage: PassageFacts) -> tuple[Veto, ...]:
    """Every veto of `passage` against `claim`, contradictions first; empty when none applies."""
    if claim.meta is not None:
        return (claim.meta,)
    toks = claim.tokens
    found: list[Veto] = []
    for rule in (negation_veto, role_veto, slot_veto, antonym_veto, occupation_veto, quantifier_veto):
        v = rule(toks, passage)
        if v is not None:
            found.append(v)
    for v in (number_veto(toks, passage.numbers), name_veto(toks, passage)):
        if v is not None:
            found.append(v)
    return tuple(sorted(found, key=lambda v: bool(v.missing)))


def is_contradiction(found: Iterable[Veto]) -> bool:
    """Whether any veto says the passage contradicts the claim (rather than not stating one of its facts)."""
    return any(not v.missing for v in found)
