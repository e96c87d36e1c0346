"""LlamaCppPolicyClient against a real llama-cpp-python server serving the bundled SmolLM2 GGUF."""

from __future__ import annotations

import asyncio
import math
import socket
from typing import Any

import pytest

from agent.errors import ContextTooLong, PolicyUnavailable
from agent.policy import LlamaCppPolicyClient, render_chatml
from agent.protocols import ChatMessage, Generation, PolicyClient, PromptContext

# A counting prompt: its greedy continuation is sharply peaked, so it is the same on every request even though the
# server's prompt-cache reuse changes the floating-point path from one request to the next.
WITH_SYSTEM = [
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Count from 1 to 10, separated by commas."),
]
WITHOUT_SYSTEM = [ChatMessage("user", "Say just the word: yes")]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _client(root: str, **kw: Any) -> LlamaCppPolicyClient:
    return LlamaCppPolicyClient(root, "smollm2", timeout_s=60, backoff_s=0.01, **kw)


async def _gen(root: str, messages: list[ChatMessage], stop: list[str], max_tokens: int) -> Generation:
    client = _client(root)
    try:
        ctx = await client.render_prompt(messages)
        return await client.generate(ctx, stop=stop, max_tokens=max_tokens, temperature=0.0, seed=1)
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def full(llamacpp_server: str) -> Generation:
    """Greedy continuation without stop strings: the reference the stop tests cut."""
    return _run(_gen(llamacpp_server, WITH_SYSTEM, [], 16))


@pytest.mark.parametrize("messages", [WITH_SYSTEM, WITHOUT_SYSTEM], ids=["system", "default-system"])
def test_render_matches_the_model_template(
    llamacpp_server: str, embedded_policy: Any, messages: list[ChatMessage]
) -> None:
    client = _client(llamacpp_server)
    assert isinstance(client, PolicyClient)
    ctx = _run(client.render_prompt(messages))
    reference = _run(embedded_policy.render_prompt(messages))  # transformers' apply_chat_template on the same GGUF
    assert ctx == reference
    assert ctx.text == render_chatml(messages)


def test_tokenize_adds_no_bos_and_matches_hf(llamacpp_server: str, embedded_policy: Any) -> None:
    client = _client(llamacpp_server)
    text = "<tool_output>[1-0] Paris is the capital of France.</tool_output>\n"
    ids = _run(client.tokenize(text))
    assert ids == _run(embedded_policy.tokenize(text))
    assert ids[0] != 1  # <|im_start|> is SmolLM2's BOS; the server does not add it
    assert _run(client.tokenize("")) == ()


def test_generate_cuts_at_stop_and_names_it(llamacpp_server: str, embedded_policy: Any, full: Generation) -> None:
    assert full.text.startswith("1, 2, 3, 4, 5"), full.text
    gen = _run(_gen(llamacpp_server, WITH_SYSTEM, ["</never>", ", 5"], 16))  # the stop spans three tokens
    assert gen.text == "1, 2, 3, 4"
    assert gen.stop == ", 5" and gen.finish_reason == "stop"
    assert gen.policy_version == "smollm2" and gen.token_source == "retokenized"
    assert embedded_policy.decode(gen.token_ids) == gen.text
    assert len(gen.logprobs) == len(gen.token_ids) == 10
    assert all(math.isfinite(lp) and lp <= 0 for lp in gen.logprobs)


def test_first_listed_stop_found_wins_like_the_server(llamacpp_server: str, full: Generation) -> None:
    gen = _run(_gen(llamacpp_server, WITH_SYSTEM, ["6", "3"], 16))  # "3" shows up first, so the server stops there
    assert (gen.stop, gen.text) == ("3", "1, 2, ")
    gen = _run(_gen(llamacpp_server, WITH_SYSTEM, [", 2", "1, 2"], 16))  # both complete on the same token
    assert (gen.stop, gen.text) == (", 2", "1")


def test_eos_gives_stop_none(llamacpp_server: str) -> None:
    gen = _run(_gen(llamacpp_server, WITHOUT_SYSTEM, ["</answer>"], 16))
    assert gen.finish_reason == "stop" and gen.stop is None
    assert gen.text.strip() and "<|im_end|>" not in gen.text
    assert len(gen.logprobs) == len(gen.token_ids)


def test_length_limit(llamacpp_server: str, full: Generation) -> None:
    gen = _run(_gen(llamacpp_server, WITH_SYSTEM, [], 4))
    assert gen.finish_reason == "length" and gen.stop is None and full.text.startswith(gen.text)


def test_prompt_longer_than_context_is_context_too_long(llamacpp_server: str) -> None:
    client = _client(llamacpp_server)
    long_text = render_chatml([ChatMessage("user", "word " * 5000)])
    with pytest.raises(ContextTooLong):
        _run(client.generate(PromptContext(long_text, ()), stop=[], max_tokens=4, temperature=0.0))


def test_server_down_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        client = LlamaCppPolicyClient(f"http://127.0.0.1:{port}", max_retries=2, backoff_s=0.001)
        with pytest.raises(PolicyUnavailable):
            _run(client.tokenize("hello"))
