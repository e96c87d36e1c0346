"""The UI's run worker against an HTTP policy (the real vLLM, `make vllm`): consecutive questions share one event
loop, so the client's kept-alive connections and the service's lock stay usable; the page hook sees the session start
first."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig, StageTokenCaps
from agent.policy import VLLMPolicyClient
from app import events as ev
from app.service import ResearchService
from app.ui.runner import LiveRun, shared_loop
from store.session_log import SessionLog
from tests.policy.test_vllm_server import QUESTION, SMALL

pytestmark = pytest.mark.slow


def test_consecutive_runs_reuse_one_http_client(real_vllm: Any, local_tools: dict[str, Any], tmp_path: Path) -> None:
    log = SessionLog(tmp_path / "s.sqlite3")
    client = VLLMPolicyClient(real_vllm.url, "policy", timeout_s=300, max_retries=0, backoff_s=0.01)
    service = ResearchService(client, local_tools, log, AgentConfig())  # built once, as the UI caches it
    # The connections are under test, not the answers: a few tokens per stage keep each run to seconds on CPU vLLM.
    options = SMALL.model_copy(update={"token_caps": StageTokenCaps(plan=16, research=16, review=16, answer=16)})
    try:
        for _ in range(2):  # with a loop per run, every second run met the first loop's dead connections
            started: list[str] = []

            def hook(e: ev.Event, started: list[str] = started) -> None:
                if isinstance(e, ev.SessionStarted):
                    started.append(e.session_id)

            run = LiveRun(service, QUESTION, options, on_event=hook)
            seen = [e for e in run.events() if e is not None]
            assert run.ended is not None and run.ended.error is None, run.ended.error
            outcome = run.ended.outcome
            assert outcome is not None and log.get(outcome.session_id).status == "completed"
            assert started == [outcome.session_id] and isinstance(seen[0], ev.SessionStarted)
            assert not run.running
    finally:
        asyncio.run_coroutine_threadsafe(client.aclose(), shared_loop()).result(timeout=30)
