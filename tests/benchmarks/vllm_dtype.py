"""Benchmark (not a test): the real vLLM's decode rate with bfloat16 against float32 weights, with this CPU's vector
instructions and with them held down to AVX2 (issue 61: choose the served dtype by the CPU's features).

An AMD EPYC without AVX-512 ran the real-vLLM tests about 3x slower than an Intel with AVX-512 BF16, serving bf16 on
a CPU that has no bf16 instructions. On a machine that has them, the AVX2 rows approximate such a CPU: torch's own
kernels are held to AVX2 (ATEN_CPU_CAPABILITY=avx2) and so is oneDNN (ONEDNN_MAX_CPU_ISA=AVX2); vLLM's few kernels
of its own are not, so the AVX2 rows are an upper bound for a real AVX2-only CPU. Each configuration starts its own
server, in turn, with the project's flags (`app.policy_server`), and decodes on the base weights: one sequence, and
8 at once (aggregate), `--tokens` new tokens each at temperature 0.7, best of `--reps`.

    .venv/bin/python tests/benchmarks/vllm_dtype.py [--tokens 128] [--reps 2] [--out docs/vllm/dtype.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from agent.policy import VLLMPolicyClient  # noqa: E402
from app.policy_server import LocalVLLMServer, VLLMServerSpec, serving_dtype  # noqa: E402
from learning.engines.llamacpp_build import cpu_flags  # noqa: E402
from learning.engines.threads import cpu_model  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402
from tests.benchmarks.vllm_engine import MESSAGES, _rates, say  # noqa: E402
from tests.servers import free_port  # noqa: E402

MODEL_CACHE = ROOT / ".cache" / "models"
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def measure(model_dir: Path, dtype: str, isa_env: dict[str, str], args: argparse.Namespace,
            log: Path) -> dict[str, Any]:
    """Start a server for one configuration, decode, stop it."""
    saved = {k: os.environ.get(k) for k in isa_env}
    os.environ.update(isa_env)  # the server inherits them (app.policy_server's allow-list: ATEN_, ONEDNN_)
    try:
        spec = VLLMServerSpec(model_dir=model_dir, port=free_port(), dtype=dtype)
        started = time.perf_counter()
        server = LocalVLLMServer(spec, log_path=log).start(timeout_s=900)
        start_s = time.perf_counter() - started
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    async def rows() -> dict[str, Any]:
        client = VLLMPolicyClient(server.url, "policy", timeout_s=1200, max_retries=0)
        try:
            ctx = await client.render_prompt(MESSAGES)
            await client.generate(ctx, stop=[], max_tokens=8, temperature=0.0)  # warm-up

            def gen(seed: int) -> Any:
                return client.generate(ctx, stop=[], max_tokens=args.tokens, temperature=0.7, seed=seed)

            return {"one": await _rates(gen, 1, args.reps), "eight": await _rates(gen, 8, args.reps)}
        finally:
            await client.aclose()

    try:
        got = asyncio.run(rows())
    finally:
        server.stop()
    return {"dtype": dtype, "isa": "avx2" if isa_env else "native", "start_s": round(start_s, 1), **got}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model_dir = ensure_converted(MODEL_CACHE)
    flags = cpu_flags()
    results: dict[str, Any] = {
        "cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
        "auto_dtype": serving_dtype("auto", flags), "tokens": args.tokens, "reps": args.reps,
        "when": time.strftime("%Y-%m-%d %H:%M"), "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        for isa_env in ({}, AVX2_ONLY):
            for dtype in ("bfloat16", "float32"):
                say(f"{dtype}, {'avx2' if isa_env else 'native'}: starting")
                log = Path(tmp) / f"{dtype}-{len(isa_env)}.log"
                try:
                    row = measure(model_dir, dtype, isa_env, args, log)
                except Exception as exc:  # noqa: BLE001 - a configuration that cannot serve is a result, not the end
                    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.is_file() else []
                    cause = [ln for ln in lines if "Error" in ln or "error" in ln][-3:]
                    row = {"dtype": dtype, "isa": "avx2" if isa_env else "native", "error": str(exc)[:300],
                           "server_log": [ln[-300:] for ln in cause]}
                say(f"  {row}")
                results["rows"].append(row)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
