"""`rubricem policy-server`'s launcher (app/policy_server.py): the command line and environment it builds from the
settings, the error when vLLM is not installed, and (issue 46) who can reach the server it starts: a bind others can
reach needs a key, the key and the app's secrets never show where they should not, and no route of vLLM's app
answers without the key. Those last checks start the real vLLM interpreter but never its engine (no model is
loaded). The real server serving is tested in tests/policy/test_vllm_contract.py and tests/app/test_vllm_loop.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from agent.config import AgentConfig
from app.cli import main
from app.policy_server import (
    GUARD_DIR,
    GUARD_MIDDLEWARE,
    VLLMNotInstalled,
    VLLMServerSpec,
    check_installed,
    omp_bind,
    server_command,
    serving_dtype,
    server_env,
    spec_from_settings,
)
from app.settings import PolicyServerConfig, Settings
from tests.conftest import VLLM_GROUP
from tests.servers import free_port

# Two tests here start real vLLM servers through `rubricem policy-server`: under xdist they run on the worker that runs
# every other real-vLLM test (tests/conftest.py), never beside them.
pytestmark = pytest.mark.xdist_group(VLLM_GROUP)


def _flags(cmd: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, arg in enumerate(cmd):
        if arg.startswith("--"):
            nxt = cmd[i + 1] if i + 1 < len(cmd) else None
            out[arg] = None if nxt is None or nxt.startswith("--") else nxt
    return out


def test_the_dtype_follows_the_cpus_bf16_instructions_unless_set(tmp_path: Path) -> None:
    """bf16 only where the CPU computes it natively: an AVX2-only AMD EPYC emulates it, about 3x slower (issue 61)."""
    intel = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    epyc = frozenset({"avx2", "fma", "f16c"})  # no AVX-512 at all
    avx512_only = frozenset({"avx2", "avx512f", "avx512bw"})  # AVX-512 without its BF16 extension
    assert serving_dtype("auto", intel) == "bfloat16"
    assert serving_dtype("auto", epyc) == serving_dtype("auto", avx512_only) == "float32"
    assert serving_dtype("auto", frozenset({"asimd", "bf16"})) == "bfloat16"  # Arm with BF16
    assert serving_dtype("auto", None) == "bfloat16"  # no /proc/cpuinfo: vLLM's CPU default
    assert serving_dtype("bfloat16", epyc) == "bfloat16" and serving_dtype("float32", intel) == "float32"
    spec = spec_from_settings(Settings(policy_server=PolicyServerConfig(dtype="float32")), model_dir=tmp_path)
    assert _flags(server_command(spec, intel))["--dtype"] == "float32"
    auto = VLLMServerSpec(model_dir=tmp_path)
    assert _flags(server_command(auto, epyc))["--dtype"] == "float32"
    assert _flags(server_command(auto, intel))["--dtype"] == "bfloat16"


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
    assert "--api-key" not in flags and "sk-LOCAL-1" not in cmd  # `ps` shows the command line to everyone
    assert flags["--allowed-origins"] == "[]" and flags["--middleware"] == GUARD_MIDDLEWARE
    env = server_env(spec, {"VLLM_API_KEY": "stale", "PATH": "/bin", "RUBRICEM_UI__PASSWORD": "x" * 12})
    assert env["VLLM_API_KEY"] == "sk-LOCAL-1" and env["PATH"] == "/bin" and env["VLLM_CPU_KVCACHE_SPACE"] == "2.5"
    assert "RUBRICEM_UI__PASSWORD" not in env and env["PYTHONPATH"] == str(GUARD_DIR)
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == omp_bind("all") and env["HF_HUB_OFFLINE"] == "1"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"  # idle OpenMP threads sleep: a trainer beside it keeps its share
    assert server_env(spec, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "PASSIVE"  # the setting wins
    assert env["TORCHINDUCTOR_VEC_ISA_OK"] == "1"  # the base vector ISA from /proc/cpuinfo (the test at the end)
    assert server_env(spec, {"TORCHINDUCTOR_VEC_ISA_OK": "0"})["TORCHINDUCTOR_VEC_ISA_OK"] == "0"  # asked: probes
    openmp_own = VLLMServerSpec(model_dir=tmp_path, omp_wait_policy="default")
    assert "OMP_WAIT_POLICY" not in server_env(openmp_own, {}) and \
        server_env(openmp_own, {"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    closed = server_env(VLLMServerSpec(model_dir=tmp_path, runtime_lora=False, cpu_bind="auto"), {"VLLM_API_KEY": "x"})
    assert closed["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "0" and "VLLM_CPU_OMP_THREADS_BIND" not in closed
    assert "VLLM_API_KEY" not in closed  # a stale key in the environment is never inherited
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


# ---- issue 46, item 4: who can reach the server, and what its process shows -------------------------------------

ROOT = Path(__file__).resolve().parents[2]
KEY = "policy-key-6f0c2a9e-51d4-4b8e-9a37-c1d2e3f4a5b6"  # 48 characters
SECRETS = {  # what the app's own environment holds and the vLLM process has no use for
    "RUBRICEM_UI__PASSWORD": "ui-password-never-in-vllm",
    "RUBRICEM_MCP__TOKEN": "mcp-token-never-in-vllm-0123456789abcdef",
    "RUBRICEM_LEARNING__JUDGE__API_KEY": "judge-key-never-in-vllm",
    "OPENAI_API_KEY": "sk-provider-never-in-vllm",
    "HF_TOKEN": "hf_never_in_vllm",
}


def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env


def _recorder(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that stands where the vLLM interpreter would and notes every time it is run (it never is)."""
    notes = tmp_path / "started.txt"
    exe = tmp_path / "venv" / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!/bin/sh\necho \"$@\" >> '{notes}'\nexit 3\n", encoding="utf-8")
    exe.chmod(0o700)
    return exe, notes


@pytest.mark.parametrize("host,key", [("0.0.0.0", None), ("10.0.0.5", None), ("::", None),
                                      ("0.0.0.0", "short-key-0123456789"), ("127.0.0.2", None)])
def test_a_bind_others_can_reach_needs_a_strong_key_and_nothing_starts_without_one(
        host: str, key: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    _clean_env(monkeypatch, tmp_path)
    exe, notes = _recorder(tmp_path)
    monkeypatch.setenv("RUBRICEM_POLICY_SERVER__PYTHON", str(exe))
    if key is not None:
        monkeypatch.setenv("RUBRICEM_AGENT__POLICY_API_KEY", key)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    assert main(["policy-server", "--host", host, "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "RUBRICEM_AGENT__POLICY_API_KEY" in err and "127.0.0.1" in err, err
    assert key is None or key not in err
    assert not notes.exists(), "the vLLM interpreter was run"


def _vllm_python() -> Path:
    """The real vLLM interpreter (`make vllm`), or skip (fail under `make test`) as the other vLLM tests do."""
    from app.policy_server import DEFAULT_VLLM_ENV

    python = Settings().policy_server.python or DEFAULT_VLLM_ENV / "bin" / "python"
    try:
        check_installed(python)
    except VLLMNotInstalled as exc:
        if os.environ.get("RUBRICEM_TEST_REQUIRE_VLLM") == "1":
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    return python


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@dataclass(frozen=True)
class Launched:
    """What the real vLLM process `rubricem policy-server` started shows to `ps` and holds in its environment."""

    cmdline: list[str]
    environ: dict[str, str]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Launched:
    """`rubricem policy-server` with a key and the app's secrets in its environment, started as an operator would;
    its vLLM child is read through /proc as soon as it has exec'd, then the command is stopped (SIGTERM), long
    before vLLM would load anything (the model folder holds no weights)."""
    python = _vllm_python()
    tmp = tmp_path_factory.mktemp("policy-server")
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    env.update(SECRETS)
    env.update({"RUBRICEM_POLICY_SERVER__PYTHON": str(python), "RUBRICEM_AGENT__POLICY_API_KEY": KEY,
                "RUBRICEM_AGENT__POLICY_BASE_URL": f"http://127.0.0.1:{free_port()}",
                "PYTHONPATH": str(ROOT)})
    log = tmp / "policy-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "policy-server", "--model", str(model)], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            for child in _children(proc.pid):
                try:
                    cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                    environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"vllm.entrypoints.openai.api_server" in cmdline:
                    return Launched([a.decode() for a in cmdline if a],
                                    dict(e.decode().split("=", 1) for e in environ if b"=" in e))
            time.sleep(0.02)
        why = log.read_text(errors="replace")[-3000:] if proc.poll() is not None else "timed out"
        pytest.fail(f"rubricem policy-server started no vLLM process: {why}", pytrace=False)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the command stops vLLM's whole process group
        proc.wait(timeout=120)


@pytest.mark.slow
def test_the_key_is_not_on_the_command_line_and_no_app_secret_reaches_vllm(launched: Launched) -> None:
    shown = " ".join(launched.cmdline)  # what `ps` shows every user of the machine
    assert KEY not in shown and "--api-key" not in shown, shown
    assert launched.environ.get("VLLM_API_KEY") == KEY  # the environment: readable only by its owner
    leaked = {k for k, v in launched.environ.items() if k in SECRETS or v in SECRETS.values()}
    assert not leaked, f"the vLLM process got the app's secrets: {sorted(leaked)}"
    assert not [k for k in launched.environ if k.startswith("RUBRICEM_")]


HARNESS = """
import json, sys, uvicorn
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[2:])
uvicorn.run(build_app(args, ("generate",)), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            lifespan="off")  # vLLM's lifespan needs the engine's state
"""


@pytest.mark.slow
def test_no_route_of_the_launched_vllm_answers_without_the_key(launched: Launched, tmp_path: Path) -> None:
    """vLLM 0.32's `--api-key` guards only /v1, /v2, /inference and /cohere: /invocations (SageMaker inference),
    /adapters (SageMaker's LoRA load and unload), /tokenize and /metrics stay open. vLLM's real app, built from the
    argv and environment the launched process got, without its engine (no model is loaded: a handler that gets
    through answers 500, a refused request 401 or 403)."""
    script = tmp_path / "harness.py"
    script.write_text(HARNESS, encoding="utf-8")
    port = free_port()
    args = launched.cmdline[launched.cmdline.index("vllm.entrypoints.openai.api_server") + 1:]
    log = tmp_path / "harness.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([launched.cmdline[0], str(script), str(port), *args], env=launched.environ,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                httpx.get(f"{root}/health", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "vLLM's app did not serve"
                time.sleep(0.3)
        anyone = {
            "invocations": httpx.post(f"{root}/invocations", json={"prompt": "hi", "max_tokens": 1}),
            "adapters load": httpx.post(f"{root}/adapters", json={"name": "evil", "src": "/tmp/evil"}),
            "adapters unload": httpx.delete(f"{root}/adapters/policy"),
            "load_lora_adapter": httpx.post(f"{root}/v1/load_lora_adapter", json={"lora_name": "e", "lora_path": "/"}),
            "tokenize": httpx.post(f"{root}/tokenize", json={"prompt": "hi"}),
            "metrics": httpx.get(f"{root}/metrics"),
            "wrong key": httpx.post(f"{root}/invocations", json={"prompt": "hi"},
                                    headers={"Authorization": "Bearer " + "x" * len(KEY)}),
        }
        auth = {"Authorization": f"Bearer {KEY}"}
        browser = httpx.post(f"{root}/v1/load_lora_adapter", json={"lora_name": "e", "lora_path": "/"},
                             headers={**auth, "Origin": "http://evil.example"})
        keyed = httpx.post(f"{root}/invocations", json={"prompt": "hi", "max_tokens": 1}, headers=auth)
        health = httpx.get(f"{root}/health")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert {name: r.status_code for name, r in anyone.items()} == {name: 401 for name in anyone}
    assert browser.status_code == 403  # a web page (any Origin) is refused even with the key
    assert keyed.status_code not in (401, 403) and health.status_code not in (401, 403)


ISA_CHILD = """
import sys
import torch
import torch._inductor.cpu_vec_isa as isa
if sys.argv[1] == "probes fail":  # what happened once under load: every vector-ISA dlopen probe failed
    isa.VecISA._probe_load = lambda self, path: False
count = torch.compile(lambda x, t: (x >= t).sum(-1), dynamic=False)  # the shape of vLLM's logprob-rank kernel
print(count(torch.arange(64.0).reshape(2, 32), torch.tensor([[3.0], [40.0]])).tolist())
"""


@pytest.mark.slow
def test_a_restart_whose_isa_probes_fail_still_compiles_the_kernels_cached_by_an_earlier_start(tmp_path: Path) -> None:
    """The CI failure of 2026-11-29: a restarted replica took a vectorised kernel from inductor's on-disk cache, its
    own ISA probes had all failed, so it compiled that code with no vector ISA, and the engine died. In the server's
    environment the base ISA comes from /proc/cpuinfo, so the cached kernel compiles however the probes go."""
    python = _vllm_python()
    env = server_env(VLLMServerSpec(model_dir=tmp_path)) | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    runs = {}
    for case in ("first start", "probes fail"):
        run = subprocess.run([str(python), "-c", ISA_CHILD, case], env=env, capture_output=True, text=True,
                             timeout=600, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        runs[case] = run.stdout.strip().splitlines()[-1]
    assert runs == {"first start": "[29, 24]", "probes fail": "[29, 24]"}
