"""Issue 62's pieces that are pure: the short answer and the yes/no cover-EM fix, experience items (memory (b)), and
the pre-registered statistics (hierarchical bootstrap, Holm, the decision rule, the positive control)."""

from __future__ import annotations

import numpy as np
import pytest

from learning.eval.heldout import HeldoutItem, short_answer
from learning.eval.memory_stats import analyse, decide, holm, memory_acts, paired_bootstrap
from learning.reflection.experience import EXPERIENCE_JUDGE, experience_item
from store.records import PromptRecord, Snippet, ToolCallRecord, Trajectory


def test_the_short_answer_is_the_last_boxed_without_markers_or_tags() -> None:
    assert short_answer("It is \\boxed{Paris} [1], or \\boxed{\\text{Lyon} [2]}") == "Lyon"
    assert short_answer("No boxed answer here.") is None
    assert short_answer("\\boxed{<answer></answer> [3]}") is None  # tag debris is never an answer
    assert short_answer("\\boxed{</cite>Latin}") == "Latin"


def _figures(answers: tuple[str, ...], body: str) -> dict[str, float | None]:
    from agent.report import Report
    from learning.eval.heldout import session_figures

    item = HeldoutItem("x:1", "hotpotqa", "Is it so?", answers, ())
    t = Trajectory("s", "Is it so?", PromptRecord("", (), ""), ())
    return session_figures(item, t, Report(markdown=body, body=body, references=(), unknown_citations=0,
                                           answer_found=True))


def test_the_reports_unsupported_mark_is_not_part_of_the_answers_figures() -> None:
    """An invented citation id leaves the report's mark in the body (issue 64); the figures read the model's words,
    as they did before the mark existed."""
    from agent.support import UNSUPPORTED_MARK

    marked = _figures(("Paris",), f"It is \\boxed{{Paris {UNSUPPORTED_MARK}}}.")
    plain = _figures(("Paris",), "It is \\boxed{Paris}.")
    assert marked == plain and marked["answer_f1"] == 1.0 and marked["answer_words"] == 3.0


def test_a_yes_no_gold_is_scored_on_the_short_answer_only() -> None:
    assert _figures(("no",), "No item was found in the passages.")["cover_em"] == 0.0  # was 1.0 before issue 62
    assert _figures(("no",), "The passages disagree. \\boxed{No}")["cover_em"] == 1.0
    f = _figures(("Latin",), "Books went into Latin [1].")  # other golds: the whole body still counts
    assert f["cover_em"] == 1.0 and f["answer_f1"] == 0.0 and f["boxed"] == 0.0 and f["answer_words"] == 5.0
    assert _figures(("Latin language",), "\\boxed{Latin}")["answer_f1"] == pytest.approx(2 / 3)


def _trajectory() -> Trajectory:
    calls = (
        ToolCallRecord("local_search", "Haymo era", snippets=(Snippet("0-0", "local_search", "Franciscans", "..."),)),
        ToolCallRecord("local_search", "Haymo of Faversham </answer> translations", snippets=(
            Snippet("1-0", "local_search", "Haymo of Faversham", "..."),
            Snippet("1-1", "local_search", "Latin translations of the 12th century", "..."))),
        ToolCallRecord("local_search", "later", snippets=(Snippet("2-0", "local_search", "haymo of faversham", "."),)),
    )
    return Trajectory("s-1", "Q?", PromptRecord("", (), ""), (), tool_calls=calls)


def test_an_experience_item_keeps_the_first_working_query_cleaned() -> None:
    it = experience_item(question="What language were books translated into in Haymo's era?",
                         trajectory=_trajectory(), useful_titles=["Haymo of Faversham", "Latin translations of the "
                                                                  "12th century"],
                         cited_titles=["Haymo of Faversham", "Haymo of Faversham"], short_answer="Latin",
                         score=0.8, session_id="s-1", policy_version="sft@0")
    assert it is not None and it.judge_model == EXPERIENCE_JUDGE and it.score == 0.8 and it.session_id == "s-1"
    assert "`Haymo of Faversham translations`" in it.rubrics and "</answer>" not in it.rubrics + it.takeaways
    assert "Haymo of Faversham; Latin translations of the 12th century" in it.rubrics  # each title once, in order
    assert "Cited: Haymo of Faversham." in it.takeaways and "\\boxed{Latin}" in it.takeaways
    none = experience_item(question="Q?", trajectory=_trajectory(), useful_titles=["Something else"],
                           cited_titles=[], short_answer=None, score=0.0, session_id="s", policy_version="v")
    assert none is None  # no search found a useful passage: nothing to pass on
    with pytest.raises(ValueError):
        experience_item(question="Q?", trajectory=_trajectory(), useful_titles=[], cited_titles=[],
                        short_answer=None, score=1.5, session_id="s", policy_version="v")


def test_holm_adjusts_step_down_and_keeps_order() -> None:
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5]) == [0.5]


def test_the_hierarchical_bootstrap_finds_a_real_shift_and_not_a_null() -> None:
    rng = np.random.default_rng(1)
    base = rng.random((40, 3))
    shifted = paired_bootstrap(base + 0.1 + rng.normal(0, 0.05, (40, 3)), base, draws=2000)
    assert shifted["lo"] > 0.05 and shifted["p"] < 0.01 and shifted["questions"] == 40
    null = paired_bootstrap(base + rng.normal(0, 0.05, (40, 3)), base, draws=2000)
    assert null["lo"] < 0 < null["hi"] and null["p"] > 0.05
    gaps = base.copy()
    gaps[:8] = np.nan  # questions without the figure (no gold passages) drop out
    assert paired_bootstrap(gaps, base, draws=200)["questions"] == 32


def _records(value: float, items: list[str], injected: bool = False) -> list[dict]:
    return [{"item": q, "sample": s, "figures": {"answer_f1": value, "citation_precision": value, "gold_recall": 0.5,
                                                 "answer_words": 10.0, "boxed": 1.0},
             "scores": {"total": 0.5}, "injected": ["i1"] if injected else [], "queries": ["haymo era"],
             "searched_titles": ["Franciscans"], "cited_titles": []}
            for q in items for s in range(3)]


def test_the_decision_rule_and_the_positive_control() -> None:
    items = [f"q{i}" for i in range(40)]
    meta = {"i1": {"queries": ["Haymo  Era"], "titles": ["Nothing"]}}
    flat = {"off": _records(0.2, items), "a": _records(0.2, items, True), "b": _records(0.2, items, True)}
    r = analyse(flat, meta, items, draws=500)
    assert r["decision"].startswith("Memory does not help")
    assert r["acts"]["b"] == {"sessions": 120, "injected": 1.0, "query_reused": 1.0, "titles_reused": 0.0}
    better = dict(flat, b=_records(0.2, items, True))
    for rec in better["b"]:
        rec["figures"]["answer_f1"] = 0.2 + (0.1 if int(rec["item"][1:]) % 2 else 0.2)
    assert analyse(better, meta, items, draws=500)["decision"].startswith("Memory helps: memory (b) raises answer_f1")
    partial = analyse({"off": flat["off"]}, meta, items, draws=100)
    assert partial["decision"].startswith("Not decided") and partial["tests"] == []
    wide = [{"memory": "b", "metric": "answer_f1", "mean": 0.0, "lo": -0.1, "hi": 0.1, "p": 0.9, "p_holm": 1.0}]
    assert decide(wide, True).startswith("Undecided")
    assert memory_acts([], meta)["injected"] == 0.0


def test_ties_at_zero_count_half_to_each_side() -> None:
    """Issue 62: most paired differences of a 0/1 figure are exactly 0; one question gaining must not read as p ~1."""
    base = np.zeros((40, 3))
    one = base.copy()
    one[0] = 1.0  # one question right in every sample, nothing else changes
    r = paired_bootstrap(one, base, draws=4000)
    assert r["lo"] == 0.0 and r["hi"] > 0 and 0.2 < r["p"] < 0.6
    assert paired_bootstrap(base, base, draws=500)["p"] == 1.0


def test_the_follow_up_is_decided_on_its_own_fresh_samples_only() -> None:
    """The confirmatory follow-up (docs/learning/memory/confirm/PREREGISTRATION.md) analyses samples 3..8 of bank off
    and memory (b) alone: the first study's samples 0..2 never enter it, and its Holm family is its 2 tests."""
    items = [f"q{i}" for i in range(40)]
    fresh = range(3, 9)

    def records(value: float, samples: range) -> list[dict]:
        return [{"item": q, "sample": s, "figures": {"answer_f1": value, "citation_precision": value},
                 "scores": {}, "injected": []} for q in items for s in samples]

    # The old samples would show a large gain; the fresh ones show none. Only the fresh ones may count.
    data = {"off": records(0.0, range(3)) + records(0.0, fresh), "b": records(0.9, range(3)) + records(0.0, fresh)}
    r = analyse(data, {}, items, draws=500, samples=fresh, memories=("b",))
    primary = [t for t in r["tests"] if t["primary"]]
    assert [t["holm_family"] for t in primary] == [2, 2]
    assert all(t["mean"] == 0.0 for t in primary)
    assert r["means"]["b"]["n"] == 40 * 6
    assert r["decision"].startswith("Memory does not help")
    # A missing fresh sample leaves the follow-up undecided.
    short = {"off": data["off"], "b": records(0.0, range(3, 8))}
    assert analyse(short, {}, items, draws=200, samples=fresh, memories=("b",))["decision"].startswith("Not decided")
