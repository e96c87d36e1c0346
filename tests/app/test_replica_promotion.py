"""Several vLLM replicas behind the real app: the replica settings, `rubricem promote` / `rollback` and a retraining
cycle against two real vLLM stand-in servers (tests/vllm_server.py), one of which fails the load or is down.

`live` moves only once every replica lists the version; when a replica fails, the adapter is unloaded where this
attempt loaded it, `live` stays, and the failing replica is named (in the cycle's record for a cycle)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.errors import ReplicaError
from agent.policy import ReplicaSet, VLLMPolicyClient
from app.cli import main
from app.container import ConfigurationError, build_policy
from app.service import ResearchService
from app.settings import Settings
from store.registry import Registry
from store.session_log import SessionLog
from tests.policy.test_vllm_server import research_script
from tests.vllm_server import VLLMStandInServer

OPTIONS = RunOptions(
    format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=120,
    token_caps=StageTokenCaps(plan=64, research=32, review=32, answer=32), context_tokens=8192,
)  # fmt: skip
KEY = "sk-REPLICA-KEY-5678"


@pytest.fixture
def pair(smollm2_dir: Path) -> Iterator[tuple[VLLMStandInServer, VLLMStandInServer]]:
    with VLLMStandInServer(smollm2_dir, script=research_script, api_key=KEY) as a, \
            VLLMStandInServer(smollm2_dir, script=research_script, api_key=KEY) as b:
        yield a, b


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **values: str) -> None:
    """A clean RUBRICEM_* environment (no .env file: the working directory is the test's own)."""
    import os

    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    for name, value in values.items():
        monkeypatch.setenv(f"RUBRICEM_{name}", value)


def _replica_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *urls: str, **more: str) -> Settings:
    values = {"STORE__DATA_DIR": str(tmp_path / "data"), "AGENT__POLICY_BACKEND": "vllm",
              "AGENT__POLICY_BASE_URLS": json.dumps(list(urls)), "AGENT__POLICY_API_KEY": KEY,
              "AGENT__POLICY_MAX_RETRIES": "1", "AGENT__POLICY_TIMEOUT_S": "30",
              "LEARNING__RETRAIN__UNLOAD_GRACE_S": "0"}
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


def _serve_two_sessions(settings: Settings) -> list[str]:
    """Two sessions through the serving path (the registry's live version, the container's policy client)."""
    log = SessionLog.from_config(settings.store)
    policy = build_policy(settings)
    service = ResearchService(policy, {}, log, settings.agent, live=Registry(log))

    async def go() -> list[str]:
        try:
            return [(await service.run(q, OPTIONS)).policy_version for q in ("Who was Haymo?", "Who was Elias?")]
        finally:
            await policy.aclose()

    return asyncio.run(go())


def test_promote_and_rollback_move_live_only_once_every_replica_serves_the_version(
    pair: tuple[VLLMStandInServer, VLLMStandInServer], smollm2_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = pair
    settings = _replica_env(monkeypatch, tmp_path, a.url, b.url)
    reg = Registry(SessionLog.from_config(settings.store))
    shared = tmp_path / "adapters"  # the adapters volume every replica mounts at the same path
    v1 = reg.register(a.add_adapter_dir(shared / "one"), parent="base")
    v2 = reg.register(a.add_adapter_dir(shared / "two"), parent=v1.name)

    # A replica fails the load: live stays, the adapter is taken back from the other, the replica is named.
    b.fail_lora_loads = "CUDA out of memory"
    assert main(["promote", v1.name]) == 1
    err = capsys.readouterr().err
    assert "ReplicaError" in err and b.url in err and "CUDA out of memory" in err and KEY not in err
    assert reg.live().name == "base" and a.adapters == {} and b.adapters == {}
    assert [(kind, name) for _, kind, name in a.lora_events] == [("load", v1.name), ("unload", v1.name)]
    assert _serve_two_sessions(settings) == ["policy", "policy"]  # `base` live: vLLM's base model name is sent

    # Both load it: live moves, and both replicas serve it to the sessions that follow.
    b.fail_lora_loads = None
    assert main(["promote", v1.name]) == 0
    assert f"live: base -> {v1.name}" in capsys.readouterr().out
    assert reg.live().name == v1.name
    assert a.adapters == b.adapters == {v1.name: v1.adapter_path}
    assert _serve_two_sessions(settings) == [v1.name, v1.name]
    assert any(s.model == v1.name for s in a.served) and any(s.model == v1.name for s in b.served)

    assert main(["promote", v2.name]) == 0
    assert a.adapters == b.adapters == {v1.name: v1.adapter_path, v2.name: v2.adapter_path}  # v1 kept for rollback

    # Rollback with a replica down: refused with the replica named; live stays and v1 stays loaded on the other.
    port = int(b.url.rsplit(":", 1)[1])
    b.stop()
    capsys.readouterr()
    assert main(["rollback"]) == 1
    err = capsys.readouterr().err
    assert b.url in err and "cannot reach" in err
    assert reg.live().name == v2.name and a.adapters == {v1.name: v1.adapter_path, v2.name: v2.adapter_path}

    # The replica restarts (without its runtime-loaded adapters): the rollback loads v1 there, then live moves back.
    restarted = VLLMStandInServer(smollm2_dir, script=research_script, api_key=KEY).start(port=port)
    try:
        assert main(["rollback", "--reason", "bad answers"]) == 0
        assert f"live: {v2.name} -> {v1.name}" in capsys.readouterr().out
        assert reg.live().name == v1.name and reg.history(limit=1)[0].reason == "bad answers"
        assert restarted.adapters == {v1.name: v1.adapter_path}
        assert v1.name in a.adapters
    finally:
        restarted.stop()


# --- a retraining cycle -----------------------------------------------------------------------------------------------


def _finite_adapter(folder: Path, server: VLLMStandInServer) -> Path:
    """A complete adapter folder with finite weights (the cycle's gate rejects a folder without them)."""
    import torch
    from safetensors.torch import save_file

    server.add_adapter_dir(folder)
    save_file({"base_model.model.layers.0.q_proj.lora_A.weight": torch.zeros(8, 16)},
              str(folder / "adapter_model.safetensors"))
    return folder


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_cycle_a_replica_fails_is_recorded_with_it_and_a_good_cycle_moves_every_replica(
    pair: tuple[VLLMStandInServer, VLLMStandInServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole cycle with its real gate (probe sessions on the replicas, the offline held-out judge); only the
    training step is replaced by a finished adapter."""
    from app.retrain import RetrainApp
    from learning.pipeline import retrain

    a, b = pair
    probes = tmp_path / "probes.txt"
    probes.write_text("Who was Haymo of Faversham?\n")
    settings = _replica_env(monkeypatch, tmp_path, a.url, b.url, LEARNING__RETRAIN__PROBE_QUESTIONS=str(probes),
                            LEARNING__RETRAIN__TOLERANCE="1.0", LEARNING__RETRAIN__MAX_TOKEN_CAPS="32")
    trained = _finite_adapter(tmp_path / "trained", a)

    async def cycle() -> Any:
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
    b.fail_lora_loads = "CUDA out of memory"
    with pytest.raises(ReplicaError):
        asyncio.run(cycle())
    failed = reg.cycles(limit=1)[0]
    assert failed.status == "failed" and failed.numbers["failed_replicas"] == [b.url]
    assert b.url in (failed.error or "") and KEY not in (failed.error or "")
    assert reg.live().name == "base" and a.adapters == {} and b.adapters == {}

    b.fail_lora_loads = None
    result = asyncio.run(cycle())
    assert result.cycle.status == "promoted", result.message
    live = reg.live()
    assert live.name == result.candidate and live.name != failed.candidate
    assert a.adapters[live.name] == b.adapters[live.name] == live.adapter_path
    assert _serve_two_sessions(settings) == [live.name, live.name]
    assert any(s.model == live.name for s in a.served) and any(s.model == live.name for s in b.served)
