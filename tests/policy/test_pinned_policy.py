"""`PinnedPolicy` (issue 49, adapters per team): sessions that share one policy client, each answered by its own
version.

In-process (the embedded engines, llama.cpp the default and torch): views on one engine pinned to two team adapters
and the base weights, run one after another and all at once, must each get exactly the tokens the engine gives with
that version loaded alone; a view whose adapter cannot be loaded fails and the engine keeps the weights it had.
Over HTTP: the vLLM client sends the view's `served.model` as `model`, checked on what the vLLM stand-in
(tests/vllm_server.py) received and which adapter it answered with, the request-level inspection the stand-in is kept
for; the same through a `ReplicaSet`; and the llama.cpp client against the real llama.cpp server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.deps import AgentDeps
from agent.policy import LlamaCppPolicyClient, PinnedPolicy, ReplicaSet, VLLMPolicyClient
from agent.protocols import ChatMessage, Generation, PolicyClient, PromptContext, Served
from agent.sequence import policy_model
from learning.engines.client import AdapterLoadError, EmbeddedClient
from learning.engines.local_policy import TransformersPolicyClient
from tests.adapters import reshaped_adapter, scaled_adapter
from tests.fakes import ScriptedPolicy
from tests.vllm_server import VLLMStandInServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SFT_ADAPTER = REPO_ROOT / "agent" / "adapters" / "smollm2-sft"
PROMPTS = (
    [ChatMessage("system", "You are a helpful assistant."),
     ChatMessage("user", "Name the colours of the rainbow, one per line.")],
    [ChatMessage("system", "You are a helpful assistant."),
     ChatMessage("user", "Who wrote Hamlet? Answer in one sentence.")],
)  # fmt: skip
TOKENS = 8  # greedy tokens per in-process request: enough for the three versions to differ on both prompts
STANDIN_TOKENS = 24  # the stand-in's answer opens with the model's name in brackets, up to about 8 tokens
LIVE = Served(version="base", model="policy", adapter=None)  # the global live version: the base weights


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _greedy(policy: PolicyClient, ctx: PromptContext, tokens: int = TOKENS) -> Generation:
    return await policy.generate(ctx, stop=[], max_tokens=tokens, temperature=0.0)


# -- in process ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["llamacpp", "torch"])
def engine(request: pytest.FixtureRequest, smollm2_dir: Path, smollm2_gguf: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedClient]:
    """An embedded engine of this module's own (its adapter swaps never touch the shared `embedded_policy`)."""
    client: EmbeddedClient
    if request.param == "llamacpp":
        pytest.importorskip("llama_cpp")
        from learning.engines.llamacpp_engine import EmbeddedLlamaCppClient

        client = EmbeddedLlamaCppClient(smollm2_dir, smollm2_gguf, lora_cache=tmp_path_factory.mktemp("lora"),
                                        threads=1, batch_threads=1)
    else:
        client = TransformersPolicyClient(smollm2_dir, threads=1)
    yield client
    _run(client.aclose())


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> tuple[Served, Served]:
    """Team "law" on the shipped SFT adapter, team "bio" on the same with every LoRA B negated (another adapter)."""
    bio = scaled_adapter(SFT_ADAPTER, tmp_path_factory.mktemp("teams") / "bio", -1.0)
    return (Served("team:law@2", "team:law@2", str(SFT_ADAPTER)), Served("team:bio@1", "team:bio@1", str(bio)))


def _load_alone(engine: EmbeddedClient, served: Served) -> None:
    """Put `served`'s version on the engine the way a single-version deployment does (no view involved)."""
    if served.adapter is None:
        engine.unload_adapter()
    else:
        engine.load_adapter(served.adapter, served.version)


@pytest.mark.slow
def test_views_on_one_engine_each_get_their_own_version_one_after_another_and_all_at_once(
        engine: EmbeddedClient, teams: tuple[Served, Served]) -> None:
    versions = (*teams, LIVE)
    ctxs = [_run(engine.render_prompt(p)) for p in PROMPTS]
    alone: dict[tuple[str, int], Generation] = {}
    for served in versions:
        for i, ctx in enumerate(ctxs):
            _load_alone(engine, served)
            alone[served.version, i] = _run(_greedy(engine, ctx))
    # Every version answers each prompt differently, so a request answered by the wrong version shows.
    assert len({g.token_ids for g in alone.values()}) == len(alone), {k: g.text for k, g in alone.items()}
    views = {s.version: PinnedPolicy(engine, s) for s in versions}
    order = [(s.version, i) for i in range(len(ctxs)) for s in versions]  # the versions alternate: a swap each time

    async def one_after_another() -> list[Generation]:
        return [await _greedy(views[v], ctxs[i]) for v, i in order]

    async def all_at_once() -> list[Generation]:
        return list(await asyncio.gather(*(_greedy(views[v], ctxs[i]) for v, i in order)))

    for run in (one_after_another, all_at_once):
        got = _run(run())
        for (version, i), gen in zip(order, got, strict=True):
            assert gen.token_ids == alone[version, i].token_ids, (run.__name__, version, i, gen.text)
            assert gen.policy_version == version
    assert not engine.busy  # the reentrant model lock was released by every request


def test_a_view_whose_adapter_cannot_load_fails_and_the_engine_keeps_its_version(
        engine: EmbeddedClient, teams: tuple[Served, Served], tmp_path: Path) -> None:
    law = PinnedPolicy(engine, teams[0])
    ctx = _run(engine.render_prompt(PROMPTS[0]))
    before = _run(_greedy(law, ctx))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "adapter_config.json").write_text("{not json", encoding="utf-8")
    (garbage / "adapter_model.safetensors").write_bytes(b"garbage")
    other_model = reshaped_adapter(SFT_ADAPTER, tmp_path / "other-model", hidden=960)  # LoRA for a wider model
    for folder in (tmp_path / "missing", garbage, other_model):
        broken = PinnedPolicy(engine, Served("team:chem@1", "team:chem@1", str(folder)))
        with pytest.raises(AdapterLoadError):
            _run(_greedy(broken, ctx))
        assert engine.policy_version == "team:law@2" and not engine.busy
        kept = _run(_greedy(engine, ctx))  # unpinned: whatever is loaded, which must still be law's weights
        assert (kept.token_ids, kept.policy_version) == (before.token_ids, "team:law@2")


def test_a_view_delegates_reads_and_refuses_what_would_change_the_shared_engine(
        engine: EmbeddedClient, teams: tuple[Served, Served]) -> None:
    view = PinnedPolicy(engine, teams[0])
    assert isinstance(view, PolicyClient) and view.policy_version == "team:law@2"
    assert getattr(view, "model", None) is None  # an in-process engine has no served model name ...
    assert policy_model(AgentDeps(policy=view, tools={})) == "embedded"  # ... so spans and prices say "embedded"
    assert view.tokenizer is engine.tokenizer and view.eos_token_ids == engine.eos_token_ids
    assert view.decode([1, 2, 3]) == engine.decode([1, 2, 3])
    for name in ("set_model", "aload_adapter", "aunload_adapter", "load_adapter", "unload_adapter"):
        with pytest.raises(AttributeError, match="change the version the shared client serves"):
            getattr(view, name)
    for name in ("generate_group", "score"):  # they would run on whatever version is loaded
        assert getattr(view, name, None) is None
    version = engine.policy_version
    _run(view.aclose())  # the view's owner is a session; the engine serves others and stays open
    assert engine.policy_version == version
    assert _run(_greedy(engine, _run(view.render_prompt(PROMPTS[1])))).token_ids


def test_only_a_client_that_takes_served_can_be_pinned() -> None:
    with pytest.raises(TypeError, match="cannot be pinned"):
        PinnedPolicy(ScriptedPolicy(lambda text, stop: "x"), LIVE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        Served("", "policy", None)
    with pytest.raises(ValueError, match="folder or None"):
        Served("team:law@2", "team:law@2", "")


# -- over HTTP -----------------------------------------------------------------------------------------------------


def _completions(server: VLLMStandInServer) -> list[dict[str, Any]]:
    return [dict(body) for _, path, body in server.requests if path == "/v1/completions"]


def test_vllm_views_send_their_served_model_and_the_client_keeps_its_alias(
        vllm_server: VLLMStandInServer, tmp_path: Path) -> None:
    client = VLLMPolicyClient(vllm_server.url, "policy", timeout_s=30, max_retries=1, backoff_s=0.01)
    law = Served("team:law@2", "team:law@2", None)
    bio = Served("team:bio@1", "team:bio@1", None)
    views = [PinnedPolicy(client, s) for s in (law, bio, LIVE)]

    async def go() -> list[Generation]:
        try:
            for s in (law, bio):
                await client.load_lora_adapter(s.model, vllm_server.add_adapter_dir(tmp_path / s.model))
            ctx = await views[0].render_prompt(PROMPTS[0])
            return list(await asyncio.gather(*(_greedy(v, ctx, STANDIN_TOKENS) for v in views * 2)))
        finally:
            await client.aclose()

    gens = _run(go())
    assert [view.model for view in views] == ["team:law@2", "team:bio@1", "policy"]
    assert client.model == "policy"  # no view moved the shared client's alias
    sent = [body["model"] for body in _completions(vllm_server)]
    assert sorted(sent) == sorted(["team:law@2", "team:bio@1", "policy"] * 2)
    for view, gen in zip(views * 2, gens, strict=True):
        assert gen.policy_version == view.served.model
        assert gen.text.startswith(f"[{view.served.model}]")  # the stand-in names the model that answered
    assert policy_model(AgentDeps(policy=views[0], tools={})) == "team:law@2"


def test_a_replica_set_passes_the_view_s_model_to_whichever_replica_answers(
        smollm2_dir: Path, tmp_path: Path) -> None:
    law = Served("team:law@2", "team:law@2", None)
    with VLLMStandInServer(smollm2_dir) as a, VLLMStandInServer(smollm2_dir) as b:
        replicas = ReplicaSet([a.url, b.url], "policy", timeout_s=30, max_retries=1, backoff_s=0.01)
        view = PinnedPolicy(replicas, law)

        async def session(messages: list[ChatMessage]) -> Generation:  # its own task: its own replica pin
            return await _greedy(view, await view.render_prompt(messages), STANDIN_TOKENS)

        async def go() -> list[Generation]:
            try:
                await replicas.ensure_adapter(law.model, a.add_adapter_dir(tmp_path / "law"))
                return list(await asyncio.gather(*(session(m) for m in PROMPTS)))
            finally:
                await replicas.aclose()

        gens = _run(go())
        assert replicas.model == "policy"
        assert all(g.text.startswith("[team:law@2]") and g.policy_version == "team:law@2" for g in gens)
        assert {body["model"] for body in _completions(a) + _completions(b)} == {"team:law@2"}
        assert _completions(a) and _completions(b)  # the two sessions' prompts went to different replicas


def test_llamacpp_server_views_record_their_served_model(llamacpp_server: str) -> None:
    """The llama.cpp server serves its one model whatever `model` names; the client records the view's name."""
    client = LlamaCppPolicyClient(llamacpp_server, "smollm2", timeout_s=60, max_retries=1)
    view = PinnedPolicy(client, Served("team:law@2", "smollm2-law", None))

    async def go() -> Generation:
        try:
            return await view.generate(await view.render_prompt(PROMPTS[0]), stop=[], max_tokens=4, temperature=0.0)
        finally:
            await client.aclose()

    gen = _run(go())
    assert gen.policy_version == "smollm2-law" and gen.token_ids and client.model == "smollm2"
    assert view.policy_version == "team:law@2" and view.model == "smollm2-law"
