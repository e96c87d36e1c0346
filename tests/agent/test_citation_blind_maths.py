"""The maths of the blind citation calibration (tests/benchmarks/citation_blind.py, issue 64 item 3): Cohen's kappa,
Wilson intervals, the split and folds by question, the cross-validated threshold, and the check's decisions over
stored supports. Each is checked against values worked out by hand, so the published figures rest on tested code.
No model runs here: the decisions are `agent.support.decide` over hand-made supports."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "citation_blind.py"


@pytest.fixture(scope="module")
def cb() -> ModuleType:
    return load_script(SCRIPT)


# --- Cohen's kappa ----------------------------------------------------------------------------------------------------


def test_kappa_of_a_two_by_two_table_worked_by_hand(cb: ModuleType) -> None:
    # 50 pairs: both true 20, first true second false 5, first false second true 10, both false 15.
    # observed 35/50 = 0.7; chance 0.5 * 0.6 + 0.5 * 0.4 = 0.5; kappa (0.7 - 0.5) / (1 - 0.5) = 0.4.
    first = [True] * 20 + [True] * 5 + [False] * 10 + [False] * 15
    second = [True] * 20 + [False] * 5 + [True] * 10 + [False] * 15
    assert cb.cohen_kappa(first, second) == pytest.approx(0.4)


def test_kappa_edges(cb: ModuleType) -> None:
    assert cb.cohen_kappa([True, False, True], [True, False, True]) == pytest.approx(1.0)
    # Agreement exactly at chance: first half true, second labeller alternates. observed 0.5, chance 0.5.
    assert cb.cohen_kappa([True, True, False, False], [True, False, True, False]) == pytest.approx(0.0)
    assert cb.cohen_kappa([], []) is None
    assert cb.cohen_kappa([True, True], [True, True]) is None  # one label for everything: undefined
    with pytest.raises(ValueError):
        cb.cohen_kappa([True], [True, False])


def test_agreement_counts_only_pairs_both_labelled(cb: ModuleType) -> None:
    first = {"a": True, "b": False, "c": "unclear", "d": True, "e": False}
    second = {"a": True, "b": True, "c": False, "d": True, "x": False}
    got = cb.agreement(first, second)
    assert got["both_labelled"] == 4 and got["both_true_or_false"] == 3 and got["agree"] == 2
    assert got["table_first_second"] == {"True_True": 2, "True_False": 0, "False_True": 1, "False_False": 0}
    # a, d agree (true), b disagrees: observed 2/3; first true 2/3, second true 1: chance 2/3; kappa 0.
    assert got["kappa"] == pytest.approx(0.0)


# --- Wilson interval --------------------------------------------------------------------------------------------------


def test_wilson_interval_worked_by_hand(cb: ModuleType) -> None:
    # 5 of 10: centre stays 0.5; half-width 1.96 * sqrt(0.025 + 3.8415 / 400) / (1 + 0.38415) = 0.2634.
    lo, hi = cb.wilson(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    # 0 of 10: the lower end is 0 and the upper is z^2 / (n + z^2).
    z2 = cb.Z95**2
    assert cb.wilson(0, 10) == pytest.approx((0.0, z2 / (10 + z2)))
    # docs/citations.md: 2 of 26 true claims dropped, "7.7 % [2, 24]".
    lo, hi = cb.wilson(2, 26)
    assert (round(100 * lo), round(100 * hi)) == (2, 24)
    assert cb.wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        cb.wilson(3, 2)


# --- split and folds by question --------------------------------------------------------------------------------------


def test_split_is_by_group_disjoint_and_fixed(cb: ModuleType) -> None:
    groups = ["q3", "q1", "q2", "q1", "q5", "q4"]  # q1 twice: a question with two claims stays on one side
    cal, ev = cb.split_groups(groups, seed=7)
    assert cal.isdisjoint(ev) and cal | ev == {"q1", "q2", "q3", "q4", "q5"}
    assert (len(cal), len(ev)) == (2, 3)  # odd: the calibration half is the smaller
    assert cb.split_groups(reversed(groups), seed=7) == (cal, ev)  # the order they come in does not matter
    many = [f"q{i}" for i in range(40)]
    assert cb.split_groups(many, seed=1) != cb.split_groups(many, seed=2)


def test_folds_partition_the_groups(cb: ModuleType) -> None:
    folds = cb.kfold_groups([f"q{i}" for i in range(7)], k=3, seed=0)
    assert sorted(len(f) for f in folds) == [2, 2, 3]
    assert set().union(*folds) == {f"q{i}" for i in range(7)}
    assert sum(len(f) for f in folds) == 7  # each group in exactly one fold
    assert len(cb.kfold_groups(["a", "b"], k=5)) == 2  # never an empty fold
    with pytest.raises(ValueError):
        cb.kfold_groups(["a", "b"], k=1)


# --- rates, cross-validation, threshold -------------------------------------------------------------------------------


def _outcomes(cb: ModuleType, pairs: list[tuple[str, float, bool]], t: float) -> list[Any]:
    """A threshold rule on hand-made (group, support, label) pairs: accepted when the support reaches t."""
    return [cb.Outcome(g, s >= t, lab) for g, s, lab in pairs]


def test_rates_count_both_errors(cb: ModuleType) -> None:
    r = cb.rates([cb.Outcome("q", True, False), cb.Outcome("q", False, False), cb.Outcome("q", False, True),
                  cb.Outcome("q", True, True), cb.Outcome("q", True, True)])
    assert (r.false_accepts, r.negatives, r.false_drops, r.positives) == (1, 2, 1, 3)
    assert r.objective == pytest.approx(0.5)  # max(1/2, 1/3)
    d = r.as_dict()
    assert d["false_claims_accepted"]["rate"] == 0.5 and d["true_claims_dropped"]["of"] == 3
    assert cb.rates([]).objective is None


def test_cross_validated_threshold_worked_by_hand(cb: ModuleType) -> None:
    # Question A: a true pair at 0.60, a false one at 0.55. Question B: a true pair at 0.45, a false one at 0.30.
    pairs = [("A", 0.60, True), ("A", 0.55, False), ("B", 0.45, True), ("B", 0.30, False)]
    grid = (0.40, 0.50, 0.58, 0.65)
    folds = [frozenset({"A"}), frozenset({"B"})]
    cv = cb.cv_objective({t: _outcomes(cb, pairs, t) for t in grid}, folds)
    # 0.40: A accepts its false pair (1), B is right (0) -> 0.5.  0.50: A false accept (1), B drops its true (1) -> 1.
    # 0.58: A right (0), B drops (1) -> 0.5.  0.65: A drops (1), B drops (1) -> 1.
    assert cv == pytest.approx({0.40: 0.5, 0.50: 1.0, 0.58: 0.5, 0.65: 1.0})
    # 0.40 and 0.58 tie; 0.58 is nearer the shipped 0.5.
    assert cb.choose_threshold(cv, prefer=0.5) == 0.58
    assert cb.choose_threshold(cv, prefer=0.4) == 0.40


def test_threshold_ties_and_gaps(cb: ModuleType) -> None:
    assert cb.choose_threshold({0.4: 0.1, 0.6: 0.1}, prefer=0.5) == 0.4  # equally near: the lower
    assert cb.choose_threshold({0.4: 0.2, 0.6: 0.1, 0.7: None}, prefer=0.4) == 0.6  # lower objective first
    assert cb.choose_threshold({0.5: None}) is None
    # A fold with no labelled decision is left out of the mean, not counted as 0.
    cv = cb.cv_objective({0.5: [cb.Outcome("A", True, False)]}, [frozenset({"A"}), frozenset({"B"})])
    assert cv == {0.5: 1.0}


# --- the check's decisions over stored supports (agent.support.decide) ------------------------------------------------


def _claim(cited: list[str], scores: dict[str, float], vetoes: dict[str, Any] | None = None,
           candidate: str | None = None) -> dict[str, Any]:
    return {"text": "X was born in 1950.", "cited": cited, "scores": scores, "vetoes": vetoes or {},
            "candidate": candidate}


def test_pair_decisions_follow_the_threshold(cb: ModuleType) -> None:
    claim = _claim(["a"], {"a": 0.60, "b": 0.20, "c": 0.70}, candidate="c")
    assert cb.pair_decisions(claim, 0.50) == [("a", "cited", True)]  # kept: the candidate is never asked about
    assert cb.pair_decisions(claim, 0.65) == [("a", "cited", False), ("c", "candidate", True)]  # re-attributed
    assert cb.pair_decisions(claim, 0.75) == [("a", "cited", False), ("c", "candidate", False)]  # marked
    assert cb.check_decision(claim, 0.75) == ("unsupported", ())


def test_a_contradiction_veto_drops_a_well_supported_citation(cb: ModuleType) -> None:
    veto = {"a": [{"kind": "number", "detail": "1950 against 1965", "missing": []}]}
    claim = _claim(["a"], {"a": 0.90, "c": 0.60}, veto, candidate="c")
    assert cb.check_decision(claim, 0.50) == ("reattributed", ("c",))
    assert cb.pair_decisions(claim, 0.50) == [("a", "cited", False), ("c", "candidate", True)]


def test_which_pairs_are_labelled(cb: ModuleType) -> None:
    grid = (0.3, 0.5, 0.7)
    # The cited passage fails at 0.7, so a threshold could ask about the candidate: it is labelled.
    assert cb.labelled_pairs(_claim(["a"], {"a": 0.6, "c": 0.4}, candidate="c"), grid) == [("a", "cited"),
                                                                                           ("c", "candidate")]
    # Supported at every threshold tried: no threshold ever asks about the candidate.
    assert cb.labelled_pairs(_claim(["a"], {"a": 0.9, "c": 0.8}, candidate="c"), grid) == [("a", "cited")]
    # A candidate below the lowest threshold is never re-attributed to.
    assert cb.labelled_pairs(_claim(["a"], {"a": 0.2, "c": 0.25}, candidate="c"), grid) == [("a", "cited")]


def test_unsupported_share_counts_reattributed_claims_by_their_new_passage(cb: ModuleType) -> None:
    labels = {"a": False, "b": True, "c": False, "d": True, "e": False}
    claims = [
        _claim(["a"], {"a": 0.3, "b": 0.6}, candidate="b"),  # wrong citation, moved to a true passage
        _claim(["c"], {"c": 0.3, "e": 0.6}, candidate="e"),  # wrong citation, moved to another wrong one
        _claim(["d"], {"d": 0.8}),  # right and kept
        _claim(["a"], {"a": 0.3}),  # wrong, marked
        _claim(["c"], {"c": 0.7}),  # wrong and kept
        _claim(["x"], {"x": 0.7}),  # never labelled: left out
    ]
    states = [cb.claim_state(c, 0.5, labels.get) for c in claims]
    assert states[:5] == [(False, "supported"), (False, "unsupported"), (True, "supported"), (False, "marked"),
                          (False, "unsupported")]
    share = cb.unsupported_share(states)
    assert share["before"]["count"] == 4 and share["before"]["of"] == 5
    assert share["after"]["count"] == 2 and share["after"]["share"] == 0.4  # the moved-to-wrong claim counts
    assert share["marked_after"] == 1 and share["unknown"] == 1
    assert share["after"]["wilson95"] == [round(x, 4) for x in cb.wilson(2, 5)]


# --- the blind export -------------------------------------------------------------------------------------------------


def test_the_labeller_sees_only_the_id_the_claim_and_the_passage(cb: ModuleType) -> None:
    rows = [{"pair_id": f"{i:02x}", "claim": f"c{i}", "title": "T", "text": "t", "item": "q", "roles": ["cited"],
             "score": 0.9, "status_at_support_min": "supported"} for i in range(20)]
    shown = cb.blind_order(rows)
    assert all(set(r) == {"pair_id", "claim", "title", "text"} for r in shown)
    assert [r["pair_id"] for r in shown] != sorted(r["pair_id"] for r in shown)  # shuffled
    assert shown == cb.blind_order(list(reversed(rows)))  # by a fixed seed, whatever the input order


def test_export_keeps_issued_ids(cb: ModuleType) -> None:
    session = {"item": "q1", "question": "Q?", "snippets": {"a": {"title": "A", "text": "a."},
                                                           "c": {"title": "C", "text": "c."}}}
    claim = _claim(["a"], {"a": 0.6, "c": 0.45}, candidate="c")
    first = cb.pair_rows([(session, claim)], {})
    assert [(r["passage_id"], r["roles"]) for r in first] == [("a", ["cited"]), ("c", ["candidate"])]
    old = {(r["item"], r["claim"], r["passage_id"]): r["pair_id"] for r in first}
    again = cb.pair_rows([(session, claim)], old)
    assert [r["pair_id"] for r in again] == [r["pair_id"] for r in first]
    assert len({r["pair_id"] for r in first}) == 2


def test_labels_files(cb: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "labels_ann.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"pair_id": "p1", "supports": True, "note": ""}, {"pair_id": "p2", "supports": "unclear"},
        {"pair_id": "p3", "supports": "no"}, {"pair_id": "p1", "supports": False}]) + "\n")
    (tmp_path / "labels_bob.jsonl").write_text(json.dumps({"pair_id": "p1", "supports": True}) + "\n")
    labels = cb.read_labels(tmp_path)
    assert labels == {"ann": {"p1": False, "p2": "unclear", "p3": False}, "bob": {"p1": True}}  # a later row wins
    assert cb.labeller_order(labels) == ["ann", "bob"]
    assert cb.labeller_order(labels, ["bob"]) == ["bob", "ann"]
    (tmp_path / "labels_bad.jsonl").write_text(json.dumps({"pair_id": "p1", "supports": "maybe"}) + "\n")
    with pytest.raises(ValueError, match="labels_bad.jsonl:1"):
        cb.read_labels(tmp_path)
    assert math.isclose(cb.Z95, 1.959963984540054)
