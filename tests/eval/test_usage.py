"""Per-item tokens and cost, and the spread over seeds, by hand: the pure parts of learning/eval/usage.py and
learning/eval/spread.py on trajectories and numbers small enough to count on paper."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from agent.accounting import ModelPrice
from learning.eval.spread import mean_std, metric_spread
from learning.eval.usage import item_usage, policy_tokens, total_usage
from store.records import PromptRecord, Trajectory, Turn


def _turn(kind: str, n: int, stage: str = "research") -> Turn:
    return Turn(stage=stage, kind=kind, text="x" * n, token_ids=tuple(range(n)))  # type: ignore[arg-type]


# prompt 10; sampled 3, forced 1, sampled 2, tool output 5, sampled 4: the three calls read 10, 10+3+1 = 14 and
# 10+3+1+2+5 = 21 tokens, 45 in all, and sampled 3 + 2 + 4 = 9.
TURNS = (_turn("sampled", 3, "plan"), _turn("forced", 1), _turn("sampled", 2), _turn("tool_output", 5),
         _turn("sampled", 4, "answer"))
TRAJ = Trajectory(session_id="s", question="q", prompt=PromptRecord("p", tuple(range(10)), "sha"), turns=TURNS)


def test_policy_tokens_are_the_context_each_sampled_call_read_and_what_it_sampled() -> None:
    assert policy_tokens(TRAJ) == {"policy_calls": 3, "policy_prompt": 45, "policy_sampled": 9}
    # A turn that recorded what its call read (store.records.Turn.prompt_tokens) is taken as recorded.
    recorded = replace(TRAJ, turns=tuple(replace(t, prompt_tokens=100) if t.kind == "sampled" else t for t in TURNS))
    assert policy_tokens(recorded)["policy_prompt"] == 300


def test_costs_follow_the_price_table_and_an_unlisted_model_is_unknown_not_zero() -> None:
    judge = {"model": "grader", "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "cost_usd": 0.0}}
    prices = {"served": ModelPrice(input_per_mtok=2.0, output_per_mtok=10.0),
              "grader": ModelPrice(input_per_mtok=1.0, output_per_mtok=4.0)}
    tokens, cost = item_usage(TRAJ, "served", judge, prices)
    assert tokens == {"policy_calls": 3, "policy_prompt": 45, "policy_sampled": 9, "judge_prompt": 1000,
                      "judge_completion": 100}
    assert cost["policy"] == pytest.approx((45 * 2 + 9 * 10) / 1e6)
    assert cost["judge"] == pytest.approx((1000 * 1 + 100 * 4) / 1e6)
    assert cost["total"] == pytest.approx(cost["policy"] + cost["judge"])  # type: ignore[operator]

    _, unlisted = item_usage(TRAJ, "another-model", judge, prices)
    assert unlisted["policy"] is None and unlisted["total"] is None and unlisted["judge"] == cost["judge"]
    _, local = item_usage(TRAJ, "embedded", None, prices)  # the in-process policy costs 0 even under a table
    assert local == {"policy": 0.0, "judge": 0.0, "total": 0.0}
    _, free = item_usage(TRAJ, "another-model", judge, {})  # no table: every model costs 0
    assert free == {"policy": 0.0, "judge": 0.0, "total": 0.0}

    records = [{"tokens": tokens, "cost_usd": cost}, {"tokens": tokens, "cost_usd": unlisted}, {"status": "failed"}]
    totals, costs = total_usage(records)
    assert totals["policy_prompt"] == 90 and totals["judge_completion"] == 200 and totals["items"] == 2
    assert costs["policy"] is None and costs["judge"] == pytest.approx(2 * cost["judge"]) and costs["total"] is None


def test_mean_and_sample_standard_deviation_over_runs() -> None:
    assert mean_std([1.0]) == (1.0, None)  # one run: no deviation
    mean, std = mean_std([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5) and std == pytest.approx(math.sqrt((0.09 + 0.01 + 0.16) / 2))  # n - 1
    means, stds, counts = metric_spread([{"em": 1.0, "llm_accuracy": 0.5}, {"em": 0.5}])
    assert means == {"em": 0.75, "llm_accuracy": 0.5} and counts == {"em": 2, "llm_accuracy": 1}
    assert stds["em"] == pytest.approx(math.sqrt(0.125)) and stds["llm_accuracy"] is None
