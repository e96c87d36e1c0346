"""Contract tests against the real vLLM (the CPU build `make vllm` installs, started by app.policy_server): every
route and field `VLLMPolicyClient` uses, as the engine production runs answers them.

One server serves the whole run (`real_vllm`, about a minute to start); each test that loads an adapter unloads it.
Greedy decoding (temperature 0) keeps the sampled tokens the same run to run, so the tests can pick stop strings
from a first generation and replay it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.config import SHIPPED_SFT_ADAPTER
from agent.errors import ContextTooLong, PolicyError, PolicyRequestError
from agent.policy import VLLMPolicyClient
from agent.protocols import ChatMessage, PromptContext
from tests.adapters import reshaped_adapter

pytestmark = pytest.mark.slow

MESSAGES = [ChatMessage("system", "You are a helpful assistant."),
            ChatMessage("user", "Write a long, detailed essay about the history of the printing press in Europe.")]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _client(server: Any, model: str = "policy") -> VLLMPolicyClient:
    return VLLMPolicyClient(server.url, model, timeout_s=120, max_retries=0)


def _post(server: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def prompt_ids(real_vllm: Any) -> list[int]:
    """The chat prompt, rendered by the server's template."""
    async def go() -> PromptContext:
        client = _client(real_vllm)
        try:
            return await client.render_prompt(MESSAGES)
        finally:
            await client.aclose()

    return list(_run(go()).token_ids)


def _complete(server: Any, prompt: list[int] | str, **fields: Any) -> dict[str, Any]:
    body = {"model": "policy", "prompt": prompt, "max_tokens": 24, "temperature": 0.0, "logprobs": 1,
            "return_token_ids": True, "skip_special_tokens": False, **fields}
    resp = _post(server, "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]  # type: ignore[no-any-return]


def test_tokenize_detokenize_and_models_with_roots(real_vllm: Any, tok: Any, smollm2_dir: Path) -> None:
    chat = _post(real_vllm, "/tokenize", {"model": "policy", "add_generation_prompt": True, "add_special_tokens": False,
                                          "messages": [{"role": m.role, "content": m.content} for m in MESSAGES]})
    expected = tok.apply_chat_template([{"role": m.role, "content": m.content} for m in MESSAGES],
                                       tokenize=False, add_generation_prompt=True)
    ids = chat.json()["tokens"]
    assert tok.decode(ids) == expected and chat.json()["max_model_len"] == real_vllm.spec.max_model_len
    plain = _post(real_vllm, "/tokenize",
                  {"model": "policy", "prompt": "Haymo of Faversham", "add_special_tokens": False})
    assert plain.json()["tokens"] == tok("Haymo of Faversham", add_special_tokens=False)["input_ids"]
    back = _post(real_vllm, "/detokenize", {"model": "policy", "tokens": ids})
    assert back.json()["prompt"] == expected  # a plain decode that keeps special tokens
    models = httpx.get(f"{real_vllm.url}/v1/models", timeout=30).json()["data"]
    assert [(m["id"], m["root"], m["parent"], m["max_model_len"]) for m in models] == [
        ("policy", str(smollm2_dir), None, real_vllm.spec.max_model_len)]

    async def via_client() -> tuple[tuple[int, ...], str]:
        client = _client(real_vllm)
        try:
            return await client.tokenize("Haymo of Faversham"), (await client.render_prompt(MESSAGES)).text
        finally:
            await client.aclose()

    ids2, text = _run(via_client())
    assert list(ids2) == plain.json()["tokens"] and text == expected


def test_token_id_prompts_return_ids_and_aligned_logprobs(real_vllm: Any, prompt_ids: list[int], tok: Any,
                                                          embedded_policy: Any) -> None:
    """The prompt goes in as ids and comes back as `prompt_token_ids`; `token_ids` spell `text` and each logprob is
    the log-probability of its own id: the trainer's torch recomputation of the same ids agrees token by token (a
    shift by one position would put them far apart)."""
    # The torch side must score with the weights vLLM serves as `policy`: the base model (tests/conftest.py puts the
    # shared client back on them after every test that uses it, and fails a test that left an adapter loaded).
    assert embedded_policy.policy_version == "base", embedded_policy.policy_version
    choice = _complete(real_vllm, prompt_ids, max_tokens=24)
    ids = choice["token_ids"]
    assert choice["prompt_token_ids"] == prompt_ids and choice["finish_reason"] == "length"
    assert len(ids) == 24 and tok.decode(ids) == choice["text"]
    lps = choice["logprobs"]["token_logprobs"]
    assert len(lps) == len(ids) == len(choice["logprobs"]["tokens"])
    assert [tok.decode([i]) for i in ids] == choice["logprobs"]["tokens"]
    torch_lps = _run(embedded_policy.score(PromptContext(text="", token_ids=tuple(prompt_ids)), ids, temperature=1.0))
    gaps = [abs(a - b) for a, b in zip(lps, torch_lps, strict=True)]
    # Gaps at the first two tokens only (0.43 and 1.69 nats, then 0.0004, 0.04, ...) were seen once, while another
    # xdist worker ran the adapter test below on the same server; batching beside an adapter request, a failed load
    # and the prefix cache were measured and do not do it (tests/benchmarks/vllm_mixed_batch.py). Every real-vLLM
    # test runs on one xdist worker (tests/conftest.py, VLLM_GROUP).
    assert max(gaps) < 0.25 and sum(gaps) / len(gaps) < 0.05, gaps
    shifted = [abs(a - b) for a, b in zip(lps[1:], torch_lps[:-1], strict=False)]
    assert sum(shifted) / len(shifted) > 5 * (sum(gaps) / len(gaps)) + 0.05


def test_client_keeps_every_sampled_id_through_a_stop_completed_mid_token(real_vllm: Any, prompt_ids: list[int],
                                                                          tok: Any) -> None:
    """A stop string that ends inside a token: vLLM's `text` ends at the stop string, its ids run through the whole
    token; the client keeps the ids and spells them (a few characters past the stop string), logprobs aligned."""
    free = _complete(real_vllm, prompt_ids, max_tokens=40)["token_ids"]
    pieces = [tok.decode([i]) for i in free]
    k, stop = next((k, tok.decode(free[:k]) + pieces[k][:1]) for k in range(4, len(free))
                   if len(pieces[k]) >= 2 and pieces[k][:1].strip())
    stop = stop[-4:]
    assert stop not in tok.decode(free[:k])  # it completes only inside token k

    async def go() -> Any:
        client = _client(real_vllm)
        try:
            ctx = PromptContext(text=tok.decode(prompt_ids), token_ids=tuple(prompt_ids))
            return await client.generate(ctx, stop=[stop], max_tokens=40, temperature=0.0)
        finally:
            await client.aclose()

    gen = _run(go())
    assert gen.finish_reason == "stop" and gen.stop == stop and gen.token_source == "server"
    assert list(gen.token_ids) == free[: k + 1] and gen.text == tok.decode(free[: k + 1])
    assert gen.text.find(stop) + len(stop) < len(gen.text)  # the last token runs past the stop string
    assert len(gen.logprobs) == len(gen.token_ids)
    raw = _complete(real_vllm, prompt_ids, max_tokens=40, stop=[stop], include_stop_str_in_output=True)
    assert raw["text"].endswith(stop) and raw["stop_reason"] == stop and raw["token_ids"] == free[: k + 1]
    cut = _complete(real_vllm, prompt_ids, max_tokens=40, stop=[stop])  # without the flag: cut before the stop
    assert cut["text"] == raw["text"][: -len(stop)] and cut["token_ids"] == raw["token_ids"]


def test_eos_max_tokens_and_the_stop_string_limit(real_vllm: Any, tok: Any) -> None:
    """EOS: the id comes back last (and its text with include_stop_str_in_output); the client drops both. A
    `max_tokens` cut keeps every id. Five stop strings: the client refuses them before sending anything."""
    short = [ChatMessage("user", "Reply with the single word: yes")]

    async def go() -> tuple[Any, Any]:
        client = _client(real_vllm)
        try:
            ctx = await client.render_prompt(short)
            eos = await client.generate(ctx, stop=["</answer>"], max_tokens=64, temperature=0.0)
            cut = await client.generate(ctx, stop=[], max_tokens=1, temperature=0.0)
            with pytest.raises(ValueError, match="at most 4 stop strings"):
                await client.generate(ctx, stop=["a", "b", "c", "d", "e"], max_tokens=4, temperature=0.0)
            return ctx, (eos, cut)
        finally:
            await client.aclose()

    ctx, (eos, cut) = _run(go())
    raw = _complete(real_vllm, list(ctx.token_ids), max_tokens=64, include_stop_str_in_output=True)
    assert raw["finish_reason"] == "stop" and raw["stop_reason"] is None
    assert raw["token_ids"][-1] == tok.eos_token_id and raw["text"].endswith(tok.eos_token)
    assert eos.finish_reason == "stop" and eos.stop is None
    assert list(eos.token_ids) == raw["token_ids"][:-1] and tok.eos_token not in eos.text
    assert eos.text == tok.decode(raw["token_ids"][:-1]) and len(eos.logprobs) == len(eos.token_ids)
    assert cut.finish_reason == "length" and len(cut.token_ids) == 1 == len(cut.logprobs)
    # What the server itself does with more than four stop strings (the client never sends them).
    five = _post(real_vllm, "/v1/completions", {"model": "policy", "prompt": list(ctx.token_ids), "max_tokens": 2,
                                                "stop": ["a", "b", "c", "d", "e"]})
    assert five.status_code == 400 and "stop" in five.json()["error"]["message"].lower()


def test_context_too_long_and_an_unknown_model(real_vllm: Any, prompt_ids: list[int]) -> None:
    too_long = (prompt_ids * (real_vllm.spec.max_model_len // len(prompt_ids) + 2))[: real_vllm.spec.max_model_len + 8]

    async def go() -> None:
        client = _client(real_vllm)
        try:
            with pytest.raises(ContextTooLong):  # the server's 400, recognised by its message
                await client.generate(PromptContext(text="x", token_ids=tuple(too_long)), stop=[], max_tokens=4,
                                      temperature=0.0)
            await client.tokenize("learns the window")  # /tokenize reports max_model_len: now checked locally too
            with pytest.raises(ContextTooLong, match="context window"):
                await client.generate(PromptContext(text="x", token_ids=tuple(too_long)), stop=[], max_tokens=4,
                                      temperature=0.0)
            client.set_model("no-such-model")
            with pytest.raises(PolicyRequestError) as err:
                await client.generate(PromptContext(text="x", token_ids=tuple(prompt_ids)), stop=[], max_tokens=2,
                                      temperature=0.0)
            assert err.value.status_code == 404 and "no-such-model" in str(err.value)
        finally:
            await client.aclose()

    _run(go())
    raw = _post(real_vllm, "/v1/completions", {"model": "policy", "prompt": too_long, "max_tokens": 4})
    assert raw.status_code == 400 and "maximum" in raw.json()["error"]["message"].lower()


def test_adapter_load_serve_unload_reload_and_bad_adapters(real_vllm: Any, prompt_ids: list[int],
                                                           tmp_path: Path) -> None:
    """The shipped SFT adapter loads at run time and serves under its name, with `/v1/models` listing its folder;
    unloading makes the name unknown; loading it again works. A missing folder, a rank above --max-lora-rank and an
    adapter for another base model each fail with the server's reason, and the client keeps its version."""
    sft = SHIPPED_SFT_ADAPTER
    big = reshaped_adapter(sft, tmp_path / "rank64", rank=64)
    other = reshaped_adapter(sft, tmp_path / "other-base", hidden=1024)
    ctx = PromptContext(text="x", token_ids=tuple(prompt_ids))

    async def go() -> dict[str, Any]:
        client = _client(real_vllm)
        seen: dict[str, Any] = {}
        try:
            base = await client.generate(ctx, stop=[], max_tokens=16, temperature=0.0)
            await client.aload_adapter(sft, "policy@sft")
            cards = {c["id"]: c for c in (await asyncio.to_thread(httpx.get, f"{real_vllm.url}/v1/models")).json()[
                "data"]}
            seen["card"] = (cards["policy@sft"]["root"], cards["policy@sft"]["parent"])
            tuned = await client.generate(ctx, stop=[], max_tokens=16, temperature=0.0)
            seen["versions"] = (base.policy_version, tuned.policy_version)
            seen["differs"] = base.token_ids != tuned.token_ids
            await client.aload_adapter(sft, "policy@sft")  # publishing the same version again is not an error
            with pytest.raises(PolicyRequestError) as dup:  # the same name from another folder is refused
                await client.aload_adapter(reshaped_adapter(sft, tmp_path / "rank8", rank=8), "policy@sft")
            seen["dup"] = (dup.value.status_code, str(dup.value))
            for name, path in (("policy@missing", tmp_path / "nowhere"), ("policy@r64", big),
                               ("policy@other", other)):
                with pytest.raises(PolicyError) as err:
                    await client.aload_adapter(path, name)
                seen[name] = str(err.value)
                assert client.model == "policy@sft"  # the failed version never becomes the one sent
            seen["listed"] = await client.list_models()
            await client.aunload_adapter()
            seen["after_unload"] = (client.model, await client.list_models())
            client.set_model("policy@sft")
            with pytest.raises(PolicyRequestError) as gone:
                await client.generate(ctx, stop=[], max_tokens=2, temperature=0.0)
            seen["gone"] = gone.value.status_code
            await client.aload_adapter(sft, "policy@sft")  # reload after unload
            again = await client.generate(ctx, stop=[], max_tokens=16, temperature=0.0)
            seen["reloaded_same"] = again.token_ids == tuned.token_ids
            await client.aunload_adapter()
        finally:
            await client.aclose()
        return seen

    seen = _run(go())
    assert seen["card"] == (str(sft), "policy") and seen["versions"] == ("policy", "policy@sft")
    assert seen["differs"] and seen["reloaded_same"]
    assert "No adapter found" in seen["policy@missing"] and str(tmp_path / "nowhere") in seen["policy@missing"]
    assert "LoRA rank 64 is greater than max_lora_rank 16" in seen["policy@r64"]
    assert "size of tensor" in seen["policy@other"] and "576" in seen["policy@other"]  # SmolLM2's hidden size
    assert seen["dup"][0] == 400 and "has already been loaded" in seen["dup"][1]
    assert seen["listed"] == ["policy", "policy@sft"]  # no failed load left a name behind
    assert seen["after_unload"] == ("policy", ["policy"]) and seen["gone"] == 404
