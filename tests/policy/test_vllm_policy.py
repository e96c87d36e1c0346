"""VLLMPolicyClient against a vLLM stand-in at the HTTP boundary, for what the real vLLM (tests/policy/
test_vllm_contract.py) cannot be made to show: 429s, 5xx, dropped connections and timeouts, older servers without
`return_token_ids` or logprob strings, a stop completed inside a split multi-byte character, and inspection of the
headers and bodies sent. Its answers follow the real 0.32 server's shapes (API_FACTS §1, §3).

The stand-in is an `httpx.MockTransport` handler that tokenizes with SmolLM2's real tokenizer and replays vLLM's
stop/EOS semantics (`vllm/v1/engine/detokenizer.py`): `token_ids` run through the token that completed the stop string
(or the EOS id); `text` is cut before the stop string, or with `include_stop_str_in_output` right after it, in which
case the EOS token's text is in `text` too; `stop_reason` names the matched string.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.errors import (
    ContextTooLong,
    PolicyRateLimited,
    PolicyRequestError,
    PolicyTimeout,
    PolicyUnavailable,
)
from agent.policy import VLLMPolicyClient
from agent.protocols import ChatMessage, PolicyClient, PromptContext

API_KEY = "sk-test-SECRET-1234"
MESSAGES = [ChatMessage("system", "You are a researcher."), ChatMessage("user", "Who wrote Hamlet?")]

Fault = Callable[[httpx.Request], httpx.Response]


class VLLMStandIn:
    """Answers /tokenize, /detokenize and /v1/completions like vLLM 0.33 does, from a scripted model output."""

    def __init__(self, tokenizer: Any, aliases: tuple[str, ...] = ("policy", "step-1"), max_model_len: int = 4096):
        self.tok = tokenizer
        self.aliases = aliases
        self.max_model_len = max_model_len
        self.outputs: deque[str] = deque()  # what the "model" samples next, e.g. "Paris.</answer> and more"
        self.faults: deque[Fault] = deque()  # answered (or raised) before normal handling
        self.requests: list[tuple[str, dict[str, Any], httpx.Headers]] = []
        self.return_token_ids_supported = True
        self.logprobs_supported = True
        self.texts: list[str] = []  # the `text` of every completion answered

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        self.requests.append((request.url.path, body, request.headers))
        if self.faults:
            return self.faults.popleft()(request)
        path = request.url.path
        if path == "/tokenize":
            return self._tokenize(body)
        if path == "/detokenize":
            return httpx.Response(200, json={"prompt": self.tok.decode(body["tokens"], skip_special_tokens=False)})
        if path == "/v1/completions":
            return self._complete(body)
        return _error(404, "Not Found", "NotFoundError")

    def _tokenize(self, body: dict[str, Any]) -> httpx.Response:
        if "messages" in body:
            text = self.tok.apply_chat_template(
                body["messages"], tokenize=False, add_generation_prompt=body.get("add_generation_prompt", True)
            )
            ids = self.tok(text, add_special_tokens=body.get("add_special_tokens", False))["input_ids"]
        else:
            ids = self.tok(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
        return httpx.Response(
            200, json={"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None}
        )

    def _complete(self, body: dict[str, Any]) -> httpx.Response:
        model = body.get("model")
        if model not in self.aliases:
            return _error(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(self.aliases)}.",
                          "NotFoundError")  # fmt: skip
        stops = body.get("stop") or []
        if isinstance(stops, str):
            stops = [stops]
        if len(stops) > 4:
            return _error(400, "1 validation error:\n  {'type': 'too_long', 'loc': 'body.stop', 'msg': 'List should "
                          "have at most 4 items after validation, not 5'}", "Bad Request")  # vLLM 0.32's answer
        prompt = body["prompt"]
        n_prompt = len(prompt) if isinstance(prompt, list) else len(self.tok(prompt)["input_ids"])
        if n_prompt >= self.max_model_len:
            return _error(  # vLLM 0.32's words (checked against the real server, issue 33)
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, your prompt contains "
                f"{n_prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce "
                f"the length of the input prompt. (parameter=input_tokens, value={n_prompt})",
                "BadRequestError",
            )
        max_tokens = body.get("max_tokens") or 16
        skip_special = body.get("skip_special_tokens", True)
        sampled = self.tok(self.outputs.popleft(), add_special_tokens=False)["input_ids"]
        ids: list[int] = []
        text, finish, stop_reason = "", "length", None
        for token in sampled[:max_tokens]:
            ids.append(token)
            if token == self.tok.eos_token_id:  # EOS: id returned; its text only with include_stop_str_in_output
                shown = ids if body.get("include_stop_str_in_output") else ids[:-1]
                text, finish = self.tok.decode(shown, skip_special_tokens=skip_special), "stop"
                break
            text = self.tok.decode(ids, skip_special_tokens=skip_special)
            hit = next(((s, text.find(s)) for s in stops if s in text), None)  # vLLM: list order
            if hit is not None:
                stop_reason, finish = hit[0], "stop"
                text = text[: hit[1]] if not body.get("include_stop_str_in_output") else text[: hit[1] + len(hit[0])]
                break
        pieces = [self.tok.decode([t], skip_special_tokens=False) for t in ids]
        offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
        logprobs = [-0.05 * (i + 1) for i in range(len(ids))]
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": {
                "tokens": pieces,
                "token_logprobs": logprobs,
                "top_logprobs": [{p: lp} for p, lp in zip(pieces, logprobs, strict=True)],
                "text_offset": offsets,
            }
            if body.get("logprobs") is not None and self.logprobs_supported
            else None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
            "token_ids": ids if (body.get("return_token_ids") and self.return_token_ids_supported) else None,
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if body.get("return_token_ids") else None,
        }
        self.texts.append(text)
        return httpx.Response(
            200,
            json={
                "id": "cmpl-standin", "object": "text_completion", "created": 1763800000, "model": model,
                "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(ids),
                          "completion_tokens": len(ids), "prompt_tokens_details": None},
                "system_fingerprint": None, "service_tier": None, "kv_transfer_params": None,
            },
        )  # fmt: skip


def _error(status: int, message: str, kind: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": message, "type": kind, "param": None, "code": status}})


def _status(status: int, headers: dict[str, str] | None = None) -> Fault:
    def fault(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers=headers, json={"error": {"message": "busy", "type": "x", "code": status}})

    return fault


def _raise(exc_type: type[Exception]) -> Fault:
    def fault(request: httpx.Request) -> httpx.Response:
        raise exc_type("simulated", request=request)  # type: ignore[call-arg]

    return fault


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture
def server(tokenizer: Any) -> VLLMStandIn:
    return VLLMStandIn(tokenizer)


def _client(server: VLLMStandIn, **kw: Any) -> VLLMPolicyClient:
    kw.setdefault("max_retries", 3)
    return VLLMPolicyClient(
        "http://vllm.test:8000", "policy", api_key=API_KEY, transport=server.transport(), backoff_s=0.001, **kw
    )


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _prompt(client: VLLMPolicyClient) -> PromptContext:
    return await client.render_prompt(MESSAGES)


def test_implements_protocol(server: VLLMStandIn) -> None:
    assert isinstance(_client(server), PolicyClient)






def _near_end(stop: str, text: str) -> bool:
    """The graph's test (`SequenceWriter.keep_closed`) for "the sampled turn kept its closing tag"."""
    return stop in text[-(len(stop) + 8) :]


def _decode(tokenizer: Any, ids: Any) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))








def test_eos_without_logprob_strings_uses_detokenize(server: VLLMStandIn, tokenizer: Any) -> None:
    server.logprobs_supported = False
    client = _client(server)
    server.outputs.append("Marlowe did not.<|im_end|>")
    gen = _run(client.generate(PromptContext("", (1, 2, 3)), stop=["</answer>"], max_tokens=40, temperature=0.0))
    assert gen.text == "Marlowe did not." and gen.logprobs == () and gen.token_source == "server"
    assert tokenizer.eos_token_id not in gen.token_ids and _decode(tokenizer, gen.token_ids) == gen.text






def test_stop_after_split_unicode(server: VLLMStandIn, tokenizer: Any) -> None:
    client = _client(server)
    ctx = _run(_prompt(client))
    server.outputs.append("Go 🚀 über 東京</answer>x")  # several tokens are partial UTF-8 characters
    gen = _run(client.generate(ctx, stop=["</answer>"], max_tokens=40, temperature=1.0))
    assert gen.text == "Go 🚀 über 東京</answer>" and gen.stop == "</answer>"
    assert _decode(tokenizer, gen.token_ids) == gen.text
    assert len(gen.logprobs) == len(gen.token_ids)




def test_set_model_switches_alias_per_request(server: VLLMStandIn) -> None:
    client = _client(server)
    ctx = PromptContext(text="", token_ids=(1, 2, 3))
    server.outputs.extend(["a b c", "d e f"])
    first = _run(client.generate(ctx, stop=[], max_tokens=2, temperature=0))
    client.set_model("step-1")
    assert client.policy_version == "step-1"
    second = _run(client.generate(ctx, stop=[], max_tokens=2, temperature=0))
    assert (first.policy_version, second.policy_version) == ("policy", "step-1")
    assert [b["model"] for p, b, _ in server.requests if p == "/v1/completions"] == ["policy", "step-1"]


def test_server_without_token_ids_falls_back_to_retokenizing(server: VLLMStandIn, tokenizer: Any) -> None:
    server.return_token_ids_supported = False
    client = _client(server)
    ctx = PromptContext(text="", token_ids=(1, 2, 3))
    server.outputs.append("Hamlet is a play.</answer>")
    gen = _run(client.generate(ctx, stop=["</answer>"], max_tokens=30, temperature=0))
    assert gen.text == "Hamlet is a play.</answer>" and gen.token_source == "retokenized"
    assert list(gen.token_ids) == tokenizer(gen.text, add_special_tokens=False)["input_ids"]
    assert len(gen.logprobs) == len(gen.token_ids)  # the token strings line up with the retokenized ids here


def test_429_then_200_is_retried(server: VLLMStandIn) -> None:
    client = _client(server)
    server.faults.append(_status(429, {"Retry-After": "0"}))
    server.outputs.append("fine")
    gen = _run(client.generate(PromptContext("", (1, 2)), stop=[], max_tokens=3, temperature=0))
    assert gen.text == "fine"
    assert [p for p, _, _ in server.requests] == ["/v1/completions", "/v1/completions"]


def test_429_every_time_raises_rate_limited(server: VLLMStandIn) -> None:
    client = _client(server, max_retries=2)
    server.faults.extend([_status(429)] * 3)
    with pytest.raises(PolicyRateLimited):
        _run(client.generate(PromptContext("", (1, 2)), stop=[], max_tokens=3, temperature=0))
    assert len(server.requests) == 3


def test_5xx_after_retries_raises_unavailable(server: VLLMStandIn) -> None:
    client = _client(server, max_retries=3)
    server.faults.extend([_status(500), _status(502), _status(503), _status(500)])
    with pytest.raises(PolicyUnavailable, match="500"):
        _run(client.generate(PromptContext("", (1, 2)), stop=[], max_tokens=3, temperature=0))
    assert len(server.requests) == 4


def test_connection_errors_and_timeouts(server: VLLMStandIn) -> None:
    client = _client(server, max_retries=1)
    server.faults.extend([_raise(httpx.ConnectError)] * 2)
    with pytest.raises(PolicyUnavailable):
        _run(client.tokenize("hello"))
    server.faults.extend([_raise(httpx.ReadTimeout)] * 2)
    with pytest.raises(PolicyTimeout):
        _run(client.tokenize("hello"))
    server.faults.append(_raise(httpx.ConnectError))
    assert len(_run(client.tokenize("hello"))) > 0  # one failure, then the retry succeeds
    assert len(server.requests) == 6


def test_context_too_long_is_not_retried(server: VLLMStandIn) -> None:
    client = _client(server)
    ctx = PromptContext("", tuple([42] * 5000))
    with pytest.raises(ContextTooLong, match="maximum context length"):
        _run(client.generate(ctx, stop=[], max_tokens=3, temperature=0))
    assert len(server.requests) == 1






def test_api_key_never_in_errors_or_logs(server: VLLMStandIn, caplog: pytest.LogCaptureFixture) -> None:
    client = _client(server, max_retries=1)
    server.faults.extend([_status(503), _status(401)])
    caplog.set_level(logging.DEBUG)
    with pytest.raises(PolicyRequestError) as info:
        _run(client.tokenize("x"))
    assert info.value.status_code == 401
    assert API_KEY not in str(info.value) and API_KEY not in repr(info.value.args)
    assert API_KEY not in caplog.text
    assert all(h["authorization"] == f"Bearer {API_KEY}" for _, _, h in server.requests)


def test_no_key_no_header(server: VLLMStandIn) -> None:
    client = VLLMPolicyClient("http://vllm.test:8000", "policy", transport=server.transport())
    _run(client.tokenize("x"))
    assert "authorization" not in server.requests[0][2]
    _run(client.aclose())


def test_base_url_with_v1_is_refused() -> None:
    with pytest.raises(ValueError, match="/v1"):
        VLLMPolicyClient("http://127.0.0.1:8000/v1", "policy")


def test_from_config_and_closed_client(server: VLLMStandIn) -> None:
    from pydantic import SecretStr

    from agent.config import AgentConfig

    cfg = AgentConfig(policy_backend="vllm", policy_base_url="http://vllm.test:8000", policy_model="step-1",
                      policy_api_key=SecretStr(API_KEY), policy_max_retries=0)  # fmt: skip
    client = VLLMPolicyClient.from_config(cfg, transport=server.transport())
    assert client.policy_version == "step-1"
    _run(client.tokenize("x"))
    assert server.requests[0][2]["authorization"] == f"Bearer {API_KEY}"
    _run(client.aclose())
    _run(client.aclose())  # idempotent
    with pytest.raises(PolicyUnavailable, match="closed"):
        _run(client.tokenize("x"))
