"""`rubricem policy-server`'s launcher (app/policy_server.py) without starting vLLM: the command line and environment
it builds from the settings, and the error when vLLM is not installed. The real server it starts is tested in
tests/policy/test_vllm_contract.py and tests/app/test_vllm_loop.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.config import AgentConfig
from app.cli import main
from app.policy_server import (
    VLLMNotInstalled,
    VLLMServerSpec,
    check_installed,
    omp_bind,
    server_command,
    server_env,
    spec_from_settings,
)
from app.settings import PolicyServerConfig, Settings


def _flags(cmd: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, arg in enumerate(cmd):
        if arg.startswith("--"):
            nxt = cmd[i + 1] if i + 1 < len(cmd) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_the_spec_follows_the_app_settings_and_the_command_carries_the_flags_the_app_needs(tmp_path: Path) -> None:
    settings = Settings(agent=AgentConfig(policy_base_url="http://127.0.0.1:8123", policy_model="served",
                                          policy_api_key="sk-LOCAL-1"),
                        policy_server=PolicyServerConfig(python=tmp_path / "py", kv_cache_gib=2.5, max_lora_rank=32))
    spec = spec_from_settings(settings, model_dir=tmp_path / "model")
    assert (spec.host, spec.port, spec.served_name, spec.url) == ("127.0.0.1", 8123, "served", "http://127.0.0.1:8123")
    cmd = server_command(spec)
    assert cmd[:3] == [str(tmp_path / "py"), "-m", "vllm.entrypoints.openai.api_server"]
    flags = _flags(cmd)
    assert flags["--model"] == str(tmp_path / "model") and flags["--served-model-name"] == "served"
    assert flags["--port"] == "8123" and flags["--host"] == "127.0.0.1" and "--enable-lora" in flags
    assert flags["--max-lora-rank"] == "32" and flags["--logprobs-mode"] == "processed_logprobs"
    assert flags["--api-key"] == "sk-LOCAL-1"  # by flag, never inherited from the environment
    env = server_env(spec, {"VLLM_API_KEY": "stale", "PATH": "/bin"})
    assert "VLLM_API_KEY" not in env and env["PATH"] == "/bin" and env["VLLM_CPU_KVCACHE_SPACE"] == "2.5"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == omp_bind("all") and env["HF_HUB_OFFLINE"] == "1"
    closed = server_env(VLLMServerSpec(model_dir=tmp_path, runtime_lora=False, cpu_bind="auto"), {})
    assert closed["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in closed
    cores = sorted(os.sched_getaffinity(0))
    assert omp_bind("all") in (f"{cores[0]}-{cores[-1]}", ",".join(map(str, cores))) and omp_bind("0") == "0"


def test_a_missing_vllm_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(VLLMNotInstalled, match="make vllm"):
        check_installed(tmp_path / "no-env" / "bin" / "python")
    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RUBRICEM_POLICY_SERVER__PYTHON", str(tmp_path / "no-env" / "bin" / "python"))
    model = tmp_path / "model"
    model.mkdir()
    assert main(["policy-server", "--model", str(model), "--port", "8999"]) == 1
    err = capsys.readouterr().err
    assert "VLLMNotInstalled" in err and "make vllm" in err and "no-env" in err
