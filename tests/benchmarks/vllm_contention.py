"""Benchmark (not a test): the local vLLM CPU server beside other work on the same cores (issue 47).

vLLM's CPU worker runs each forward pass on an OpenMP team bound to cores (`VLLM_CPU_OMP_THREADS_BIND`), and OpenMP
threads busy-wait at every barrier. In the product's retraining cycle the trainer (torch, every core) and the server
share the machine. For each binding setting, with its own server start, this script measures in one run:

- one-token latency: `--reps` requests of a ~60-token prompt with `max_tokens=1` (temperature 0), with the cores
  to itself, then beside a neighbour on every CPU and beside a neighbour on one thread; median, p90 and slowest;
- a `--tokens`-token generation's tokens/s in the same three conditions;
- the neighbour's own rate (torch 512x512 matrix products per second on every CPU) with no server, with the
  server idle, and while it serves: what the server costs the trainer.

Settings (`--settings`, default all):
  all            VLLM_CPU_OMP_THREADS_BIND over every core, OpenMP's own wait policy (the default before issue 47)
  all-passive    the same, with OMP_WAIT_POLICY=PASSIVE: an OpenMP thread that waits sleeps instead of spinning
                 (`policy_server.omp_wait_policy`, the default since this measurement)
  one            one core (the first), the others left to the neighbour

    .vllm must exist (`make vllm`).
    .venv/bin/python tests/benchmarks/vllm_contention.py --out docs/vllm/contention.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import httpx  # noqa: E402

from app.policy_server import LocalVLLMServer, VLLMServerSpec  # noqa: E402
from learning.engines.threads import available_cpus  # noqa: E402
from learning.engines.weights import ensure_converted  # noqa: E402

MODEL_CACHE = ROOT / ".cache" / "models"
PROMPT = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a short history of "
          "the Franciscan order, from its founding by Francis of Assisi to the reforms of the sixteenth century, "
          "naming the friars who taught at Paris and Oxford.<|im_end|>\n<|im_start|>assistant\n")
NEIGHBOUR = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(512, 512)
out = open(sys.argv[2], "w")
n, t0 = 0, time.monotonic()
while True:
    a @ a
    n += 1
    if n % 20 == 0:
        out.write(f"{time.monotonic() - t0:.4f} {n}\\n"); out.flush()
"""
SETTINGS: dict[str, dict[str, Any]] = {
    "all": {"cpu_bind": "all", "omp_wait_policy": "default"},
    "all-passive": {"cpu_bind": "all", "omp_wait_policy": "passive"},  # the default since issue 47
    "one": {"cpu_bind": "0", "omp_wait_policy": "default"},
}


class Neighbour:
    """A torch process doing matrix products on `threads` threads; `rate()` is its products/s over a window."""

    def __init__(self, threads: int) -> None:
        self.log = Path(tempfile.mkstemp(prefix="neighbour-", suffix=".log")[1])
        self.proc = subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(threads), str(self.log)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3.0)  # torch's import and the first products

    def _last(self) -> tuple[float, int]:
        lines = self.log.read_text().split()
        return (float(lines[-2]), int(lines[-1])) if len(lines) >= 2 else (0.0, 0)

    def mark(self) -> tuple[float, int]:
        return self._last()

    def rate_since(self, mark: tuple[float, int]) -> float:
        t, n = self._last()
        return round((n - mark[1]) / (t - mark[0]), 1) if t > mark[0] else 0.0

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.unlink(missing_ok=True)


def _request(client: httpx.Client, url: str, tokens: int) -> tuple[float, int]:
    t = time.perf_counter()
    r = client.post(f"{url}/v1/completions", json={"model": "policy", "prompt": PROMPT, "max_tokens": tokens,
                                                   "temperature": 0.0, "ignore_eos": True}, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t, int(r.json()["usage"]["completion_tokens"])


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_s": round(statistics.median(xs), 3), "p90_s": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 3),
            "max_s": round(xs[-1], 3)}


def measure(server: LocalVLLMServer, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client() as client:
        _request(client, server.url, 1)  # warm-up
        for label, threads in (("idle", 0), ("beside_all_cpus", available_cpus()), ("beside_one_thread", 1)):
            neighbour = Neighbour(threads) if threads else None
            try:
                lat = [_request(client, server.url, 1)[0] for _ in range(args.reps)]
                mark = neighbour.mark() if neighbour else None
                dt, k = _request(client, server.url, args.tokens)
                row = {"one_token": _stats(lat), "generation_tok_s": round(k / dt, 1), "generation_tokens": k}
                if neighbour and mark:
                    row["neighbour_rate_while_serving"] = neighbour.rate_since(mark)
                    idle_mark = neighbour.mark()
                    time.sleep(args.idle_window)
                    row["neighbour_rate_server_idle"] = neighbour.rate_since(idle_mark)
            finally:
                if neighbour:
                    neighbour.stop()
            out[label] = row
            print(f"  {label:18} one token median {row['one_token']['median_s']} s, p90 {row['one_token']['p90_s']}, "
                  f"max {row['one_token']['max_s']}; {row['generation_tok_s']} tok/s"
                  + (f"; neighbour {row.get('neighbour_rate_server_idle')}/s with the server idle, "
                     f"{row.get('neighbour_rate_while_serving')}/s while it serves" if threads else ""), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--reps", type=int, default=12, help="one-token requests per condition")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--idle-window", type=float, default=8.0, help="seconds the neighbour runs beside an idle server")
    ap.add_argument("--out", default=str(ROOT / "docs" / "vllm" / "contention.json"))
    args = ap.parse_args()
    model_dir = ensure_converted(MODEL_CACHE)
    started, load_before = time.time(), os.getloadavg()
    print("the neighbour alone ...", flush=True)
    alone = Neighbour(available_cpus())
    mark = alone.mark()
    time.sleep(args.idle_window)
    baseline = {"neighbour_rate_all_cpus_no_server": alone.rate_since(mark)}
    alone.stop()
    one = Neighbour(1)
    mark = one.mark()
    time.sleep(args.idle_window)
    baseline["neighbour_rate_one_thread_no_server"] = one.rate_since(mark)
    one.stop()
    print(f"  {baseline}", flush=True)
    rows: dict[str, Any] = {}
    for name in [s for s in args.settings.split(",") if s]:
        setting = SETTINGS[name]
        print(f"{name}: starting vLLM ...", flush=True)
        log = Path(tempfile.mkdtemp(prefix="vllm-contention-")) / "vllm.log"
        server = LocalVLLMServer(VLLMServerSpec(model_dir=model_dir, port=8731, cpu_bind=setting["cpu_bind"],
                                                omp_wait_policy=setting["omp_wait_policy"]), log_path=log)
        try:
            t = time.monotonic()
            server.start(timeout_s=600)
            start_s = round(time.monotonic() - t, 1)
            rows[name] = {**setting, "start_s": start_s, **measure(server, args)}
        finally:
            server.stop()
    result = {"when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)), "machine": platform.processor()
              or platform.machine(), "cpus": available_cpus(), "loadavg_before": [round(x, 2) for x in load_before],
              "baseline": baseline, "settings": rows, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
              "seconds": round(time.time() - started)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
