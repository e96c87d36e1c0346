"""The held-out guard of the rubric bank (issue 62): nothing derived from a held-out question may enter the bank or
come out of it, whichever path it takes (the reflection writer, a curated experience item, a bank import, a bank
that was filled before the guard existed).

The held-out questions themselves live above this layer (`learning.eval.heldout`, shipped with the package); the
app hands the bank a guard built from them (`app.container.open_bank`). This module only knows how to compare.

Decisions (the issue names the paths, not the rule):
- An item is derived from a held-out question when its own question is one (after `normalize_question`), or when a
  held-out question appears whole, normalised, inside its question, rubrics or takeaways: an item reflected from
  another question can still quote a held-out one, and an imported file can say anything.
- Matching is exact after normalisation, never by embedding similarity: a near neighbour of a held-out question is
  a different question and may carry a useful strategy; the guard is there to stop leaks of the evaluation set, not
  to keep its topics out of memory.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from store.errors import InvalidInput
from store.records import BankItem

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00b4": "'", "`": "'"})
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"))


def normalize_question(text: str) -> str:
    """The form questions are compared in: NFKC, invisible characters dropped, quotes straightened, case-folded,
    whitespace collapsed, trailing punctuation dropped (so "…Faversham?" and "…faversham" match)."""
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE).translate(_QUOTES).casefold()
    return " ".join(text.split()).rstrip(" ?!.;:")


class HeldOutItemError(InvalidInput):
    """A bank item is derived from a held-out question; nothing was written."""

    def __init__(self, heldout_id: str, where: str) -> None:
        """Name the held-out question and where it was found."""
        super().__init__(
            f"refused: {where} is derived from held-out question {heldout_id}; held-out questions are for "
            "evaluation only and nothing derived from them may enter the rubric bank")
        self.heldout_id = heldout_id


@dataclass(frozen=True)
class HeldoutGuard:
    """The held-out questions, normalised, with their ids (`normalised question -> id`)."""

    index: Mapping[str, str]

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]]) -> HeldoutGuard:
        """A guard from (held-out id, question) pairs."""
        return cls({normalize_question(q): i for i, q in pairs if normalize_question(q)})

    def question_id(self, question: str) -> str | None:
        """The held-out id of `question`, or None."""
        return self.index.get(normalize_question(question))

    def item_id(self, item: BankItem) -> str | None:
        """The held-out id an item is derived from (its question, or a held-out question quoted in its text)."""
        found = self.question_id(item.question)
        if found is not None:
            return found
        text = normalize_question(f"{item.question}\n{item.rubrics}\n{item.takeaways}")
        return next((i for q, i in self.index.items() if q in text), None)

    def refuse(self, item: BankItem, where: str | None = None) -> None:
        """Raise `HeldOutItemError` naming the held-out id when `item` is derived from a held-out question."""
        found = self.item_id(item)
        if found is not None:
            raise HeldOutItemError(found, where or f"bank item {item.id}")
