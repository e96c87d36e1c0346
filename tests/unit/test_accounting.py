"""Pricing token counts (agent/accounting.py, issue 36), computed by hand: an empty table prices everything at 0, a
non-empty one leaves an unlisted model unknown (never $0) and every sum it is part of unknown, in-process engines
cost 0, and the judge's legacy per-judge price counts only where the table does not list the judge's model."""

from __future__ import annotations

import pytest

from agent.accounting import (
    ModelPrice,
    format_cost,
    judge_cost,
    session_usage,
    total_usage,
    unpriced_models,
    usage_rows,
)
from store.session_log import JudgeTokens, SessionTokens, StageTokens

TABLE = {"gpt-x": ModelPrice(input_per_mtok=2.0, output_per_mtok=8.0),
         "judge-x": ModelPrice(input_per_mtok=1.0, output_per_mtok=4.0)}


def counts(model: str | None, judge: str = "judge-x", kind: str = "llm", recorded: float | None = None
           ) -> SessionTokens:
    return SessionTokens(
        "s1", model,
        (StageTokens("plan", 1, 1_000, 0, 100), StageTokens("research", 2, 5_000, 1, 50), StageTokens("review"),
         StageTokens("answer", 1, 6_000, 0, 200)),
        (JudgeTokens(1, judge, kind, "ok", 2, 0, 10_000, 1_000, recorded),))


def test_a_listed_model_is_priced_per_million_tokens_in_and_out() -> None:
    u = session_usage(counts("gpt-x"), TABLE)
    assert [s.cost for s in u.stages] == pytest.approx([0.0028, 0.0104, 0.0, 0.0136])
    assert u.policy_cost == pytest.approx(0.0268) and u.judge_cost == pytest.approx(0.014)
    assert u.total_cost == pytest.approx(0.0408) and format_cost(u.total_cost) == "$0.0408"
    assert (u.prompt_tokens, u.sampled_tokens, u.policy_calls, u.reconstructed) == (12_000, 350, 4, 1)
    rows = usage_rows(u)
    assert [r.label for r in rows] == ["plan", "research", "review", "answer", "policy", "judge", "total"]
    assert (rows[-1].prompt_tokens, rows[-1].output_tokens) == (22_000, 1_350)
    assert rows[1].note == "1 prompt count(s) rebuilt from the log"


def test_an_unknown_model_in_a_non_empty_table_is_unknown_not_zero() -> None:
    u = session_usage(counts("other-model"), TABLE)
    assert u.policy_cost is None and u.total_cost is None and u.judge_cost == pytest.approx(0.014)
    assert [format_cost(s.cost) for s in u.stages] == ["unknown", "unknown", "$0", "unknown"]  # review spent nothing
    assert format_cost(u.total_cost) == "unknown" and unpriced_models(u) == ("other-model",)
    assert total_usage([session_usage(counts("gpt-x"), TABLE), u]).total_cost is None
    # An empty table (the default) prices every model at 0; the embedded policy costs 0 whatever the table.
    assert session_usage(counts("other-model"), {}).total_cost == 0.0
    assert session_usage(counts("embedded"), TABLE).policy_cost == 0.0


def test_the_judge_legacy_price_counts_only_where_the_table_does_not_list_its_model() -> None:
    assert judge_cost(TABLE, "judge-x", "llm", 10_000, 1_000, 0.5) == pytest.approx(0.014)  # the table wins
    assert judge_cost(TABLE, "judge-y", "llm", 10_000, 1_000, 0.5) == 0.5  # the judge's own figure
    assert judge_cost(TABLE, "judge-y", "llm", 10_000, 1_000, 0.0) is None  # unpriced: unknown
    assert judge_cost({}, "judge-y", "llm", 10_000, 1_000, None) == 0.0
    assert judge_cost(TABLE, "minilm", "offline", 0, 0, None) == 0.0  # in-process
    u = session_usage(counts("gpt-x", judge="judge-y", recorded=0.5), TABLE)
    assert u.judge_cost == 0.5 and unpriced_models(u) == ()
