"""Several vLLM replicas behind the real app: the replica settings, `rubricem promote` / `rollback` and a retraining
cycle against two real vLLM servers (the CPU build, `make vllm`): the run's shared server, and a second one started
with --max-lora-rank 8, so a rank-16 adapter really fails to load there (replicas configured differently), and which
is stopped and restarted for the rollback.

`live` moves only once every replica lists the version and passes the swap probe (issue 63); when a replica fails,
the adapter is unloaded where this attempt loaded it, `live` stays, and the failing replica is named (in the cycle's
record for a cycle). The versions are rank-8 cuts of the SFT adapter, not all-zero ones: an all-zero adapter serves
exactly the base model's outputs, which the swap probe rightly cannot tell from `base`."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig, RunOptions, StageTokenCaps
from agent.errors import ReplicaError
from agent.policy import ReplicaSet, VLLMPolicyClient
from app.cli import main
from app.container import ConfigurationError, build_policy
from app.service import ResearchService
from app.settings import Settings
from store.registry import Registry
from store.session_log import SessionLog
from tests.adapters import served_adapters, unload_adapters
from tests.servers import free_port
from tests.gate import assert_gate_decided
from tests.indexes import seed_passages

OPTIONS = RunOptions(
    format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=120,
    token_caps=StageTokenCaps(plan=16, research=16, review=16, answer=16), context_tokens=8192,
)  # fmt: skip


def rank8_adapter(dest: Path, scale: float = 1.0) -> Path:
    """The SFT adapter cut to its first 8 ranks (its LoRA scale kept), B times `scale`: a rank-8 adapter replica b
    can load, with outputs of its own."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(SHIPPED_SFT_ADAPTER, dest)
    cfg = json.loads((dest / "adapter_config.json").read_text())
    ratio = cfg["lora_alpha"] / cfg["r"]
    cfg["r"], cfg["lora_alpha"] = 8, ratio * 8
    weights = load_file(str(dest / "adapter_model.safetensors"))
    cut = {k: (v[:8, :] if "lora_A" in k else v[:, :8] * scale).contiguous().to(v.dtype) for k, v in weights.items()}
    assert all(float(torch.count_nonzero(v)) > 0 for v in cut.values())
    (dest / "adapter_config.json").write_text(json.dumps(cfg))
    save_file(cut, str(dest / "adapter_model.safetensors"))
    return dest


@pytest.fixture(scope="module")
def replica_b(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A second real vLLM that loads adapters up to rank 8 only."""
    from tests.conftest import start_real_vllm

    server: Any = start_real_vllm(smollm2_dir, tmp_path_factory.mktemp("vllm-b"), max_lora_rank=8)
    yield server
    server.stop()


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **values: str) -> None:
    """A clean RUBRICEM_* environment (no .env file: the working directory is the test's own)."""
    import os

    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    for name, value in values.items():
        monkeypatch.setenv(f"RUBRICEM_{name}", value)


def _replica_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *urls: str, model_dir: Path | None = None,
                 **more: str) -> Settings:
    values = {"STORE__DATA_DIR": str(tmp_path / "data"), "AGENT__POLICY_BACKEND": "vllm",
              "AGENT__POLICY_BASE_URLS": json.dumps(list(urls)),
              "AGENT__POLICY_MAX_RETRIES": "1", "AGENT__POLICY_TIMEOUT_S": "120",
              "LEARNING__RETRAIN__UNLOAD_GRACE_S": "0",
              "LEARNING__RETRAIN__SWAP_PROBE_DEADLINE_S": "10",  # a replica that is down fails the probe in 10 s
              "AGENT__LOCAL_SEARCH_K": "2", "AGENT__SNIPPET_CHARS": "300"}  # short tool outputs: serving is the subject
    if model_dir is not None:  # the model the replicas serve: the trainer's, for the swap probe
        values["AGENT__EMBEDDED_MODEL_PATH"] = str(model_dir)
    _env(monkeypatch, tmp_path, **(values | more))
    return Settings()


# --- settings ---------------------------------------------------------------------------------------------------------


def test_replica_urls_come_as_a_json_list_or_comma_separated_and_conflicts_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _env(monkeypatch, tmp_path, AGENT__POLICY_BASE_URLS='["http://vllm-1:8000", "http://vllm-2:8000/"]')
    assert Settings().agent.policy_urls == ("http://vllm-1:8000", "http://vllm-2:8000/")
    _env(monkeypatch, tmp_path, AGENT__POLICY_BASE_URLS=" http://vllm-1:8000 ,http://vllm-2:8000")
    assert Settings().agent.policy_urls == ("http://vllm-1:8000", "http://vllm-2:8000")
    _env(monkeypatch, tmp_path, AGENT__POLICY_BASE_URL="http://vllm-1:8000")  # one server, as before
    assert Settings().agent.policy_urls == ("http://vllm-1:8000",)
    _env(monkeypatch, tmp_path, AGENT__POLICY_BASE_URL="http://vllm-2:8000",  # also listed: no conflict
         AGENT__POLICY_BASE_URLS="http://vllm-1:8000,http://vllm-2:8000")
    assert Settings().agent.policy_urls == ("http://vllm-1:8000", "http://vllm-2:8000")

    _env(monkeypatch, tmp_path, AGENT__POLICY_BASE_URL="http://other:8000",
         AGENT__POLICY_BASE_URLS="http://vllm-1:8000,http://vllm-2:8000")
    with pytest.raises(ValidationError, match="both set and disagree"):
        Settings()
    for bad, why in (("http://u:s3cret-pw@vllm-1:8000/v1,http://vllm-2:8000", "ends in /v1"),
                     ("http://u:s3cret-pw@vllm-1:8000,http://u:s3cret-pw@vllm-1:8000", "listed twice"),
                     ('["http://u:s3cret-pw@vllm-1:8000"', "not a valid JSON list"),
                     ("vllm-1:8000", "not an http")):
        _env(monkeypatch, tmp_path, AGENT__POLICY_BASE_URLS=bad, AGENT__POLICY_BACKEND="vllm")
        with pytest.raises(ValidationError, match=why):
            Settings()
    # The CLI shows the reason without the value (which may carry credentials).
    _env(monkeypatch, tmp_path, AGENT__POLICY_BASE_URLS="http://u:s3cret-pw@vllm-1:8000/v1,http://vllm-2:8000")
    assert main(["versions"]) == 2


def test_the_container_builds_a_replica_set_for_several_vllm_urls(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    urls = ["http://vllm-1:8000", "http://u:pw@vllm-2:8000"]
    settings = _replica_env(monkeypatch, tmp_path, *urls)
    policy = build_policy(settings)
    assert isinstance(policy, ReplicaSet) and policy.replica_urls == ("http://vllm-1:8000", "http://vllm-2:8000")
    single = build_policy(_replica_env(monkeypatch, tmp_path, urls[0]))
    assert isinstance(single, VLLMPolicyClient)
    with pytest.raises(ConfigurationError, match="only the vllm backend serves replicas"):
        build_policy(_replica_env(monkeypatch, tmp_path, *urls, AGENT__POLICY_BACKEND="llamacpp"))
    for client in (policy, single):
        asyncio.run(client.aclose())


# --- promote and rollback by hand -------------------------------------------------------------------------------------


def _serve_sessions(settings: Settings, n: int) -> list[str]:
    """The policy versions of `n` sessions through the serving path (the registry's live version, the container's
    policy client). Sessions go to the replicas in turn, so two reach both; one where the check is only which version
    the registry sends (the suite outgrew its time)."""
    log = SessionLog.from_config(settings.store)
    policy = build_policy(settings)
    service = ResearchService(policy, {}, log, settings.agent, live=Registry(log))

    async def go() -> list[str]:
        try:
            return [(await service.run(q, OPTIONS)).policy_version for q in ("Who was Haymo?", "Who was Elias?")[:n]]
        finally:
            await policy.aclose()

    return asyncio.run(go())


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_promote_and_rollback_move_live_only_once_every_replica_serves_the_version(
    real_vllm: Any, replica_b: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], smollm2_dir: Path
) -> None:
    a, b = real_vllm, replica_b
    settings = _replica_env(monkeypatch, tmp_path, a.url, b.url, model_dir=smollm2_dir)
    seed_passages(settings)
    reg = Registry(SessionLog.from_config(settings.store))
    shared = tmp_path / "adapters"  # the adapters volume every replica mounts at the same path
    wide = reg.register(shutil.copytree(SHIPPED_SFT_ADAPTER, shared / "rank16"), parent="base")
    v1 = reg.register(rank8_adapter(shared / "one"), parent="base")
    v2 = reg.register(rank8_adapter(shared / "two", scale=0.5), parent=v1.name)
    try:
        # A replica fails the load: live stays, the adapter is taken back from the other, the replica is named.
        assert main(["promote", wide.name]) == 1
        err = capsys.readouterr().err
        assert "ReplicaError" in err and b.url in err and "LoRA rank 16 is greater than max_lora_rank 8" in err
        assert reg.live().name == "base" and served_adapters(a) == {} and served_adapters(b) == {}
        assert _serve_sessions(settings, 1) == ["policy"]  # `base` live: vLLM's base model name is sent

        # Both load it and pass the swap probe: live moves, and both replicas serve it to the sessions that follow.
        assert main(["promote", v1.name]) == 0
        out, err = capsys.readouterr()
        assert f"live: base -> {v1.name}" in out
        assert f"swap to {v1.name} verified on vllm {a.url}, vllm {b.url}" in err
        assert reg.live().name == v1.name
        assert served_adapters(a) == served_adapters(b) == {v1.name: v1.adapter_path}
        assert _serve_sessions(settings, 2) == [v1.name, v1.name]

        assert main(["promote", v2.name]) == 0
        both = {v1.name: v1.adapter_path, v2.name: v2.adapter_path}
        assert served_adapters(a) == served_adapters(b) == both  # v1 kept for rollback

        # Rollback with a replica down (a port nothing listens on stands for b while it is down: stopping and
        # restarting a real replica costs a minute): the swap probe cannot read it, retries until its deadline, and
        # the rollback is refused with the replica named; live stays and v1 stays loaded on the other.
        down = f"http://127.0.0.1:{free_port()}"
        _replica_env(monkeypatch, tmp_path, a.url, down, model_dir=smollm2_dir)
        capsys.readouterr()
        assert main(["rollback"]) == 1
        err = capsys.readouterr().err
        assert down in err and "cannot reach" in err and "could not run within 10s" in err
        assert reg.live().name == v2.name and served_adapters(a) == both

        # The replica is back without its runtime-loaded adapters, as after a restart: the swap probe's reading of the
        # previous version (v2) loads it there again from its folder (issue 63, item 4), the rollback loads v1 there,
        # then live moves.
        _replica_env(monkeypatch, tmp_path, a.url, b.url, model_dir=smollm2_dir)
        unload_adapters(b)
        assert served_adapters(b) == {}
        assert main(["rollback", "--reason", "bad answers"]) == 0
        assert f"live: {v2.name} -> {v1.name}" in capsys.readouterr().out
        assert reg.live().name == v1.name and reg.history(limit=1)[0].reason == "bad answers"
        assert served_adapters(b) == both and v1.name in served_adapters(a)
        assert _serve_sessions(settings, 1) == [v1.name]
    finally:
        unload_adapters(a)
        unload_adapters(b)


# --- a retraining cycle -----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_cycle_a_replica_fails_is_recorded_with_it_and_a_good_cycle_moves_every_replica(
    real_vllm: Any, replica_b: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_dir: Path
) -> None:
    """The whole cycle with its real gate at the default tolerance (probe sessions on the replicas, the offline
    held-out judge); only the training step is replaced by a finished adapter: first the rank-16 SFT adapter, which
    replica b cannot load, then a rank-8 cut of it scaled to 2 %, whose greedy outputs stay the base model's (so the
    gate finds it as good as live and promotes it) while its log-probs differ, so that the swap probe can tell it
    from `base` (an all-zero adapter serves exactly the base model, and the probe refuses a swap it cannot verify)."""
    from app.retrain import RetrainApp
    from learning.pipeline import retrain

    a, b = real_vllm, replica_b
    probes = tmp_path / "probes.txt"
    probes.write_text("Who was Haymo of Faversham?\n")
    settings = _replica_env(monkeypatch, tmp_path, a.url, b.url, model_dir=smollm2_dir,
                            LEARNING__RETRAIN__PROBE_QUESTIONS=str(probes),
                            LEARNING__RETRAIN__MAX_TOKEN_CAPS="16")
    seed_passages(settings)
    assert settings.learning.retrain.tolerance == 0.02
    wide = shutil.copytree(SHIPPED_SFT_ADAPTER, tmp_path / "wide")
    small = rank8_adapter(tmp_path / "small", scale=0.02)

    async def cycle(trained: Path) -> Any:
        app = RetrainApp(settings)
        parts = app.parts()
        parts.seed_questions = ["Who was Haymo of Faversham?", "What is the Franciscan order?"]

        async def train(*_a: object) -> Path:
            return trained

        parts.train = train  # type: ignore[assignment]
        try:
            return await retrain(parts, settings.learning.retrain, force=True)
        finally:
            await app.aclose()

    reg = Registry(SessionLog.from_config(settings.store))
    try:
        with pytest.raises(ReplicaError):
            asyncio.run(cycle(wide))
        failed = reg.cycles(limit=1)[0]
        assert failed.status == "failed" and failed.numbers["failed_replicas"] == [b.url]
        assert b.url in (failed.error or "") and "max_lora_rank 8" in (failed.error or "")
        assert reg.live().name == "base" and served_adapters(a) == {} and served_adapters(b) == {}

        result = asyncio.run(cycle(small))
        assert result.cycle.status == "promoted", result.message
        report = assert_gate_decided(reg, result.cycle, tolerance=0.02)
        assert report["candidate"]["total"] + 0.02 >= report["live"]["total"]  # as good as live, within the default
        live = reg.live()
        assert live.name == result.candidate and live.name != failed.candidate
        assert served_adapters(a)[live.name] == served_adapters(b)[live.name] == live.adapter_path
        assert _serve_sessions(settings, 2) == [live.name, live.name]
    finally:
        unload_adapters(a)
        unload_adapters(b)
