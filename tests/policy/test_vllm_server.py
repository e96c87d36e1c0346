"""VLLMPolicyClient's sleep-mode calls against the HTTP stand-in (tests/vllm_server.py): sleep mode needs a GPU, so
the real vLLM on this machine answers /sleep with 404 (that answer is tested against the real server in
tests/app/test_vllm_loop.py). Sessions, runtime LoRA, the hot swap and their errors are tested against the real
vLLM: tests/policy/test_vllm_contract.py and tests/app/test_vllm_loop.py. `research_script` is the scripted model
the remaining stand-in tests (replica failover, the UI runner) serve."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.config import RunOptions, StageTokenCaps
from agent.errors import PolicyRequestError
from agent.policy import VLLMPolicyClient
from agent.protocols import ChatMessage, Generation
from tests.vllm_server import SampleRequest, VLLMStandInServer

MESSAGES = [ChatMessage("user", "Who wrote Hamlet?")]
QUESTION = "What language were books being translated into during the era of Haymo of Faversham?"
SMALL = RunOptions(
    format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=120,
    token_caps=StageTokenCaps(plan=64, research=32, review=32, answer=32), context_tokens=4096,
    question_first=False,  # the script writes the one call itself: every stage has a sampled turn
)  # fmt: skip


def _client(server: VLLMStandInServer, model: str = "policy") -> VLLMPolicyClient:
    return VLLMPolicyClient(server.url, model, timeout_s=30, max_retries=1, backoff_s=0.01)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _ask(client: VLLMPolicyClient, **kw: Any) -> Generation:
    ctx = await client.render_prompt(MESSAGES)
    return await client.generate(ctx, stop=kw.pop("stop", []), max_tokens=kw.pop("max_tokens", 48), temperature=0.7,
                                 **kw)  # fmt: skip


def research_script(req: SampleRequest) -> str:
    """A "model" that follows the agent's tag protocol; every stage names the model that served it."""
    first = req.stop[0] if req.stop else ""
    if first == "</structured_plan>":
        return (f"<think>[{req.model}] Find the era of Haymo.</think>\n<structured_plan>Search the local documents "
                "for Haymo of Faversham.</structured_plan>\nleft over")  # fmt: skip
    if first == "</call_tool>" and "</review>" in req.stop:
        return '<call_tool name="local_search">Haymo of Faversham translation</call_tool>'
    if first == "</call_tool>":  # the graph forced the opening tag; only the query is sampled
        return "Haymo of Faversham</call_tool>"
    if first == "</review>":
        return f"[{req.model}] The snippets name the language.</review>"
    return f"<answer>Latin, says [{req.model}].</answer>"


# --- the whole research session -----------------------------------------------------------------------------------




# --- runtime LoRA -------------------------------------------------------------------------------------------------








# --- sleep mode ---------------------------------------------------------------------------------------------------


def test_sleep_queues_requests_until_fully_awake(vllm_server: VLLMStandInServer) -> None:
    """Queueing while asleep is the stand-in's engine (vLLM's documented behaviour); what is ours: the client's
    sleep/wake/is_sleeping calls, its argument checks (bad level, mode, tags), and that a request sent while the
    server sleeps is neither refused nor re-sent by our client (exactly one request reaches the server)."""
    client = _client(vllm_server)

    async def go() -> None:
        assert await client.is_sleeping() is False
        served_before = len(vllm_server.served)
        await client.sleep(level=1)
        assert await client.is_sleeping() is True
        pending = asyncio.create_task(_ask(client))
        assert await asyncio.to_thread(vllm_server.wait_queued, 1)  # it reached the server, which holds it
        assert not pending.done() and vllm_server.running == 0  # queued, not refused
        await client.wake_up(["weights"])
        assert await client.is_sleeping() is True  # the KV cache is still asleep
        assert vllm_server.queued == 1 and vllm_server.running == 0 and not pending.done()  # still held
        await client.wake_up(["kv_cache"])
        assert await client.is_sleeping() is False
        gen = await asyncio.wait_for(pending, 10)
        assert gen.finish_reason == "stop" and gen.text.startswith("[policy]")
        assert len(vllm_server.served) == served_before + 1  # our client sent it once: no retry while queued
        await client.sleep(level=0)  # pause scheduling only
        assert await client.is_sleeping() is True
        await client.wake_up(["scheduling"])
        assert await client.is_sleeping() is False
        for bad in (client.sleep(level=3), client.sleep(mode="later")):
            with pytest.raises(ValueError):
                await bad
        with pytest.raises(TypeError):
            await client.wake_up("weights")
        with pytest.raises(PolicyRequestError, match="tags"):
            await client.wake_up(["gpu"])
        await client.aclose()

    _run(go())


def test_sleep_wait_lets_running_requests_finish_and_abort_ends_them(smollm2_dir: Path) -> None:
    """Waiting and aborting are the stand-in's engine; what is ours: the client passes `mode` through, and turns an
    aborted completion into a Generation with finish_reason "abort" and the partial text (never an exception)."""
    with VLLMStandInServer(smollm2_dir, token_delay_s=0.05) as server:
        client = _client(server)

        async def go() -> tuple[list[Generation], list[Generation]]:
            waited = [asyncio.create_task(_ask(client)) for _ in range(3)]
            assert await asyncio.to_thread(server.wait_running, 3)
            await client.sleep(level=1, mode="wait")  # returns once the running requests are done
            assert server.running == 0 and [s.finish_reason for s in server.served] == ["stop"] * 3
            await asyncio.gather(*waited)
            await client.wake_up()
            aborted = [asyncio.create_task(_ask(client)) for _ in range(3)]
            assert await asyncio.to_thread(server.wait_running, 3)
            await client.sleep(level=1, mode="abort")
            out = await asyncio.gather(*aborted)
            await client.wake_up()
            await client.aclose()
            return [t.result() for t in waited], out

        waited, aborted = _run(go())
    assert all(g.finish_reason == "stop" and g.text.startswith("[policy]") for g in waited)
    assert all(g.finish_reason == "abort" for g in aborted)
    assert all(len(g.text) < len(waited[0].text) for g in aborted)


# --- the hot swap -------------------------------------------------------------------------------------------------





