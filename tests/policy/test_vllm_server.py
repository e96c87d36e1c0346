"""VLLMPolicyClient against a real HTTP stand-in for vLLM 0.33.0 (tests/vllm_server.py): a whole research session,
runtime LoRA load/unload, sleep/wake, their error cases, and the hot swap under 20 concurrent requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.errors import ContextTooLong, PolicyRequestError, PolicyUnavailable
from agent.policy import VLLMPolicyClient
from agent.protocols import ChatMessage, Generation, PromptContext
from app.service import ResearchService
from store.records import STAGES
from store.session_log import SessionLog
from tests.vllm_server import SampleRequest, VLLMStandInServer

MESSAGES = [ChatMessage("user", "Who wrote Hamlet?")]
QUESTION = "What language were books being translated into during the era of Haymo of Faversham?"
SMALL = RunOptions(
    format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=120,
    token_caps=StageTokenCaps(plan=64, research=32, review=32, answer=32), context_tokens=8192,
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


@pytest.mark.slow
def test_research_session_runs_on_a_runtime_loaded_adapter(
    smollm2_dir: Path, local_tools: dict[str, Any], tmp_path: Path
) -> None:
    log = SessionLog(tmp_path / "s.sqlite3")
    adapter = tmp_path / "adapters" / "policy@1"
    with VLLMStandInServer(smollm2_dir, script=research_script) as server:
        server.add_adapter_dir(adapter)
        client = _client(server)

        async def go() -> Any:
            try:
                await client.aload_adapter(adapter, "policy@1")
                service = ResearchService(client, local_tools, log, AgentConfig())
                return await service.run(QUESTION, SMALL)
            finally:
                await client.aclose()

        out = _run(go())
        bodies = [b for _, p, b in server.requests if p == "/v1/completions"]
    rec = log.get(out.session_id)
    assert rec.status == "completed" and out.policy_version == "policy@1"
    traj = rec.trajectory
    assert not traj.malformed and len(traj.tool_calls) == 1
    sampled = [t for t in traj.turns if t.kind == "sampled"]
    assert {t.stage for t in sampled} == set(STAGES)
    assert all(t.policy_version == "policy@1" and t.token_source == "server" for t in sampled)
    assert all(len(t.logprobs) == len(t.token_ids) > 0 for t in sampled)
    assert all(server._decode(t.token_ids) == t.text for t in sampled)  # the exact sampled ids
    assert "[policy@1]" in next(t.text for t in sampled if t.stage == "answer")
    assert "Latin" in out.report.markdown
    assert bodies and all(b["model"] == "policy@1" and isinstance(b["prompt"][0], int) for b in bodies)


# --- runtime LoRA -------------------------------------------------------------------------------------------------


def test_load_list_generate_unload_round_trip(vllm_server: VLLMStandInServer, tmp_path: Path) -> None:
    path = vllm_server.add_adapter_dir(tmp_path / "policy@1")
    client = _client(vllm_server)

    async def go() -> None:
        assert await client.list_models() == ["policy"]
        assert (await _ask(client)).text.startswith("[policy] ")
        await client.aload_adapter(path, "policy@1")
        assert client.model == "policy@1" and await client.list_models() == ["policy", "policy@1"]
        card = (await asyncio.to_thread(httpx.get, f"{vllm_server.url}/v1/models")).json()["data"][1]
        assert (card["root"], card["parent"], card["max_model_len"]) == (str(path), "policy", None)
        gen = await _ask(client)
        assert gen.text.startswith("[policy@1] ") and gen.policy_version == "policy@1"
        await client.aload_adapter(path, "policy@1")  # publishing the same version again is a no-op
        await client.aunload_adapter()  # back to the parent, then the adapter goes
        assert client.model == "policy" and await client.list_models() == ["policy"]
        assert (await _ask(client)).policy_version == "policy"
        await client.aunload_adapter()  # already on the base model: nothing to do
        await client.aclose()

    _run(go())
    assert [(kind, name) for _, kind, name in vllm_server.lora_events] == [("load", "policy@1"), ("unload", "policy@1")]


def test_lora_error_cases(vllm_server: VLLMStandInServer, tmp_path: Path) -> None:
    good = vllm_server.add_adapter_dir(tmp_path / "good")
    other = vllm_server.add_adapter_dir(tmp_path / "other")
    empty = tmp_path / "empty"
    empty.mkdir()
    too_big = vllm_server.add_adapter_dir(tmp_path / "big", rank=64)
    client = _client(vllm_server)

    async def go() -> None:
        with pytest.raises(PolicyRequestError, match="No adapter found for") as info:
            await client.aload_adapter(tmp_path / "missing", "policy@1")
        assert info.value.status_code == 404
        with pytest.raises(PolicyRequestError, match="No adapter found for"):
            await client.load_lora_adapter("policy@1", empty)  # a folder without adapter_config.json
        with pytest.raises(PolicyUnavailable, match="max_lora_rank"):
            await client.aload_adapter(too_big, "policy@1")
        assert client.model == "policy"  # a failed publish keeps the previous version
        await client.load_lora_adapter("policy@1", good)
        with pytest.raises(PolicyRequestError, match="already been loaded") as info:
            await client.load_lora_adapter("policy@1", good)
        assert info.value.status_code == 400
        with pytest.raises(PolicyRequestError, match="already been loaded"):
            await client.aload_adapter(other, "policy@1")  # the same name from another folder is not a repeat
        await client.load_lora_adapter("policy@1", other, load_inplace=True)
        with pytest.raises(PolicyRequestError) as info:
            await client.load_lora_adapter("policy", good)  # the base model's name
        assert info.value.status_code == 400
        with pytest.raises(PolicyRequestError, match="cannot be found") as info:
            await client.unload_lora_adapter("policy@9")
        assert info.value.status_code == 404
        client.set_model("policy@9")
        with pytest.raises(PolicyRequestError, match="does not exist") as info:
            await _ask(client)
        assert info.value.status_code == 404
        with pytest.raises(ValueError):
            await client.load_lora_adapter("", good)
        with pytest.raises(ValueError):
            await client.unload_lora_adapter("")
        await client.aclose()

    _run(go())
    assert vllm_server.adapters == {"policy@1": str(other)}


def test_servers_without_runtime_updating_sleep_mode_or_lora(smollm2_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "a"
    with VLLMStandInServer(smollm2_dir, runtime_lora_updating=False, dev_mode=False) as server:
        server.add_adapter_dir(path)
        client = _client(server)

        async def closed_routes() -> None:
            with pytest.raises(PolicyRequestError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1") as info:
                await client.aload_adapter(path, "policy@1")
            assert info.value.status_code == 404 and client.model == "policy"
            with pytest.raises(PolicyRequestError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
                await client.unload_lora_adapter("policy@1")
            for call in (client.sleep(), client.wake_up(), client.is_sleeping()):
                with pytest.raises(PolicyRequestError, match="VLLM_SERVER_DEV_MODE=1"):
                    await call
            assert (await _ask(client)).text.startswith("[policy]")  # serving itself is unaffected
            await client.aclose()

        _run(closed_routes())
    with VLLMStandInServer(smollm2_dir, enable_lora=False) as server:
        client = _client(server)
        with pytest.raises(PolicyUnavailable, match="--enable-lora"):
            _run(client.aload_adapter(path, "policy@1"))


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
        await asyncio.sleep(0.3)
        assert not pending.done() and vllm_server.running == 0  # queued, not refused
        await client.wake_up(["weights"])
        assert await client.is_sleeping() is True  # the KV cache is still asleep
        await asyncio.sleep(0.1)
        assert not pending.done()
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


def test_hot_swap_under_20_concurrent_requests_loses_none(smollm2_dir: Path, tmp_path: Path) -> None:
    """Serving two adapters at once is the stand-in's engine; what is ours: the client loads the new adapter before
    it flips its model name, so every request already sent stays on policy@1 (the model name each request carried,
    as the server recorded it) and every later one names policy@2; each Generation reports the version it ran on;
    unloading the old name after the grace period leaves a request that still names it a typed error."""
    with VLLMStandInServer(smollm2_dir, token_delay_s=0.05, load_delay_s=0.05) as server:
        old = server.add_adapter_dir(tmp_path / "policy@1")
        new = server.add_adapter_dir(tmp_path / "policy@2")
        client = _client(server)

        async def go() -> tuple[list[Generation], list[Generation], list[str]]:
            await client.aload_adapter(old, "policy@1")
            ctx = await client.render_prompt(MESSAGES)

            def ask(seed: int) -> asyncio.Task[Generation]:
                return asyncio.create_task(client.generate(ctx, stop=["</answer>"], max_tokens=48, temperature=0.7,
                                                           seed=seed))  # fmt: skip

            before = [ask(i) for i in range(20)]
            assert await asyncio.to_thread(server.wait_running, 20), "the 20 requests never ran together"
            await client.aload_adapter(new, "policy@2")  # load the new version and flip, all 20 still running
            after = [ask(100 + i) for i in range(5)]
            done_before = await asyncio.gather(*before)
            await client.unload_lora_adapter("policy@1")  # the grace period: nothing sends policy@1 any more
            done_after = await asyncio.gather(*after)
            models = await client.list_models()
            client.set_model("policy@1")
            with pytest.raises(PolicyRequestError, match="does not exist"):
                await client.generate(ctx, stop=[], max_tokens=4, temperature=0.0)
            await client.aclose()
            return done_before, done_after, models

        before, after, models = _run(go())
        served, events = list(server.served), list(server.lora_events)
    assert len(before) == 20 and len(after) == 5  # none lost
    assert all(g.policy_version == "policy@1" and g.text.startswith("[policy@1] ") for g in before)
    assert all(g.finish_reason == "stop" and g.token_ids and len(g.logprobs) == len(g.token_ids) for g in before)
    assert all(g.policy_version == "policy@2" and g.text.startswith("[policy@2] ") for g in after)
    assert models == ["policy", "policy@2"]
    loaded = next(t for t, kind, name in events if (kind, name) == ("load", "policy@2"))
    unloaded = next(t for t, kind, name in events if (kind, name) == ("unload", "policy@1"))
    on_old = [s for s in served if s.model == "policy@1"]
    assert len(on_old) == 20 and all(s.finish_reason == "stop" for s in on_old)
    assert all(s.admitted < loaded < s.finished for s in on_old), "the swap did not overlap the requests in flight"
    assert all(s.finished < unloaded for s in on_old)
    assert sum(s.model == "policy@2" for s in served) == 5


def test_unload_does_not_cut_requests_already_running(smollm2_dir: Path, tmp_path: Path) -> None:
    """Finishing requests on an unloaded adapter is the stand-in's engine; what is ours: `aunload_adapter` flips the
    client back to the base name before it unloads, and the running requests report the version they started on."""
    with VLLMStandInServer(smollm2_dir, token_delay_s=0.05) as server:
        path = server.add_adapter_dir(tmp_path / "policy@1")
        client = _client(server)

        async def go() -> list[Generation]:
            await client.aload_adapter(path, "policy@1")
            running = [asyncio.create_task(_ask(client)) for _ in range(4)]
            assert await asyncio.to_thread(server.wait_running, 4)
            await client.aunload_adapter()  # flips back to the base model, then unloads policy@1 mid-flight
            assert client.model == "policy" and client.policy_version == "policy"
            out = await asyncio.gather(*running)
            after = await _ask(client)
            assert after.policy_version == "policy" and after.text.startswith("[policy] ")
            await client.aclose()
            return out

        out = _run(go())
    assert all(g.policy_version == "policy@1" and g.text.startswith("[policy@1] ") for g in out)
    assert all(g.finish_reason == "stop" for g in out)


def test_token_id_prompts_stop_strings_and_tokenizer_routes(vllm_server: VLLMStandInServer) -> None:
    """The completion semantics the client relies on (API_FACTS §1, §3), straight over HTTP."""
    url = vllm_server.url
    ids = httpx.post(f"{url}/tokenize", json={"prompt": "Hello there", "add_special_tokens": False}).json()["tokens"]
    assert httpx.post(f"{url}/detokenize", json={"tokens": ids}).json() == {"prompt": "Hello there"}
    body = {"prompt": ids, "max_tokens": 32, "stop": ["fixed"], "logprobs": 2, "return_token_ids": True}
    choice = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == "[policy] answers with its " and choice["stop_reason"] == "fixed"
    assert vllm_server._decode(choice["token_ids"]).endswith("fixed")  # the ids run through the stop string
    assert choice["prompt_token_ids"] == ids and len(choice["logprobs"]["top_logprobs"][0]) == 3
    keep = httpx.post(f"{url}/v1/completions", json=body | {"include_stop_str_in_output": True}).json()
    assert keep["choices"][0]["text"] == "[policy] answers with its fixed"
    eos = httpx.post(f"{url}/v1/completions", json={"prompt": ids, "max_tokens": 64, "return_token_ids": True}).json()
    assert eos["choices"][0]["finish_reason"] == "stop" and eos["choices"][0]["stop_reason"] is None
    assert eos["choices"][0]["token_ids"][-1] == vllm_server.tok.eos_token_id
    short = httpx.post(f"{url}/v1/completions", json={"prompt": ids, "max_tokens": 3}).json()
    assert short["choices"][0]["finish_reason"] == "length" and short["usage"]["completion_tokens"] == 3
    assert short["choices"][0]["token_ids"] is None
    too_many = httpx.post(f"{url}/v1/completions", json={"prompt": ids, "stop": list("abcde")})
    assert too_many.status_code == 400
    assert httpx.post(f"{url}/v1/completions", json={"prompt": ""}).status_code == 400
    assert httpx.post(f"{url}/v1/completions", json={"prompt": ids, "model": "x"}).status_code == 404
    assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/version").json() == {"version": "0.33.0"}
    ctx = PromptContext("", tuple([5] * 8192))
    client = VLLMPolicyClient(url, "policy", max_retries=0)
    with pytest.raises(ContextTooLong):
        _run(client.generate(ctx, stop=[], max_tokens=4, temperature=0.0))
