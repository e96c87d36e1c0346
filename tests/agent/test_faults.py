"""Bad model output, failing tools and bad input: every run ends in a report or a typed failure, and the session log
says which (issue 2, "Bad input and faults")."""

from __future__ import annotations

import asyncio
import random
import string
import threading
from pathlib import Path

import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.errors import InputError
from agent.policy import VLLMPolicyClient
from agent.tools.serper import GoogleSearch
from app.service import ResearchService, RunFailedError
from store.session_log import SessionLog
from tests.agent.scripts import PLAN, stage_of
from tests.fakes import ScriptedPolicy
from tests.tools.tools_support import LocalServer, Reply, free_port

FRAGMENTS = [
    "<think>", "</think>", "<structured_plan>", "</structured_plan>", "<deep_analysis>", "<rubrics>", "<review>",
    "</review>", "<answer>", "</answer>", "<call_tool", '<call_tool name="local_search">', '<call_tool name="">',
    '<call_tool name="no_such_tool">', "<call_tool name=local_search>", "</call_tool>", "</call>", "<call>",
    '<cite id="">', '<cite id="zzzz-1">', "</cite>", "<tool_output>", "</tool_output>", "<snippet id=\"x\">",
    "\\boxed{", "}", "<", ">", "/", "\n", "Haymo", "Latin", "   ", "\x00", "\ufffd", "💥", "中文", "<answer></answer>",
]


def random_output(rng: random.Random) -> str:
    """A malformed model output: tag soup, random unicode, random bytes, empty or huge."""
    kind = rng.random()
    if kind < 0.05:
        return ""
    if kind < 0.10:
        return "<call_tool name=\"local_search\">" + "x" * rng.randint(5000, 60000)  # huge and unclosed
    if kind < 0.20:
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))).decode("utf-8", errors="replace")
    if kind < 0.30:
        return "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 200)))
    parts = [rng.choice(FRAGMENTS) if rng.random() < 0.6 else rng.choice(string.printable) * rng.randint(1, 8)
             for _ in range(rng.randint(1, 40))]
    return "".join(parts)


@pytest.fixture
def log(tmp_path: Path) -> SessionLog:
    """A real session log in a temporary folder (synchronous=NORMAL: hundreds of runs, no fsync per turn needed)."""
    return SessionLog(tmp_path / "s.sqlite3", synchronous="NORMAL")


def service(policy: object, tools: dict, log: SessionLog) -> ResearchService:  # type: ignore[type-arg]
    return ResearchService(policy, tools, log, AgentConfig())  # type: ignore[arg-type]


PAPER_SCAFFOLD = RunOptions(question_first=False)  # the model writes every query, the first included
FUZZ_OPTS = RunOptions(
    max_tool_calls=3, token_caps=StageTokenCaps(plan=96, research=64, review=64, answer=96), wall_clock_s=60,
    context_tokens=65536,
)


def test_two_hundred_malformed_outputs_all_end_in_a_report(local_tools: dict, log: SessionLog) -> None:  # type: ignore[type-arg]
    """Every fuzzed output still allows an answer (the graph forces what the model did not write, within a context
    far larger than the caps), so every run must complete with a stored report; a run that fails is a bug. Runs
    that cannot answer (policy down, context exhausted) are the typed failures tested below."""
    rng = random.Random(20261123)
    failures: list[str] = []
    outputs = 0
    for i in range(60):
        def script(context: str, stop: list[str]) -> str:
            nonlocal outputs
            outputs += 1
            return random_output(rng)

        policy = ScriptedPolicy(script, keep_stop=bool(i % 2))
        svc = service(policy, local_tools, log)
        try:
            out = asyncio.run(svc.run("What language did Haymo of Faversham's era translate into?", FUZZ_OPTS))
        except RunFailedError as exc:
            assert log.get(exc.session_id).status == "failed"
            failures.append(f"run {i}: {exc}")
            continue
        rec = log.get(out.session_id)
        assert rec.status == "completed" and rec.report == out.report.markdown
        assert len(rec.trajectory.turns) == len(out.trajectory.turns)
        # Bounded: plan (≤2 samples), ≤3 research turns with a call (+1 query sample after a forced first call)
        # and the tool-free final turn, review (or the final turn's continuation), answer (≤2 samples).
        assert len(policy.calls) <= 2 + (3 + 1 + 1) + 1 + 2
        assert len(out.trajectory.tool_calls) <= 3
        for t in out.trajectory.turns:
            assert t.kind == "sampled" or sum(t.mask) == 0
        assert "<think>" not in out.report.body and "</" not in out.report.body
    assert failures == []
    assert outputs >= 200, outputs
    assert len(log.list_sessions(limit=100)) == 60


def test_search_backend_timeouts_and_5xx_become_tool_errors_and_the_run_continues(
    local_tools: dict, log: SessionLog  # type: ignore[type-arg]
) -> None:
    srv = LocalServer()
    held = threading.Event()  # the third reply is sent only after the run: its timeout is certain under load
    try:
        replies = iter([Reply(status=503, body=b"down"), Reply.json({"organic": []}, status=200)])
        srv.route("/search", lambda req: next(replies, Reply(hold=held, body=b"{}")))
        google = GoogleSearch("secret-key-123", url=srv.root + "/search", timeout_s=2.0)
        tools = {**local_tools, "google_search": google}

        def script(context: str, stop: list[str]) -> str:
            stage = stage_of(stop)
            if stage == "plan":
                return PLAN
            if stage == "research":
                n = context.count("</tool_output>")
                if n < 3:
                    return f'<call_tool name="google_search">Haymo of Faversham {n}</call_tool>'
                return "<review>enough</review>"
            return "<answer>Latin.</answer>"

        # The script writes every call itself (no question-first search): the error pattern is the backend's.
        out = asyncio.run(service(ScriptedPolicy(script), tools, log).run("Haymo's era language?", PAPER_SCAFFOLD))
    finally:
        held.set()
        srv.close()
    calls = out.trajectory.tool_calls
    assert [c.error is not None for c in calls] == [True, False, True]
    assert "timed out" in (calls[2].error or "")
    assert "503" in (calls[0].error or "") and "secret-key-123" not in (calls[0].error or "")
    assert "Error:" in out.trajectory.assistant_text
    rec = log.get(out.session_id)
    assert rec.status == "completed" and rec.trajectory.max_consecutive_tool_errors == 1
    assert [c.error is not None for c in rec.trajectory.tool_calls] == [True, False, True]


def test_two_consecutive_tool_errors_are_recorded(local_tools: dict, log: SessionLog) -> None:  # type: ignore[type-arg]
    def script(context: str, stop: list[str]) -> str:
        stage = stage_of(stop)
        if stage == "plan":
            return PLAN
        if stage == "research":
            n = context.count("</tool_output>")
            return '<call_tool name="google_search">q</call_tool>' if n < 2 else "<review>x</review>"
        return "<answer>Latin.</answer>"

    out = asyncio.run(service(ScriptedPolicy(script), local_tools, log).run("q?", PAPER_SCAFFOLD))
    assert [c.error is not None for c in out.trajectory.tool_calls] == [True, True]  # google_search not configured
    assert out.trajectory.max_consecutive_tool_errors == 2
    assert log.get(out.session_id).trajectory.max_consecutive_tool_errors == 2


def test_policy_failure_mid_run_marks_the_session_failed_and_keeps_nothing_half_done(
    local_tools: dict, log: SessionLog  # type: ignore[type-arg]
) -> None:
    """A vLLM stand-in that renders prompts (/tokenize, /detokenize) but answers 500 on completions."""
    srv = LocalServer()
    srv.route("/tokenize", Reply.json({"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3], "token_strs": None}))
    srv.route("/detokenize", Reply.json({"prompt": "abc"}))
    srv.route("/v1/completions", Reply.json({"error": {"message": "boom", "type": "InternalServerError",
                                                          "param": None, "code": 500}}, status=500))
    policy = VLLMPolicyClient(srv.root, "policy", timeout_s=5.0, max_retries=1)
    try:
        with pytest.raises(RunFailedError) as info:
            asyncio.run(service(policy, local_tools, log).run("Which language?"))
    finally:
        srv.close()
    rec = log.get(info.value.session_id)
    assert rec.status == "failed" and "PolicyUnavailable" in (rec.error or "")
    assert rec.trajectory.turns == ()
    assert log.completed_unjudged() == []


def test_policy_server_unreachable_fails_before_any_session_is_written(local_tools: dict, log: SessionLog) -> None:  # type: ignore[type-arg]
    from agent.errors import PolicyUnavailable

    policy = VLLMPolicyClient(f"http://127.0.0.1:{free_port()}", "policy", timeout_s=2.0, max_retries=1)
    with pytest.raises(PolicyUnavailable):
        asyncio.run(service(policy, local_tools, log).run("Which language?"))
    assert log.list_sessions() == []


@pytest.mark.parametrize(
    ("question", "message"),
    [("", "the question is empty"), ("   \n\t", "the question is empty"),
     ("x" * 20_000, "the question is 20,000 characters long; the limit is")],
)
def test_bad_questions_are_refused_and_change_nothing(
    question: str, message: str, local_tools: dict, log: SessionLog  # type: ignore[type-arg]
) -> None:
    policy = ScriptedPolicy(lambda c, s: "<answer>x</answer>")
    with pytest.raises(InputError) as info:
        asyncio.run(service(policy, local_tools, log).run(question))
    assert message in str(info.value)
    assert policy.calls == [] and log.list_sessions() == []
