"""Whole research sessions on real policies: the embedded SmolLM2 and the llama.cpp OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.policy import LlamaCppPolicyClient
from app.service import ResearchOutcome, ResearchService
from store.records import STAGES, stage_spans
from store.session_log import SessionLog

SMALL = RunOptions(
    format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=300,
    token_caps=StageTokenCaps(plan=40, research=24, review=24, answer=40), context_tokens=8192,
)
QUESTION = "What language were books being translated into during the era of Haymo of Faversham?"


def _check_session(out: ResearchOutcome, log: SessionLog) -> None:
    rec = log.get(out.session_id)
    assert rec.status == "completed" and rec.report == out.report.markdown
    traj = rec.trajectory
    assert traj.turns == out.trajectory.turns  # what was written turn by turn is exactly what the run produced
    order = [STAGES.index(t.stage) for t in traj.turns]
    assert order == sorted(order), "stages must follow Plan → Research → Review → Answer"
    assert {t.stage for t in traj.turns} == set(STAGES)
    spans = stage_spans(traj.turns)
    assert sum(len(r) for rs in spans.values() for r in rs) == len(traj.token_ids)
    assert len(traj.tool_calls) >= 1  # turn 1 always searches (forced if the model does not)
    for t in traj.turns:
        assert len(t.token_ids) > 0 or t.text == ""
        if t.kind == "sampled":
            assert t.policy_version == out.policy_version and sum(t.mask) == len(t.token_ids)
        else:
            assert sum(t.mask) == 0
    assert rec.metrics["stages"] and rec.metrics["tool_calls"] == len(traj.tool_calls)
    assert "<think>" not in out.report.body and "<answer>" not in out.report.markdown


def test_embedded_smollm2_session_is_logged_with_token_ids_logprobs_and_masks(
    embedded_policy: object, local_tools: dict, tmp_path: Path  # type: ignore[type-arg]
) -> None:
    log = SessionLog(tmp_path / "s.sqlite3")
    svc = ResearchService(embedded_policy, local_tools, log, AgentConfig())  # type: ignore[arg-type]
    out = asyncio.run(svc.run(QUESTION, SMALL))
    _check_session(out, log)
    sampled = [t for t in log.get(out.session_id).trajectory.turns if t.kind == "sampled"]
    assert sampled and all(t.token_source == "server" for t in sampled)
    assert all(len(t.logprobs) == len(t.token_ids) and all(lp <= 0 for lp in t.logprobs) for t in sampled)
    decode = embedded_policy.decode  # type: ignore[attr-defined]
    assert all(decode(t.token_ids) == t.text for t in sampled)


@pytest.mark.slow
def test_llamacpp_server_runs_a_whole_session(llamacpp_server: str, local_tools: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    log = SessionLog(tmp_path / "s.sqlite3")
    policy = LlamaCppPolicyClient(llamacpp_server, "smollm2", timeout_s=120, max_retries=2)

    async def go() -> ResearchOutcome:
        try:
            return await ResearchService(policy, local_tools, log, AgentConfig()).run(QUESTION, SMALL)
        finally:
            await policy.aclose()

    out = asyncio.run(go())
    _check_session(out, log)
    sampled = [t for t in out.trajectory.turns if t.kind == "sampled"]
    # The llama.cpp server returns text only: its ids are re-tokenized and flagged as such for the trainer.
    assert sampled and all(t.token_source == "retokenized" for t in sampled)
    # It drops stop strings, so every closing tag that ended a generation was inserted (and masked).
    assert any(t.kind == "forced" and t.text.startswith("</") for t in out.trajectory.turns)
