"""The citation check's vetoes (issue 64) with the real offline MiniLM: a passage that contradicts a claim never
supports it, whatever its topic similarity. Each veto has hand examples here, and the adversarial sets are scored
per split and per veto through `check_support`, as a report is checked.

The sets (tests/agent/data/support_adversarial*.jsonl) were written in turn: `dev` and `test` before any veto
existed; `heldout` after the first version was scored on those; `heldout2` after the second was scored on
`heldout`. Each was scored once with the rules frozen, then used for tuning, so every figure these tests assert is
in-sample: they guard against regressions. The out-of-sample figures are the ones taken at each freeze."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import pytest

from agent.support import ClaimSupport, check_support
from store.embeddings import embed_texts
from store.records import Snippet

DATA = Path(__file__).parent / "data"
SETS = ("support_adversarial.jsonl", "support_adversarial_heldout.jsonl", "support_adversarial_heldout2.jsonl")
SPLITS = ("dev", "test", "heldout", "heldout2")
VETOES = ("negation", "number", "role", "entity", "antonym", "quantifier", "meta")


def _rows() -> list[dict[str, str]]:
    return [r for name in SETS for r in map(json.loads, (DATA / name).read_text(encoding="utf-8").splitlines())
            if "_comment" not in r]


def _cited(claim: str) -> str:
    """The claim as a report sentence citing reference 1."""
    return f"{claim[:-1]} [1]." if claim.endswith(".") else f"{claim} [1]"


@cache
def _check(claim: str, title: str, passage: str) -> ClaimSupport:
    """The check of one claim citing one passage (the only one retrieved)."""
    sn = Snippet(id="p1-0", tool="local_search", title=title, text=passage)
    (found,) = check_support(_cited(claim), (sn,), (sn,), embed_texts).check.claims
    return found


def _accepted(claim: str, title: str, passage: str) -> bool:
    return _check(claim, title, passage).status == "supported"


def _figures(rows: Sequence[dict[str, str]]) -> tuple[int, int, int, int]:
    """(false claims, false accepted, true claims, true dropped)."""
    false = [r for r in rows if r["label"] == "unsupported"]
    true = [r for r in rows if r["label"] == "supported"]
    accepted = sum(_accepted(r["claim"], r["title"], r["passage"]) for r in false)
    dropped = sum(not _accepted(r["claim"], r["title"], r["passage"]) for r in true)
    return len(false), accepted, len(true), dropped


def test_the_adversarial_sets_have_five_false_claims_per_veto_in_each_split_and_true_ones() -> None:
    rows = _rows()
    for split in SPLITS:
        for veto in VETOES:
            mine = [r for r in rows if r["split"] == split and r["veto"] == veto]
            assert sum(r["label"] == "unsupported" for r in mine) >= 5, (split, veto)
            assert sum(r["label"] == "supported" for r in mine) >= 3, (split, veto)


@pytest.mark.parametrize("split", SPLITS)
def test_on_the_adversarial_sets_at_most_a_tenth_of_false_claims_pass_and_of_true_ones_drop(split: str) -> None:
    false, accepted, true, dropped = _figures([r for r in _rows() if r["split"] == split])
    assert accepted <= 0.10 * false, f"{accepted} of {false} false claims accepted"
    assert dropped <= 0.10 * true, f"{dropped} of {true} true claims dropped"


@pytest.mark.parametrize("veto", VETOES)
def test_each_veto_catches_its_false_claims_and_keeps_its_true_ones(veto: str) -> None:
    """All splits together: at most a quarter of a kind's false claims pass (roles: 5 of 24 at the last freeze),
    at most 2 of its true ones drop."""
    false, accepted, true, dropped = _figures([r for r in _rows() if r["veto"] == veto])
    assert accepted <= 0.25 * false, f"{veto}: {accepted} of {false} false claims accepted"
    assert dropped <= 2, f"{veto}: {dropped} of {true} true claims dropped"


# --- each veto by hand: the issue's own examples ------------------------------------------------------------------

ROSS = ("Jane Ross", "Jane Ross (born 1950) is a Scottish chemist who studied in Edinburgh and later taught in Leeds.")


def test_negation_and_its_absence() -> None:
    assert _accepted("Jane Ross was born in 1950.", *ROSS)
    assert not _accepted("Jane Ross was not born in 1950.", *ROSS)
    assert not _accepted("Jane Ross never taught in Leeds.", *ROSS)
    assert _accepted("Penguins cannot fly.", "Penguin", "Penguins are flightless birds. They cannot fly.")
    assert not _accepted("Penguins can fly.", "Penguin", "Penguins are flightless birds. They cannot fly.")


def test_every_digit_of_a_number_counts() -> None:
    song = ("Echoes", "The song runs for 20 minutes on the album.")
    assert _accepted("The song runs for 20 minutes.", *song)
    assert not _accepted("The song runs for 2 minutes.", *song)
    assert not _accepted("The song runs for 200 minutes.", *song)
    assert not _accepted("Jane Ross was born in 1951.", *ROSS)
    assert not _accepted("The song runs for 20 minutes and has 3 verses.", *song)  # a number the passage lacks


def test_who_did_what_to_whom() -> None:
    final = ("Wimbledon 2008", "In the 2008 final Rafael Nadal defeated Roger Federer in five sets.")
    assert _accepted("Nadal defeated Federer in the 2008 final.", *final)
    assert _accepted("Federer was defeated by Nadal in the 2008 final.", *final)
    assert not _accepted("Federer defeated Nadal in the 2008 final.", *final)
    assert not _accepted("Nadal was defeated by Federer in the 2008 final.", *final)


def test_a_different_entity_in_the_same_slot() -> None:
    assert not _accepted("Jane Ross studied in Glasgow.", *ROSS)
    assert not _accepted("Jane Ross is an Irish chemist.", *ROSS)
    assert not _accepted("Jane Ross is a Scottish physicist.", *ROSS)
    assert _accepted("Jane Ross is a Scottish chemist.", *ROSS)


def test_antonyms_of_the_main_predicate() -> None:
    town = ("Ashby", "The population of Ashby decreased after the mine closed in 1970. The town lies north of Leeds.")
    assert _accepted("Ashby's population decreased after the mine closed.", *town)
    assert not _accepted("Ashby's population increased after the mine closed.", *town)
    assert not _accepted("Ashby's population decreased before the mine closed.", *town)
    assert not _accepted("Ashby lies south of Leeds.", *town)


def test_quantifiers() -> None:
    moons = ("Moons", "Some of the moons of Jupiter can be seen with binoculars.")
    assert _accepted("Some of Jupiter's moons can be seen with binoculars.", *moons)
    assert not _accepted("All of Jupiter's moons can be seen with binoculars.", *moons)
    assert not _accepted("None of Jupiter's moons can be seen with binoculars.", *moons)


def test_a_sentence_about_the_source_is_not_a_claim_it_supports() -> None:
    assert not _accepted("This source answers the question about Jane Ross.", *ROSS)
    assert not _accepted("The passage describes Jane Ross, a Scottish chemist.", *ROSS)
    assert _accepted("According to the source, Jane Ross is a Scottish chemist.", *ROSS)


def test_a_veto_says_why() -> None:
    found = _check("The song runs for 2 minutes.", "Echoes", "The song runs for 20 minutes on the album.")
    assert found.status == "unsupported" and "2" in found.veto and "number" in found.veto
