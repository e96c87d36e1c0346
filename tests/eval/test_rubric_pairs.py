"""`rubricem eval rubric-pairs`: the agent (a scripted policy through the real ResearchService and local_search) on two
DeepRubric pairs, scored against each pair's rubrics — offline (approximate, said so in the summary) and through a
judge endpoint (the OpenAI-compatible stand-in) on the 0–4 scale."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.service import ResearchService
from learning.eval.datasets import DatasetError, load_benchmark
from learning.eval.runner import OFFLINE_PAIRS_NOTE, EvalSummary, run_eval
from learning.judge.client import JudgeClient
from tests.eval.support import SCRIPTED_OPTIONS, user_prompt
from tests.judge.openai_standin import OpenAIStandIn, Reply

NOLAN_Q = "Who is Christopher Nolan, and what is he known for?"
DEMON_Q = "If Gallu is a demon, what is Lilu?"
PAIRS = [
    {"id": "dr-nolan", "question": NOLAN_Q, "format": "long_form", "rubrics": [
        {"id": "R1", "type": "factual", "description": "States that Christopher Nolan is a British-American film "
         "director.", "weight": 1.0, "evidence": ["Christopher Nolan is a British-American film director."]},
        {"id": "R2", "type": "logical", "description": "Describes the migration of Arctic terns.", "weight": 0.5},
        {"id": "R3", "type": "logical", "description": "Confuses Nolan with a footballer.", "weight": -0.5}]},
    {"id": "dr-lilu", "question": DEMON_Q, "format": "long_form", "rubrics": [
        {"id": "R1", "type": "logical", "description": "Says what a Lilu is in mythology.", "weight": 1.0}]},
]
ANSWERS = {"Christopher Nolan": "Christopher Nolan is a British-American film director.", "Gallu": "a spirit"}


def _pairs(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n", encoding="utf-8")
    return path


def _eval(data: Path, service: ResearchService, out: Path, standin: OpenAIStandIn | None = None) -> EvalSummary:
    async def go() -> EvalSummary:
        if standin is None:
            return await run_eval("rubric-pairs", data, service=service, options=SCRIPTED_OPTIONS, out_dir=out)
        async with JudgeClient(standin.root, "standin-judge", max_retries=0, backoff_s=0.01) as judge:
            return await run_eval("rubric-pairs", data, service=service, options=SCRIPTED_OPTIONS, out_dir=out,
                                  judge=judge)

    return asyncio.run(go())


def _items(out: Path) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in (json.loads(x) for x in (out / "items.jsonl").read_text().splitlines())}


def test_offline_rubric_pairs_write_summary_and_plot_and_say_they_are_approximate(
    scripted_service: Callable[..., ResearchService], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    summary = _eval(_pairs(tmp_path), scripted_service(ANSWERS), out)
    assert summary.n == 2 and summary.n_scored == 2 and summary.primary_metric == "rubric"
    assert summary.note == OFFLINE_PAIRS_NOTE and summary.judge_model is None
    for name in ("items.jsonl", "summary.md", "summary.json", "plot.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert "Approximate: no judge endpoint" in (out / "summary.md").read_text(encoding="utf-8")
    assert json.loads((out / "summary.json").read_text())["note"] == OFFLINE_PAIRS_NOTE
    nolan = _items(out)["dr-nolan"]
    assert nolan["format"] == "long_form" and nolan["judge"]["approximate"] is True
    scores = {c["id"]: c["score"] for c in nolan["judge"]["criteria"]}
    assert scores["R1"] == 4.0 and scores["R2"] <= 1.0  # the stated fact is covered, the unrelated one is not
    assert set(nolan["metrics"]) >= {"rubric", "reward", "format", "search", "citation", "length"}
    assert set(summary.metrics) >= {"rubric", "reward", "format", "search", "citation", "length"}


def test_a_judge_endpoint_scores_each_criterion_zero_to_four_with_evidence_shown(
    scripted_service: Callable[..., ResearchService], tmp_path: Path, standin: OpenAIStandIn
) -> None:
    prompts: list[str] = []

    def respond(req: dict[str, Any]) -> Reply:
        prompt = user_prompt(req)
        prompts.append(prompt)
        if "Arctic terns" in prompt:  # the Nolan pair: R1 4, R2 0, R3 (undesirable) 0
            scores = [{"id": "R1", "score": 4, "reason": "stated"}, {"id": "R2", "score": 0, "reason": "absent"},
                      {"id": "R3", "score": 0, "reason": "no confusion"}]
        else:
            scores = [{"id": "R1", "score": 2, "reason": "partly"}]
        return Reply(content=json.dumps({"scores": scores}))

    standin.responder = respond
    out = tmp_path / "out"
    summary = _eval(_pairs(tmp_path), scripted_service(ANSWERS), out, standin)
    items = _items(out)
    # (1·1 + 0.5·0 − 0.5·0) / 2 = 0.5; the Lilu pair: 1·(2/4) / 1 = 0.5
    assert items["dr-nolan"]["metrics"]["rubric"] == pytest.approx(0.5)
    assert items["dr-lilu"]["metrics"]["rubric"] == pytest.approx(0.5)
    assert summary.note == "" and summary.judge_model == "standin-judge" and summary.metrics["rubric"] == 0.5
    nolan_prompt = next(p for p in prompts if "Arctic terns" in p)
    assert "<evidence>\nChristopher Nolan is a British-American film director.\n</evidence>" in nolan_prompt
    assert 'undesirable="true"' in nolan_prompt


def test_a_malformed_pairs_file_is_a_dataset_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(PAIRS[0]) + "\n" + json.dumps({"question": "Q?"}) + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"pairs.jsonl:2: 'rubrics' must be a non-empty list"):
        load_benchmark("rubric-pairs", path)
