"""`ReplicaSet` against two vLLM stand-in servers (tests/vllm_server.py): adapters loaded on every replica or
on none, a replica that fails the load or is down named without secrets, sessions spread over the replicas and kept
on one each, and requests that fail over to the other replica when theirs is down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.errors import PolicyRequestError, PolicyUnavailable, ReplicaError
from agent.policy import ReplicaSet, redact_url
from agent.protocols import ChatMessage, Generation, PolicyClient
from app.service import ResearchService
from store.session_log import SessionLog
from tests.policy.test_vllm_server import research_script
from tests.vllm_server import VLLMStandInServer

MESSAGES = [ChatMessage("user", "Who wrote Hamlet?")]
OPTIONS = RunOptions(
    format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=120,
    token_caps=StageTokenCaps(plan=64, research=32, review=32, answer=32), context_tokens=4096,
)  # fmt: skip
QUESTIONS = ("Which language did Haymo of Faversham write in?", "Where was the Franciscan order founded?")


@pytest.fixture
def pair(smollm2_dir: Path) -> Iterator[tuple[VLLMStandInServer, VLLMStandInServer]]:
    """Two replicas of one policy: the same tokenizer, served as `policy`, runtime LoRA updating on."""
    with VLLMStandInServer(smollm2_dir, script=research_script) as a, \
            VLLMStandInServer(smollm2_dir, script=research_script) as b:
        yield a, b


def _set(*urls: str, **kw: Any) -> ReplicaSet:
    kw = {"timeout_s": 30, "max_retries": 1, "backoff_s": 0.01, "backoff_max_s": 0.02} | kw
    return ReplicaSet(list(urls), "policy", **kw)


async def _ask(policy: ReplicaSet) -> Generation:
    ctx = await policy.render_prompt(MESSAGES)
    return await policy.generate(ctx, stop=["</answer>"], max_tokens=48, temperature=0.0)


def _completions(server: VLLMStandInServer) -> list[dict[str, Any]]:
    return [body for _, path, body in server.requests if path == "/v1/completions"]


def _questions_asked(server: VLLMStandInServer) -> set[str]:
    """The questions whose sessions sent completions to `server` (read from the token-id prompts it received)."""
    prompts = [server.tok.decode(body["prompt"]) for body in _completions(server)]
    return {q for q in QUESTIONS for p in prompts if q in p}


def test_a_load_one_replica_fails_is_taken_back_from_the_other_and_a_good_one_reaches_both(
    pair: tuple[VLLMStandInServer, VLLMStandInServer], tmp_path: Path
) -> None:
    a, b = pair
    path = a.add_adapter_dir(tmp_path / "adapters" / "policy@1")  # one shared folder, as the compose volume is
    b.fail_lora_loads = "CUDA out of memory while loading the LoRA weights"
    policy = _set(a.url, b.url)

    async def go() -> None:
        with pytest.raises(ReplicaError) as info:
            await policy.aload_adapter(path, "policy@1")
        err = info.value
        assert set(err.failures) == {b.url} and "CUDA out of memory" in err.failures[b.url]
        assert err.undone == (a.url,) and b.url in str(err) and "unloaded it again from " + a.url in str(err)
        assert policy.model == "policy" and await policy.list_models() == ["policy"]  # nothing new anywhere
        gen = await _ask(policy)
        assert gen.policy_version == "policy"  # still serving the previous version

        b.fail_lora_loads = None
        await policy.aload_adapter(path, "policy@1")
        assert policy.model == "policy@1"
        assert await policy.listed() == {a.url: ["policy", "policy@1"], b.url: ["policy", "policy@1"]}
        for _ in range(2):  # two sessions, each in a task of its own: one per replica
            assert (await asyncio.create_task(_ask(policy))).policy_version == "policy@1"
        await policy.aload_adapter(path, "policy@1")  # publishing it again is a no-op everywhere

        await policy.aunload_adapter()  # back to the base model, then the adapter goes from both
        assert policy.model == "policy" and await policy.list_models() == ["policy"]
        await policy.aclose()

    asyncio.run(go())
    assert [(kind, name) for _, kind, name in a.lora_events] == [
        ("load", "policy@1"), ("unload", "policy@1"), ("load", "policy@1"), ("unload", "policy@1")]
    assert [(kind, name) for _, kind, name in b.lora_events] == [("load", "policy@1"), ("unload", "policy@1")]
    assert [s.model for s in a.served if s.model == "policy@1"] and [s.model for s in b.served if s.model == "policy@1"]


def test_a_replica_down_at_load_is_named_without_secrets_and_nothing_stays_loaded(
    smollm2_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-REPLICA-SECRET-1234"
    with VLLMStandInServer(smollm2_dir, api_key=key) as a, VLLMStandInServer(smollm2_dir, api_key=key) as b:
        path = a.add_adapter_dir(tmp_path / "policy@1")
        b.stop()  # down: connections are refused
        down = b.url.replace("http://", "http://admin:hunter2-pw@")  # credentials in the configured URL
        policy = _set(a.url, down, api_key=key)
        assert policy.replica_urls == (a.url, b.url)

        async def go() -> ReplicaError:
            with pytest.raises(ReplicaError) as info:
                await policy.aload_adapter(path, "policy@1")
            await policy.aclose()
            return info.value

        with caplog.at_level(logging.DEBUG):
            err = asyncio.run(go())
        assert set(err.failures) == {b.url} and "cannot reach" in err.failures[b.url]
        assert err.undone == (a.url,) and a.adapters == {}
        assert [(kind, name) for _, kind, name in a.lora_events] == [("load", "policy@1"), ("unload", "policy@1")]
    shown = str(err) + " ".join(err.failures.values()) + caplog.text
    assert b.url in str(err) and "hunter2" not in shown and "admin:" not in shown and key not in shown


def test_sessions_spread_over_the_replicas_and_each_stays_on_one(
    pair: tuple[VLLMStandInServer, VLLMStandInServer], tmp_path: Path
) -> None:
    """Two sessions in a row: each one's requests all reach one replica (its prefix cache), and the two sessions
    reach different replicas."""
    a, b = pair
    log = SessionLog(tmp_path / "s.sqlite3")
    policy = _set(a.url, b.url)
    service = ResearchService(policy, {}, log, AgentConfig())

    async def go() -> list[str]:
        try:
            return [(await service.run(q, OPTIONS)).session_id for q in QUESTIONS]
        finally:
            await policy.aclose()

    sids = asyncio.run(go())
    assert [log.get(s).status for s in sids] == ["completed", "completed"]
    asked = {server.url: _questions_asked(server) for server in (a, b)}
    assert sorted(len(v) for v in asked.values()) == [1, 1] and asked[a.url] != asked[b.url]
    for server in (a, b):  # the replica's every completion continued its one session's prompt
        prompts = [server.tok.decode(body["prompt"]) for body in _completions(server)]
        assert prompts and all(next(iter(asked[server.url])) in p for p in prompts)


def test_a_session_completes_on_the_other_replica_when_one_is_down(
    pair: tuple[VLLMStandInServer, VLLMStandInServer], tmp_path: Path
) -> None:
    a, b = pair
    a.stop()
    log = SessionLog(tmp_path / "s.sqlite3")
    policy = _set(a.url, b.url)
    service = ResearchService(policy, {}, log, AgentConfig())

    async def go() -> list[Any]:
        try:
            return [await service.run(q, OPTIONS) for q in QUESTIONS]
        finally:
            await policy.aclose()

    outs = asyncio.run(go())
    assert [log.get(o.session_id).status for o in outs] == ["completed", "completed"]
    assert all("Latin, says [policy]" in o.report.markdown for o in outs)
    assert _questions_asked(b) == set(QUESTIONS)  # both sessions were answered by the other replica
    assert "cannot reach" in (policy.health()[a.url] or "") and policy.health()[b.url] is None


def test_a_request_fails_over_when_its_replica_goes_down_and_returns_when_it_is_back(
    pair: tuple[VLLMStandInServer, VLLMStandInServer], smollm2_dir: Path
) -> None:
    """Mid-session: the replica the session was on goes down; the next request is answered by the other (same ids:
    same base model and tokenizer), the caller sees no error; once that replica is back (a restart) it is used again."""
    servers = list(pair)
    policy = _set(*(s.url for s in servers), cooldown_s=1e-6)

    async def go() -> None:
        ctx = await policy.render_prompt(MESSAGES)
        first = await policy.generate(ctx, stop=[], max_tokens=48, temperature=0.0)
        on = next(s for s in servers if len(_completions(s)) == 1)
        other = next(s for s in servers if s is not on)
        port = int(on.url.rsplit(":", 1)[1])
        on.stop()
        second = await policy.generate(ctx, stop=[], max_tokens=48, temperature=0.0)
        assert second.token_ids == first.token_ids and second.policy_version == first.policy_version
        assert len(_completions(other)) == 1
        restarted = VLLMStandInServer(smollm2_dir, script=research_script).start(port=port)
        try:
            third = await policy.generate(ctx, stop=[], max_tokens=48, temperature=0.0)
            assert third.token_ids == first.token_ids
            assert len(_completions(restarted)) == 1 and len(_completions(other)) == 1  # back on its replica
        finally:
            restarted.stop()
            await policy.aclose()

    asyncio.run(go())


def test_when_no_replica_can_answer_the_error_names_each_and_a_missing_model_is_not_retried(
    pair: tuple[VLLMStandInServer, VLLMStandInServer]
) -> None:
    a, b = pair
    policy = _set(a.url, b.url, max_retries=2)

    async def go() -> None:
        ctx = await policy.render_prompt(MESSAGES)
        policy.set_model("policy@9")  # no replica serves it
        with pytest.raises(PolicyRequestError, match="no policy replica could answer") as info:
            await policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0)
        assert info.value.status_code == 404 and a.url in str(info.value) and b.url in str(info.value)
        assert len(_completions(a)) == len(_completions(b)) == 1  # a 404 everywhere is not retried in rounds
        policy.set_model("policy")
        a.stop()
        b.stop()
        with pytest.raises(PolicyUnavailable, match="no policy replica could answer") as down:
            await policy.generate(ctx, stop=[], max_tokens=8, temperature=0.0)
        assert a.url in str(down.value) and b.url in str(down.value)
        with pytest.raises(ReplicaError) as listing:
            await policy.list_models()
        assert set(listing.value.failures) == {a.url, b.url}
        await policy.aclose()

    asyncio.run(go())


def test_sleep_and_wake_reach_every_replica(pair: tuple[VLLMStandInServer, VLLMStandInServer]) -> None:
    a, b = pair
    policy = _set(a.url, b.url)

    async def go() -> None:
        await policy.sleep(level=1)
        assert await policy.is_sleeping() is True
        assert a.engine.asleep and b.engine.asleep
        await policy.wake_up()
        assert await policy.is_sleeping() is False
        await policy.aclose()

    asyncio.run(go())


def test_redact_url_keeps_only_scheme_host_port_and_path() -> None:
    assert isinstance(ReplicaSet(["http://a:1", "http://b:1"], "policy"), PolicyClient)
    assert redact_url("http://user:pw@vllm-2:8000/?token=x#f") == "http://vllm-2:8000"
    assert redact_url("https://[::1]:9000/serve/") == "https://[::1]:9000/serve"
    with pytest.raises(ValueError, match="once"):
        ReplicaSet(["http://a:1", "http://u:p@a:1/"], "policy")
