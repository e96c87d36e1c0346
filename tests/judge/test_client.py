"""JudgeClient against a real local OpenAI-format HTTP stand-in (scripted faults) and a real llama.cpp server."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, SecretStr

from learning.config import JudgeConfig
from learning.errors import JudgeOutputInvalid, JudgeRequestError, JudgeUnavailable
from learning.judge.cache import JudgeCache, cache_key
from learning.judge.client import JudgeClient, chat_completions_url, extract_json
from learning.judge.types import JsonJudge, Usage
from tests.judge.openai_standin import OpenAIStandIn, Reply

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}, "score": {"type": "integer"}},
    "required": ["verdict", "score"],
    "additionalProperties": False,
}
MESSAGES = [
    {"role": "system", "content": "You grade answers."},
    {"role": "user", "content": "Is 2+2=4? Give a verdict and a score 0-2."},
]
GOOD = '{"verdict": "yes", "score": 2}'
FAST: dict[str, Any] = {"backoff_s": 0.01, "backoff_max_s": 0.05}
# Timeouts are tested with a held reply (answered only after the test), so the timeout is certain to fire; its value only
# has to leave the answered requests ample time on a loaded machine.
TIMEOUT_S = 2.0
_RETRY_LOG = re.compile(r"judge request failed \((.+)\); retry (\d+)/(\d+) in ([\d.]+)s")


def retries_logged(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int, float]]:
    """(reason, retry number, pause in seconds) of each retry the client logged, in order."""
    found = (_RETRY_LOG.fullmatch(r.getMessage()) for r in caplog.records if r.name == "learning.judge.client")
    return [(m[1], int(m[2]), float(m[4])) for m in found if m]


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    verdict: str
    score: int


def _client(standin: OpenAIStandIn, **kw: Any) -> JudgeClient:
    return JudgeClient(standin.root, "judge-m", **{**FAST, **kw})


def _ask(client: JudgeClient, **kw: Any) -> Any:
    async def go() -> Any:
        try:
            return await client.complete_json(MESSAGES, SCHEMA, name="verdict", **kw)
        finally:
            await client.aclose()

    return asyncio.run(go())


# --- parsing and repair ---------------------------------------------------------------------------------------


def test_extract_json_is_strict_but_tolerates_fences_and_prose() -> None:
    assert extract_json(GOOD) == {"verdict": "yes", "score": 2}
    assert extract_json(f"```json\n{GOOD}\n```") == {"verdict": "yes", "score": 2}
    assert extract_json(f"Sure! Here it is: {GOOD} Hope that helps {{.") == {"verdict": "yes", "score": 2}
    assert extract_json('noise {not json} then {"a": {"b": 1}} end') == {"a": {"b": 1}}
    for bad in ["", "   ", "yes", '{"verdict": "yes"', '{"x": NaN}', "[1, 2"]:
        with pytest.raises(ValueError):
            extract_json(bad)


def test_not_json_is_repaired_on_retry(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push("I think the verdict is yes.")
    openai_standin.push(GOOD)
    call = _ask(_client(openai_standin))
    assert call.data == {"verdict": "yes", "score": 2}
    assert call.repaired and not call.cached and call.usage.calls == 2
    second = openai_standin.chat_requests[1].json["messages"]
    assert second[-2] == {"role": "assistant", "content": "I think the verdict is yes."}
    assert second[-1]["role"] == "user" and "not valid JSON" in second[-1]["content"]
    assert '"required":["verdict","score"]' in second[-1]["content"]  # the schema is quoted back


def test_fenced_answer_needs_no_repair(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(f"Here you go:\n```json\n{GOOD}\n```")
    call = _ask(_client(openai_standin))
    assert call.data == {"verdict": "yes", "score": 2} and not call.repaired
    assert len(openai_standin.chat_requests) == 1


def test_wrong_shape_is_repaired_and_validator_result_is_the_data(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push('{"verdict": "yes", "score": "two", "extra": 1}')
    openai_standin.push(GOOD)
    call = _ask(_client(openai_standin), validate=Verdict.model_validate)
    assert call.data == Verdict(verdict="yes", score=2) and call.repaired
    assert "wrong shape" in openai_standin.chat_requests[1].json["messages"][-1]["content"]


def test_missing_required_key_triggers_repair_without_validator(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push('{"verdict": "yes"}')
    openai_standin.push(GOOD)
    call = _ask(_client(openai_standin))
    assert call.repaired and call.data["score"] == 2
    assert "missing required keys: score" in openai_standin.chat_requests[1].json["messages"][-1]["content"]


def test_twice_bad_raises_output_invalid_and_counts_usage(openai_standin: OpenAIStandIn, tmp_path: Path) -> None:
    openai_standin.push("nope")
    openai_standin.push("", finish_reason="length")  # empty and cut off
    client = _client(openai_standin, cache_dir=tmp_path)
    with pytest.raises(JudgeOutputInvalid, match="invalid after one repair retry") as failed:
        _ask(client)
    assert client.usage.calls == 2  # billed requests are counted even when the answer is useless
    assert failed.value.usage == client.usage  # and the error carries them to the caller's run summary
    assert not list(tmp_path.rglob("*.json"))  # invalid answers are never cached


# --- HTTP faults -------------------------------------------------------------------------------------------------


def test_500s_then_200_succeeds(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(status=500, times=3)
    openai_standin.push(GOOD)
    call = _ask(_client(openai_standin, max_retries=5))
    assert call.data["verdict"] == "yes" and call.usage.calls == 1
    assert len(openai_standin.chat_requests) == 4


def test_500_forever_is_unavailable_after_bounded_retries_and_pauses(
    openai_standin: OpenAIStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    """Bounded time without a clock: exactly max_retries + 1 attempts, and every pause the client chose is within its
    doubling-and-capped backoff (checked on the pauses it logged, not on elapsed seconds)."""
    openai_standin.responder = lambda req: Reply(status=503)
    caplog.set_level(logging.WARNING, logger="learning.judge.client")
    with pytest.raises(JudgeUnavailable, match="after 4 attempts: HTTP 503"):
        _ask(_client(openai_standin, max_retries=3, backoff_s=0.04, backoff_max_s=0.05))
    assert len(openai_standin.chat_requests) == 4
    retries = retries_logged(caplog)
    assert [(reason, n) for reason, n, _ in retries] == [("HTTP 503", 1), ("HTTP 503", 2), ("HTTP 503", 3)]
    caps = [0.04, 0.05, 0.05]  # min(backoff_max_s, backoff_s * 2**attempt); equal jitter keeps a pause in [cap/2, cap]
    for (_, _, pause), cap in zip(retries, caps, strict=True):
        assert cap / 2 - 0.005 <= pause <= cap + 0.005  # the log rounds to 0.01 s


def test_429_honours_retry_after(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(status=429, headers={"Retry-After": "0.4"})
    openai_standin.push(GOOD)
    start = time.monotonic()
    call = _ask(_client(openai_standin))
    assert call.data["score"] == 2
    assert time.monotonic() - start >= 0.4  # the computed backoff alone would be ~0.01 s


def test_timeout_and_malformed_body_are_retried(
    openai_standin: OpenAIStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    answer = threading.Event()
    openai_standin.push(GOOD, hold=answer)  # answered only after the test: the client's timeout is certain to fire
    openai_standin.push(body="<html>gateway</html>")  # 200 that is not a chat.completion
    openai_standin.push(GOOD)
    caplog.set_level(logging.WARNING, logger="learning.judge.client")
    try:
        call = _ask(_client(openai_standin, timeout_s=TIMEOUT_S))
    finally:
        answer.set()
    assert call.data["verdict"] == "yes" and call.usage.calls == 1
    assert len(openai_standin.chat_requests) == 3
    timed_out, malformed = (reason for reason, _, _ in retries_logged(caplog))
    assert timed_out in ("TimeoutError", "ReadTimeout")  # the call's own limit or httpx's read limit, both timeout_s
    assert malformed == "HTTP 200 with a malformed chat.completion body"


def test_connection_refused_is_unavailable() -> None:
    with OpenAIStandIn() as standin:
        root = standin.root
    client = JudgeClient(root, "m", max_retries=1, **FAST)  # nothing listens there any more
    with pytest.raises(JudgeUnavailable, match="ConnectError"):
        _ask(client)


def test_401_is_request_error_and_never_leaks_the_key() -> None:
    key = "sk-secret-123456"
    with OpenAIStandIn(api_key=key) as standin:
        client = _client(standin, api_key="sk-wrong-999999")
        with pytest.raises(JudgeRequestError) as info:
            _ask(client)
        assert "401" in str(info.value) and "sk-wrong-999999" not in str(info.value)
        assert "sk-wrong" not in repr(client)
        assert len(standin.chat_requests) == 1  # 401 is not retried

        standin.push(status=403, error_message=f"key {key} is not allowed")  # a server echoing the key back
        with pytest.raises(JudgeRequestError) as info:
            _ask(_client(standin, api_key=key))
        assert key not in str(info.value) and "***" in str(info.value)

        standin.push(GOOD)
        assert _ask(_client(standin, api_key=key)).data["score"] == 2
        assert standin.chat_requests[-1].headers["Authorization"] == f"Bearer {key}"


# --- JSON modes and the downgrade ----------------------------------------------------------------------------------


def test_400_on_json_schema_downgrades_and_remembers(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(status=400, error_message="Invalid parameter: 'response_format' of type 'json_schema'")
    openai_standin.push(GOOD)
    openai_standin.push(GOOD)
    client = _client(openai_standin)

    async def go() -> None:
        await client.complete_json(MESSAGES, SCHEMA, name="verdict")
        await client.complete_json(MESSAGES, SCHEMA, name="verdict", temperature=0.5)
        await client.aclose()

    asyncio.run(go())
    first, second, third = (r.json for r in openai_standin.chat_requests)
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True},
    }
    assert second["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert "JSON Schema" in second["messages"][0]["content"]  # schema described in the one system message
    assert second["messages"][0]["content"].startswith("You grade answers.")
    assert third["response_format"]["type"] == "json_object"  # the downgrade is remembered
    assert client.effective_json_mode == "json_object" and client.json_mode == "json_schema"


def test_500_naming_response_format_downgrades_like_llama_cpp_python(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(status=500, error_message="validation error: ('body', 'response_format', 'type')")
    openai_standin.push(GOOD)
    client = _client(openai_standin)
    assert _ask(client).data["score"] == 2
    assert client.effective_json_mode == "json_object"
    assert len(openai_standin.chat_requests) == 2  # not retried as a transient 500


def test_400_in_every_mode_is_request_error_and_keeps_the_mode(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = lambda req: Reply(status=400, error_message="prompt is too long")
    client = _client(openai_standin)
    with pytest.raises(JudgeRequestError, match="prompt is too long"):
        _ask(client)
    modes = [r.json.get("response_format", {}).get("type") for r in openai_standin.chat_requests]
    assert modes == ["json_schema", "json_object", None]
    assert client.effective_json_mode == "json_schema"


def test_prompt_mode_sends_no_response_format(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(GOOD)
    _ask(JudgeClient(openai_standin.root, "m", json_mode="prompt"), max_tokens=99, temperature=0.3)
    body = openai_standin.chat_requests[0].json
    assert "response_format" not in body
    assert body["max_tokens"] == 99 and body["temperature"] == 0.3 and body["model"] == "m"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert '"enum":["yes","no"]' in body["messages"][0]["content"]


def test_max_completion_tokens_switch(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push(
        status=400,
        error_message="Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead.",
    )
    openai_standin.push(GOOD)
    client = _client(openai_standin)
    assert _ask(client).data["score"] == 2
    second = openai_standin.chat_requests[1].json
    assert second["max_completion_tokens"] == 2048 and "max_tokens" not in second
    assert client.effective_json_mode == "json_schema"


# --- URLs and config ---------------------------------------------------------------------------------------------


def test_chat_completions_url_rules() -> None:
    assert chat_completions_url("http://127.0.0.1:8002") == "http://127.0.0.1:8002/v1/chat/completions"
    assert chat_completions_url("http://h:1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://api.openai.com/v1/") == "https://api.openai.com/v1/chat/completions"
    gemini = "https://generativelanguage.googleapis.com/v1beta/openai"
    assert chat_completions_url(gemini) == gemini + "/chat/completions"
    assert chat_completions_url(gemini + "/chat/completions/") == gemini + "/chat/completions"


def test_bad_constructor_arguments_are_value_errors() -> None:
    bad: list[dict[str, Any]] = [{"json_mode": "xml"}, {"concurrency": 0}, {"max_retries": -1}, {"timeout_s": 0}]
    for kwargs in bad:
        with pytest.raises(ValueError):
            JudgeClient("http://127.0.0.1:1", "m", **kwargs)
    with pytest.raises(ValueError, match="http"):
        JudgeClient("127.0.0.1:8002", "m")


def test_api_base_forms_reach_the_server(openai_standin: OpenAIStandIn) -> None:
    for base, path in [("", "/v1/chat/completions"), ("/v1", "/v1/chat/completions"),
                       ("/v1beta/openai/", "/v1beta/openai/chat/completions")]:  # fmt: skip
        openai_standin.push(GOOD)
        _ask(JudgeClient(openai_standin.root + base, "m"))
        assert openai_standin.chat_requests[-1].path == path


def test_from_config(openai_standin: OpenAIStandIn, tmp_path: Path) -> None:
    cfg = JudgeConfig(base_url=openai_standin.root, model="cfg-model", api_key=SecretStr("sk-cfg"), concurrency=3)
    client = JudgeClient.from_config(cfg, tmp_path)
    judge: JsonJudge = client  # the protocol is static-only (not runtime_checkable)
    assert judge.model == "cfg-model"
    assert client.model == "cfg-model" and client.concurrency == 3 and client._cache is not None
    openai_standin.push(GOOD)
    _ask(client)
    assert openai_standin.chat_requests[0].headers["Authorization"] == "Bearer sk-cfg"
    assert JudgeClient.from_config(cfg.model_copy(update={"cache": False}), tmp_path)._cache is None
    with pytest.raises(ValueError, match="base_url"):
        JudgeClient.from_config(JudgeConfig(), tmp_path)


# --- cache and accounting ----------------------------------------------------------------------------------------


def test_cache_hit_sends_no_request_and_corrupt_entry_is_a_miss(openai_standin: OpenAIStandIn, tmp_path: Path) -> None:
    openai_standin.push(GOOD, usage={"prompt_tokens": 100, "completion_tokens": 10})
    openai_standin.push(GOOD, usage={"prompt_tokens": 100, "completion_tokens": 10})
    client = _client(openai_standin, cache_dir=tmp_path, price_input_per_mtok=1.0)

    async def go() -> list[Any]:
        calls = [await client.complete_json(MESSAGES, SCHEMA, name="verdict") for _ in range(2)]
        key = cache_key(model="judge-m", json_mode="json_schema", name="verdict", messages=MESSAGES, schema=SCHEMA,
                        temperature=0.0, max_tokens=2048)  # fmt: skip
        path = JudgeCache(tmp_path).path_for(key)
        assert path.is_file()
        path.write_text('{"format": 1, "content": ', encoding="utf-8")  # torn write
        calls.append(await client.complete_json(MESSAGES, SCHEMA, name="verdict"))
        assert json.loads(path.read_text(encoding="utf-8"))["content"] == GOOD  # rewritten
        calls.append(await client.complete_json(MESSAGES, SCHEMA, name="verdict"))
        await client.aclose()
        return calls

    first, hit, after_corruption, hit_again = asyncio.run(go())
    assert not first.cached and hit.cached and not after_corruption.cached and hit_again.cached
    assert hit.data == first.data and hit.usage == Usage(cached_calls=1)
    assert len(openai_standin.chat_requests) == 2
    assert client.usage == Usage(calls=2, cached_calls=2, prompt_tokens=200, completion_tokens=20, cost_usd=0.0002)


def test_cache_key_depends_on_the_request() -> None:
    base: dict[str, Any] = {"model": "m", "json_mode": "json_schema", "name": "n", "messages": MESSAGES,
                            "schema": SCHEMA, "temperature": 0.0, "max_tokens": 64}  # fmt: skip
    key = cache_key(**base)
    assert key == cache_key(**{**base, "schema": dict(reversed(list(SCHEMA.items())))})
    changes: list[dict[str, Any]] = [{"model": "m2"}, {"json_mode": "prompt"}, {"name": "n2"}, {"temperature": 0.5},
                                     {"max_tokens": 65}, {"messages": MESSAGES[:1]}]  # fmt: skip
    for change in changes:
        assert cache_key(**{**base, **change}) != key


def test_usage_and_cost_sums(openai_standin: OpenAIStandIn) -> None:
    openai_standin.push("garbage", usage={"prompt_tokens": 1000, "completion_tokens": 500})
    openai_standin.push(GOOD, usage={"prompt_tokens": 1200, "completion_tokens": 20})
    openai_standin.push(GOOD, usage={"prompt_tokens": 300, "completion_tokens": 30})
    client = _client(openai_standin, price_input_per_mtok=2.0, price_output_per_mtok=8.0)

    async def go() -> list[Any]:
        out = [await client.complete_json(MESSAGES, SCHEMA, name="verdict") for _ in range(2)]
        await client.aclose()
        return out

    repaired, plain = asyncio.run(go())
    assert (
        repaired.usage.calls == 2 and repaired.usage.prompt_tokens == 2200 and repaired.usage.completion_tokens == 520
    )
    assert repaired.usage.cost_usd == pytest.approx((2200 * 2.0 + 520 * 8.0) / 1e6)
    assert plain.usage.cost_usd == pytest.approx((300 * 2.0 + 30 * 8.0) / 1e6)
    total = client.usage
    assert (total.calls, total.cached_calls, total.prompt_tokens, total.completion_tokens) == (3, 0, 2500, 550)
    assert total.cost_usd == pytest.approx(repaired.usage.cost_usd + plain.usage.cost_usd)


def test_concurrency_bound_is_respected(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = lambda req: Reply(content=GOOD, delay_s=0.25)
    client = _client(openai_standin, concurrency=2)

    async def go() -> list[Any]:
        msgs = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
        out = await asyncio.gather(*(client.complete_json(m, SCHEMA, name="verdict") for m in msgs))
        await client.aclose()
        return list(out)

    start = time.monotonic()
    calls = asyncio.run(go())
    assert len(calls) == 6 and all(c.data["score"] == 2 for c in calls)
    assert openai_standin.max_in_flight == 2
    assert time.monotonic() - start >= 0.7  # 3 waves of 0.25 s


def test_client_survives_a_new_event_loop(openai_standin: OpenAIStandIn) -> None:
    openai_standin.responder = lambda req: GOOD
    client = _client(openai_standin)
    for _ in range(2):  # e.g. a CLI or a session fixture calling asyncio.run twice with one client
        assert asyncio.run(client.complete_json(MESSAGES, SCHEMA, name="verdict")).data["score"] == 2
    asyncio.run(client.aclose())


# --- a real grammar-constrained judge ------------------------------------------------------------------------------


@pytest.mark.slow
def test_llamacpp_json_object_is_grammar_constrained(llamacpp_server: str) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "in_france": {"type": "boolean"}},
        "required": ["city", "in_france"],
        "additionalProperties": False,
    }
    messages = [{"role": "user", "content": "Is Paris in France? Reply with the city and a boolean."}]

    async def go() -> tuple[Any, Any, JudgeClient]:
        obj = JudgeClient(llamacpp_server, "smollm2", json_mode="json_object", max_tokens=64, timeout_s=60)
        # json_schema is refused by llama-cpp-python (HTTP 500 naming response_format): the client must downgrade.
        auto = JudgeClient(llamacpp_server, "smollm2", json_mode="json_schema", max_tokens=64, timeout_s=60)
        try:
            a = await obj.complete_json(messages, schema, name="city")
            b = await auto.complete_json(messages, schema, name="city")
        finally:
            await obj.aclose()
            await auto.aclose()
        return a, b, auto

    first, downgraded, auto = asyncio.run(go())
    for call in (first, downgraded):
        assert set(call.data) == {"city", "in_france"}
        assert isinstance(call.data["city"], str) and isinstance(call.data["in_france"], bool)
        assert not call.repaired  # the grammar makes the first answer valid
        assert 0 < call.usage.completion_tokens <= 64 and call.usage.prompt_tokens > 0
    assert auto.effective_json_mode == "json_object"


def test_a_cache_file_that_is_not_utf8_is_a_miss(tmp_path: Path) -> None:
    from learning.judge.cache import JudgeCache

    cache = JudgeCache(tmp_path)
    path = cache.path_for("ab" + "0" * 62)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert cache.get("ab" + "0" * 62) is None
