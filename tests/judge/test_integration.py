"""Judging real sessions produced by the embedded default: the offline judge, an LLM judge served by the llama.cpp
test server, and a judge endpoint that keeps failing — each ends in stored judgements or recorded failures."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app.service import ResearchService
from learning.judge.citations import check_citations
from learning.judge.client import JudgeClient
from learning.judge.llm import LLMJudge
from learning.judge.offline import OfflineJudge
from learning.judge.pipeline import judge_pending
from store.records import STAGES
from store.session_log import SessionLog
from tests.judge.openai_standin import OpenAIStandIn

ROOT = Path(__file__).resolve().parents[2]
TINY = RunOptions(format="short_form", max_tool_calls=1, temperature=0.7, seed=1, context_tokens=8192,
                  token_caps=StageTokenCaps(plan=32, research=24, review=24, answer=32))
QUESTION = "What language were books being translated into during the era of Haymo of Faversham?"


def make_sessions(policy: object, tools: dict, log: SessionLog, n: int) -> list[str]:  # type: ignore[type-arg]
    svc = ResearchService(policy, tools, log, AgentConfig())  # type: ignore[arg-type]
    return [asyncio.run(svc.run(QUESTION, TINY.model_copy(update={"seed": i}))).session_id for i in range(n)]


@pytest.fixture(scope="module")
def sessions_dir(tmp_path_factory: pytest.TempPathFactory, embedded_policy: object, small_index: object) -> Path:
    """A data folder whose session log holds 2 completed sessions of the embedded SmolLM2 on the same question."""
    from agent.tools.local_search import LocalSearch

    data = tmp_path_factory.mktemp("judge-data")
    log = SessionLog(data / "rubricem.sqlite3")
    make_sessions(embedded_policy, {"local_search": LocalSearch(small_index, k=3, snippet_chars=300)}, log, 2)
    log.close()
    return data


def _copy_log(src: Path, dst: Path) -> SessionLog:
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for f in src.glob("rubricem.sqlite3*"):
        shutil.copy(f, dst / f.name)
    return SessionLog(dst / "rubricem.sqlite3")


def test_offline_judge_stores_approximate_judgements_for_real_sessions(sessions_dir: Path, tmp_path: Path) -> None:
    log = _copy_log(sessions_dir, tmp_path)
    pending = log.completed_unjudged()
    assert len(pending) == 2
    summary = asyncio.run(judge_pending(log, OfflineJudge(log)))
    assert (summary.judged, summary.failed, summary.groups) == (2, 0, 1)
    assert log.completed_unjudged() == []
    for sid in pending:
        (j,) = log.judgements(sid)
        assert j.status == "ok" and j.judge_kind == "offline" and j.payload["approximate"] is True
        stages = j.payload["stages"]
        assert set(stages) == set(STAGES)
        assert all(s["score"] is None or 0.0 <= s["score"] <= 1.0 for s in stages.values())
        assert j.payload["judge_model"] == "offline-minilm"
        # The stored citation counts are this session's own (the counting rules are tested in test_citations.py).
        check = check_citations(log.get(sid).trajectory)
        assert (j.payload["citations"]["cited"], j.payload["citations"]["valid"]) == (check.cited, check.valid)


@pytest.mark.slow
def test_llm_judge_served_by_llamacpp_judges_a_real_session(
    sessions_dir: Path, tmp_path: Path, llamacpp_server: str
) -> None:
    log = _copy_log(sessions_dir, tmp_path)
    first = log.completed_unjudged(limit=1)
    client = JudgeClient(llamacpp_server, "smollm2", json_mode="json_object", max_tokens=192, timeout_s=120,
                         max_retries=1)

    async def go():  # type: ignore[no-untyped-def]
        try:
            return await judge_pending(log, LLMJudge(client, log, trajectory_chars=800), limit=1)
        finally:
            await client.aclose()

    summary = asyncio.run(go())
    # A 135M judge cannot write the four stages' rubrics as JSON within 192 tokens: measured, its grammar-constrained
    # object is cut at the limit every time (at 1,024 tokens the rubrics fit, then the scoring JSON is cut). So the
    # outcome is determined: the failure is stored typed, with the reason the client saw, the session stays pending
    # for the next run, and nothing is scored as 0.
    assert (summary.judged, summary.failed, summary.groups) == (0, 1, 1)
    (j,) = log.judgements(first[0])
    assert j.status == "failed" and j.error == "no stage could be scored"
    assert j.judge_kind == "llm" and j.judge_model == "smollm2"
    generation = j.payload["scaffold"]["rubric_generation"]
    assert generation.startswith("failed: JudgeOutputInvalid") and "cut off at the token limit" in generation
    assert all(s["score"] is None for s in j.payload["stages"].values())
    assert first[0] in log.completed_unjudged()


def test_a_judge_endpoint_that_keeps_failing_records_failures_and_keeps_sessions_pending(
    sessions_dir: Path, tmp_path: Path
) -> None:
    log = _copy_log(sessions_dir, tmp_path)
    with OpenAIStandIn() as standin:
        standin.push(status=500, times=50)
        client = JudgeClient(standin.root, "broken", max_retries=1, backoff_s=0.01, backoff_max_s=0.02)

        async def go():  # type: ignore[no-untyped-def]
            try:
                return await judge_pending(log, LLMJudge(client, log))
            finally:
                await client.aclose()

        summary = asyncio.run(go())
    assert (summary.judged, summary.failed) == (0, 2) and summary.errors
    for sid in log.completed_unjudged():
        (j,) = log.judgements(sid)
        assert j.status == "failed" and "JudgeUnavailable" in (j.error or "")
    assert len(log.completed_unjudged()) == 2  # offered again next time


def test_judge_cli_uses_the_offline_judge_and_says_so(sessions_dir: Path, tmp_path: Path) -> None:
    _copy_log(sessions_dir, tmp_path / "data").close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    env["RUBRICEM_STORE__DATA_DIR"] = str(tmp_path / "data")
    p = subprocess.run([sys.executable, "-m", "app.cli", "judge", "--limit", "5"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "offline judge" in p.stderr and "2 judged, 0 failed" in p.stdout
    again = subprocess.run([sys.executable, "-m", "app.cli", "judge"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "0 judged, 0 failed" in again.stdout
    bad = subprocess.run([sys.executable, "-m", "app.cli", "judge", "--since", "yesterday"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--since" in bad.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"RUBRICEM_LEARNING__JUDGE__BASE_URL": "http://127.0.0.1:9"}, "no judge model"),
        ({"RUBRICEM_LEARNING__JUDGE__BASE_URL": "localhost:9", "RUBRICEM_LEARNING__JUDGE__MODEL": "m"}, "http://"),
    ],
)
def test_unusable_judge_settings_exit_2_before_any_work(extra: dict[str, str], message: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    env.update({"RUBRICEM_STORE__DATA_DIR": str(tmp_path), **extra})
    p = subprocess.run([sys.executable, "-m", "app.cli", "judge"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and message in p.stderr
