"""Scaffold compliance per item, and the vanilla-RAG floor scored by the same runner."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agent.config import RunOptions
from learning.eval.baseline import RagBaseline
from learning.eval.compliance import compliance
from learning.eval.runner import run_eval
from store.records import PromptRecord, Snippet, ToolCallRecord, Trajectory, Turn
from tests.fakes import ScriptedPolicy

HELDOUT = Path(__file__).resolve().parents[2] / "learning" / "sft" / "data" / "heldout"


def _turn(stage: str, kind: str, text: str) -> Turn:
    return Turn(stage=stage, kind=kind, text=text, token_ids=tuple(text.encode()))  # type: ignore[arg-type]


def _traj(turns: list[Turn], calls: tuple[ToolCallRecord, ...]) -> Trajectory:
    return Trajectory("s", "q", PromptRecord("p", (1,), "x"), tuple(turns), calls)


SNIP = Snippet("ab12cd34-0", "local_search", "Haymo", "Latin translations")


def test_a_model_that_wrote_every_stage_itself_complies_fully() -> None:
    turns = [_turn("plan", "sampled", "<think>t</think><structured_plan>…</structured_plan>"),
             _turn("research", "sampled", '<call_tool name="local_search">Haymo</call_tool>'),
             _turn("research", "tool_output", "<tool_output>…</tool_output>"),
             _turn("review", "sampled", "<think/><review>…</review>"),
             _turn("answer", "sampled", '<answer><cite id="ab12cd34-0">Latin</cite> <cite id="zz">x</cite></answer>')]
    c = compliance(_traj(turns, (ToolCallRecord("local_search", "Haymo", snippets=(SNIP,)),)))
    assert c["self_tagged_stages"] == 1.0 and c["valid_tool_calls"] == 1.0
    assert c["self_citations"] == 1 and c["has_self_citation"] == 1.0  # the unknown id "zz" does not count


def test_forced_tags_failed_calls_and_forced_answers_count_against_the_model() -> None:
    turns = [_turn("plan", "forced", "<structured_plan>"), _turn("plan", "sampled", "words"),
             _turn("research", "forced", '<call_tool name="local_search">'),
             _turn("research", "sampled", "q</call_tool>"),
             _turn("review", "forced", "<review>"), _turn("review", "sampled", "r</review>"),
             _turn("answer", "forced", '<answer><cite id="ab12cd34-0">'),
             _turn("answer", "sampled", "Latin</cite></answer>")]
    calls = (ToolCallRecord("local_search", "q", snippets=(SNIP,)), ToolCallRecord("", "", error="no call"))
    c = compliance(_traj(turns, calls))
    assert c["self_tagged_stages"] == 0.0 and c["valid_tool_calls"] == 0.5
    assert c["self_citations"] == 0  # the cite tag was forced, not written


def test_rag_baseline_is_scored_beside_the_agent_with_gold_recall(local_tools: dict, tmp_path: Path) -> None:
    policy = ScriptedPolicy(lambda _ctx, _stop: "Latin\n")
    rag = RagBaseline(policy, local_tools["local_search"], k=3)  # type: ignore[arg-type]
    summary = asyncio.run(run_eval("hotpotqa", HELDOUT, service=rag, options=RunOptions(seed=0),  # type: ignore[arg-type]
                                   out_dir=tmp_path, limit=3))
    assert summary.n == 3 and summary.n_failed == 0
    # The scripted answer "Latin" is right for the second question only (the shipped held-out file's gold answers:
    # "a spirit", "Latin", "Columbus, Ohio"), so every answer metric is exactly 0, 1, 0 per item.
    items = {r["id"]: r for r in map(json.loads, (tmp_path / "items.jsonl").read_text().splitlines())}
    haymo = "5a7decc75542995f4f40230f"
    assert len(items) == 3 and haymo in items
    for item_id, record in items.items():
        right = float(item_id == haymo)
        assert record["prediction"] == "Latin"
        assert (record["metrics"]["em"], record["metrics"]["f1"], record["metrics"]["cover_em"]) == (right,) * 3
    assert summary.metrics["em"] == summary.metrics["f1"] == summary.metrics["cover_em"] == pytest.approx(1 / 3)
    # Gold recall is each item's share of its two supporting titles among the retrieved passages; the small index
    # holds "Haymo of Faversham", which a search for that question finds, but not "Recovery of Aristotle".
    recalls = [r["metrics"]["support_recall"] for r in items.values()]
    assert all(x in (0.0, 0.5, 1.0) for x in recalls) and items[haymo]["metrics"]["support_recall"] == 0.5
    assert summary.metrics["support_recall"] == pytest.approx(sum(recalls) / 3)
    assert "self_tagged_stages" not in summary.metrics  # a baseline has no scaffold
    prompt = policy.calls and policy.calls[0]
    assert prompt and prompt["max_tokens"] == 32
