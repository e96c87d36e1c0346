"""Learning check (a script, not a test): does held-out reward rise after N SS-GRPO steps, and how fast compared
with the answer-only baseline (plain GRPO on the Answer score)?

For each credit mode it runs the real training loop (`learning.grpo.train` on the embedded SmolLM2, offline judge,
questions about the bundled Wikipedia corpus), then replays the adapters the run saved (NAME@STEP) on held-out
questions: each question is researched `--eval-samples` times with fixed sampling seeds (the same seeds at every step
and in every mode, so curves differ by the weights, not by the draw), judged as one group by the same offline judge,
and the four stage scores and their mean ("total") are averaged. Step 0 is the base model, evaluated once and shared
by the modes (a fresh LoRA adapter has B = 0, so it computes the base model's outputs). With `--init-adapter` (RL after
SFT, METHOD §10) both modes start from that adapter instead, and step 0 is the adapter itself. Bank injection is off in
the evaluation so it measures the policy alone.

Writes OUT/learning_check.json (every number, per-sample scores included) and OUT/learning_check.png (curves).

    .venv/bin/python tests/benchmarks/learning_check.py --quick --out /tmp/lc-quick
    .venv/bin/python tests/benchmarks/learning_check.py --steps 7 --eval-every 7 --heldout 12 --eval-samples 2 \
        --batch-questions 2 --rollouts 4 --temperature 0.8 --caps 16,32,16,48 --max-tool-calls 1 --lr 2e-3 \
        --snippets 2 --snippet-chars 300 --threads 2 --dtype bfloat16 \
        --out docs/learning_check        # the recorded run: about 50 min on 2 idle CPU cores
    .venv/bin/python tests/benchmarks/learning_check.py --init-adapter agent/adapters/smollm2-sft --steps 2 \
        --eval-every 2 --heldout 4 --eval-samples 1 --batch-questions 1 --rollouts 4 --temperature 0.8 \
        --caps 352,128,224,160 --max-tool-calls 2 --lr 5e-5 --snippets 3 --snippet-chars 300 --threads 2 \
        --dtype bfloat16 --out docs/learning_check/sft   # from the shipped SFT adapter; caps fit its plans (p90)

From an SFT adapter the learning rate must be small: Adam's first steps move every parameter by about lr, and the
shipped adapter's LoRA B weights average |5.3e-3|, so lr 5e-4 (measured: one step) moved them ~10 % at once and the
policy stopped writing plans (`<structured_plan></structured_plan>`; held-out Plan 1.00 -> 0.00 after 2 steps).

The recorded runs are --seed 0 (docs/learning_check) and --seed 1 (docs/learning_check/seed1, other held-out
questions); `learning_check_pool.py` pools their paired differences.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub here: everything is bundled or converted locally
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig
from agent.tools.registry import build_tools
from app.container import build_judge, ensure_corpus, open_index
from app.service import ResearchService
from app.settings import Settings
from app.training import build_trainer, question_pool
from learning.grpo import run_options, train
from learning.train_config import TrainConfig, load_config
from store.config import StoreConfig
from store.records import STAGES
from store.session_log import SessionLog

DEFAULT_MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
CREDITS = ("ss-grpo", "answer-only")
METRICS = (*STAGES, "total")


@dataclass(frozen=True)
class CheckOptions:
    """What one learning check runs (command-line options after the --quick preset)."""

    steps: int
    eval_every: int
    heldout: int
    eval_samples: int
    credits: tuple[str, ...]
    delta: float
    n_questions: int
    batch_questions: int
    rollouts: int
    lr: float
    lora_r: int
    max_tool_calls: int
    plan_tokens: int
    research_tokens: int
    review_tokens: int
    answer_tokens: int
    temperature: float
    reflection: bool
    seed: int
    threads: int
    engine: str
    snippets: int
    snippet_chars: int
    grad_checkpointing: bool
    dtype: str = "float32"
    bootstrap: int = 2000
    init_adapter: Path | None = None  # RL after SFT: both modes start from this LoRA adapter (step 0 = it)


@dataclass
class SampleResult:
    """One held-out rollout and its judged stage scores."""

    question: int
    sample: int
    seed: int
    scores: dict[str, float]  # plan/research/review/answer/total
    stages_present: list[str]
    malformed: bool
    tool_calls: int
    answer_excerpt: str
    failed: str | None = None


@dataclass
class EvalPoint:
    """Held-out evaluation of one adapter (step 0 = base model)."""

    step: int
    version: str
    seconds: float
    mean: dict[str, float]
    stderr: dict[str, float]  # standard error over held-out questions (per-question means)
    samples: list[SampleResult] = field(default_factory=list)


def eval_seed(seed: int, question: int, sample: int) -> int:
    """Sampling seed of one held-out rollout: the same at every step and in every mode (common random numbers)."""
    return (seed * 7_919 + 1_000_000 + question * 131 + sample) % (2**31 - 1)


def eval_steps(steps: int, every: int) -> list[int]:
    """The steps whose adapters are evaluated: 0, every, 2·every, ..., and always the last."""
    out = list(range(0, steps + 1, max(1, every)))
    if out[-1] != steps:
        out.append(steps)
    return out


def question_means(samples: Sequence[SampleResult], metric: str) -> dict[int, float]:
    """Per held-out question, the mean of `metric` over its samples (failed rollouts count as 0, like training)."""
    by_q: dict[int, list[float]] = {}
    for s in samples:
        by_q.setdefault(s.question, []).append(s.scores[metric])
    return {q: statistics.fmean(v) for q, v in sorted(by_q.items())}


def summarise(samples: Sequence[SampleResult]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and standard error over questions of every metric."""
    mean, se = {}, {}
    for m in METRICS:
        per_q = list(question_means(samples, m).values())
        mean[m] = round(statistics.fmean(per_q), 4) if per_q else float("nan")
        se[m] = round(statistics.stdev(per_q) / math.sqrt(len(per_q)), 4) if len(per_q) > 1 else float("nan")
    return mean, se


def paired_difference(base: Sequence[SampleResult], after: Sequence[SampleResult], metric: str, resamples: int,
                      seed: int) -> dict[str, float]:
    """after − base on the same held-out questions: mean, bootstrap 95% CI over questions, sign-flip p-value.

    The unit is the question (its samples are averaged), since samples of one question are not independent.
    """
    b, a = question_means(base, metric), question_means(after, metric)
    diffs = [a[q] - b[q] for q in b if q in a]
    if not diffs:
        return {"mean": float("nan"), "ci_low": float("nan"), "ci_high": float("nan"), "p_sign_flip": float("nan"),
                "questions": 0}
    rng = random.Random(seed)
    n = len(diffs)
    boots = sorted(statistics.fmean(rng.choice(diffs) for _ in range(n)) for _ in range(resamples))
    observed = statistics.fmean(diffs)
    # Two-sided sign-flip permutation test: under "no effect" each question's difference is as likely negative.
    if n <= 16:
        flips = [statistics.fmean(d * (1 if (mask >> i) & 1 else -1) for i, d in enumerate(diffs))
                 for mask in range(2**n)]
    else:
        flips = [statistics.fmean(d * rng.choice((1, -1)) for d in diffs) for _ in range(resamples)]
    p = sum(1 for f in flips if abs(f) >= abs(observed) - 1e-12) / len(flips)
    return {"mean": round(observed, 4), "ci_low": round(boots[int(0.025 * resamples)], 4),
            "ci_high": round(boots[min(resamples - 1, int(0.975 * resamples))], 4), "p_sign_flip": round(p, 4),
            "questions": n}


def pooled_difference(reports: Sequence[Mapping[str, Any]], credit: str, metric: str, resamples: int = 4000,
                      seed: int = 0) -> dict[str, float]:
    """`paired_difference` of final − base over the held-out questions of several reports (runs with other seeds).

    Each (report, question) is one unit: a question that two runs share counts twice, once per run's own samples.
    """
    base: list[SampleResult] = []
    after: list[SampleResult] = []
    for k, report in enumerate(reports):
        mode = next((m for m in report["modes"] if m["credit"] == credit), None)
        if mode is None:
            raise ValueError(f"report {k} has no {credit!r} run")
        for point, into in ((mode["eval"][0], base), (mode["eval"][-1], after)):
            into.extend(SampleResult(**{**s, "question": k * 100_000 + s["question"]}) for s in point["samples"])
    return paired_difference(base, after, metric, resamples, seed)


def steps_to_target(points: Sequence[EvalPoint], base_total: float, delta: float) -> int | None:
    """The first evaluated step (> 0) whose held-out mean total exceeds base + delta, else None."""
    for p in points:
        if p.step > 0 and p.mean["total"] > base_total + delta:
            return p.step
    return None


def make_config(opts: CheckOptions, credit: str, runs: Path) -> TrainConfig:
    """The TrainConfig of one credit mode's run (its folder under `runs`)."""
    name = f"lc-{credit}"
    return load_config(
        None, None, name=name, credit=credit, out_dir=runs / name, steps=opts.steps,
        n_questions=opts.n_questions, heldout_questions=opts.heldout, batch_questions=opts.batch_questions,
        rollouts=opts.rollouts, lr=opts.lr, lora_r=opts.lora_r, lora_alpha=2 * opts.lora_r,
        max_tool_calls=opts.max_tool_calls, plan_tokens=opts.plan_tokens, research_tokens=opts.research_tokens,
        review_tokens=opts.review_tokens, answer_tokens=opts.answer_tokens, temperature=opts.temperature,
        reflection=opts.reflection, judge="offline", seed=opts.seed, gradient_checkpointing=opts.grad_checkpointing,
        dtype=opts.dtype, init_adapter=opts.init_adapter,
        # One checkpoint at the end: this check never resumes, and save_state every step costs CPU time.
        checkpoint_every=opts.steps, keep_checkpoints=1,
    )


def offline_settings(data_dir: Path, model_dir: Path, snippets: int = 5, snippet_chars: int = 700,
                     adapter: Path | None = None, engine: str = "torch") -> Settings:
    """Settings for a throwaway data folder, the converted SmolLM2 (plus `adapter`, if given, as the policy's starting
    weights), smaller tool outputs, the offline judge; rollouts decoded by `engine` (llamacpp: the bundled GGUF,
    which `model_dir` was converted from)."""
    from learning.engines.weights import bundled_gguf_path

    s = Settings(store=StoreConfig(data_dir=data_dir), agent=AgentConfig(
        embedded_model_path=model_dir, embedded_adapter_path=adapter, local_search_k=snippets,
        snippet_chars=snippet_chars, embedded_engine=engine,
        embedded_gguf_path=bundled_gguf_path() if engine == "llamacpp" else None))
    return s.model_copy(update={"learning": s.learning.model_copy(update={
        "judge": s.learning.judge.model_copy(update={"base_url": None})})})


def judged_scores(judgement: Any) -> dict[str, float]:
    """A judgement's stage scores (a stage the judge could not score counts 0) and their mean as `total`; shared with
    the learning curve's evaluator so both read a judgement the same way."""
    raw = judgement.stage_scores()
    scores = {s: float(v) if (v := raw[s]) is not None else 0.0 for s in STAGES}
    scores["total"] = statistics.fmean(scores[s] for s in STAGES)
    return scores


class Evaluator:
    """Held-out evaluation: its own session log and research service (no bank), the offline judge."""

    def __init__(self, settings: Settings, policy: Any, log_path: Path) -> None:
        self.log = SessionLog(log_path)
        index = open_index(settings)
        ensure_corpus(index)
        self.service = ResearchService(policy, build_tools(settings.agent, index), self.log, settings.agent, None)
        self.judge = build_judge(settings, self.log)

    async def run(self, cfg: TrainConfig, questions: Sequence[str], samples: int, step: int, version: str,
                  say: Any) -> EvalPoint:
        """Research every held-out question `samples` times, judge each question's samples as one group."""
        began = time.perf_counter()
        results: list[SampleResult] = []
        for qi, question in enumerate(questions):
            trajs, metas = [], []
            for si in range(samples):
                seed = eval_seed(cfg.seed, qi, si)
                try:
                    out = await self.service.run(question, run_options(cfg, seed, "none"), source="eval")
                except Exception as exc:  # noqa: BLE001 - a failed rollout scores 0, as in training's counts
                    results.append(SampleResult(qi, si, seed, dict.fromkeys(METRICS, 0.0), [], True, 0, "",
                                                failed=f"{type(exc).__name__}: {exc}"))
                    continue
                trajs.append(out.trajectory)
                metas.append((si, seed, out))
            if not trajs:
                continue
            judgements = await self.judge.judge_group(question, trajs)
            for (si, seed, out), j in zip(metas, judgements, strict=True):
                scores = judged_scores(j)
                t = out.trajectory
                results.append(SampleResult(
                    qi, si, seed, {k: round(v, 4) for k, v in scores.items()}, sorted(t.stages_present),
                    bool(t.malformed), len(t.tool_calls), out.report.markdown[:300]))
            say(f"  eval {version}: question {qi + 1}/{len(questions)} done")
        mean, se = summarise(results)
        return EvalPoint(step, version, round(time.perf_counter() - began, 1), mean, se, results)


async def run_mode(opts: CheckOptions, credit: str, settings: Settings, runs: Path, base: EvalPoint | None,
                   say: Any) -> dict[str, Any]:
    """Train one credit mode (run folder under `runs`), then evaluate its adapters on the held-out questions."""
    cfg = make_config(opts, credit, runs)
    assert cfg.out_dir is not None
    if cfg.out_dir.exists():
        shutil.rmtree(cfg.out_dir)  # a fresh run: an existing folder would make `train` resume
    _train_q, heldout = question_pool(cfg)
    parts, run_dir = build_trainer(settings, cfg, say)
    evaluator = Evaluator(settings, parts.policy, runs / f"eval-{credit}.sqlite3")
    points: list[EvalPoint] = []
    try:
        if base is None:
            start = "init" if opts.init_adapter else "base"
            say(f"[{credit}] evaluating the {start} policy on {len(heldout)} held-out questions")
            base = await evaluator.run(cfg, heldout, opts.eval_samples, 0, start, say)
            say(f"[{credit}] {start}: {fmt(base.mean)}")
        points.append(base)
        rows: list[dict[str, Any]] = []

        def on_row(row: dict[str, Any]) -> None:
            if "message" in row:
                say(f"[{credit}] {row['message']}")
                return
            rows.append(row)
            r: dict[str, float] = {s: row.get(f"reward/{s}", float("nan")) for s in STAGES}
            say(f"[{credit}] step {row['step'] + 1}/{cfg.steps}: train reward {fmt(r)} | loss "
                f"{row['task/loss']:+.4f} | grad {row.get('task/grad_norm', float('nan')):.3f} | {row['seconds']:.0f}s")

        began = time.perf_counter()
        summary = await train(cfg, parts, run_dir, progress=on_row)
        train_seconds = time.perf_counter() - began
        eval_began = time.perf_counter()
        for step in eval_steps(cfg.steps, opts.eval_every)[1:]:
            version = f"{cfg.name}@{step}"
            await parts.policy.aload_adapter(run_dir / "adapters" / version, version)  # type: ignore[attr-defined]
            point = await evaluator.run(cfg, heldout, opts.eval_samples, step, version, say)
            say(f"[{credit}] step {step}: held-out {fmt(point.mean)}")
            points.append(point)
        eval_seconds = time.perf_counter() - eval_began
    finally:
        await parts.policy.aclose()
    final = points[-1]
    result = {
        "credit": credit,
        "config": json.loads(cfg.model_dump_json()),
        "train_seconds": round(train_seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "train_rows": rows,
        "train_reward": [{"step": r["step"] + 1, **{s: r.get(f"reward/{s}") for s in STAGES}} for r in rows],
        "eval": [asdict(p) for p in points],
        "final_minus_base": {m: paired_difference(base.samples, final.samples, m, opts.bootstrap, opts.seed)
                             for m in METRICS},
        "steps_to_target": steps_to_target(points, base.mean["total"], opts.delta),
        "adapter": str(summary.adapter),
    }
    del parts, evaluator
    gc.collect()
    return result | {"_base": base}


def fmt(values: Mapping[str, float]) -> str:
    """plan=0.12 research=... as one line."""
    return " ".join(f"{k}={v:.3f}" for k, v in values.items())


def plot(results: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """Held-out curves (total and per stage, ± standard error) and training reward per step, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    panels = [("total", "held-out total (mean of 4 stages)"), *((s, f"held-out {s}") for s in STAGES)]
    colours = {"ss-grpo": "tab:blue", "answer-only": "tab:orange"}
    for ax, (metric, label) in zip(axes.flat[:5], panels, strict=True):
        for r in results:
            xs = [p["step"] for p in r["eval"]]
            ys = [p["mean"][metric] for p in r["eval"]]
            es = [0.0 if math.isnan(p["stderr"][metric]) else p["stderr"][metric] for p in r["eval"]]
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=r["credit"], color=colours.get(r["credit"]))
        ax.set_title(label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("reward")
        ax.grid(alpha=0.3)
        ax.legend()
    ax = axes.flat[5]
    for r in results:
        xs = [t["step"] for t in r["train_reward"]]
        ys = [statistics.fmean(t[s] for s in STAGES) if all(t[s] is not None for s in STAGES) else float("nan")
              for t in r["train_reward"]]
        ax.plot(xs, ys, marker=".", label=f"{r['credit']} (training batch)", color=colours.get(r["credit"]))
    ax.set_title("training rollouts: mean of 4 stage rewards")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("optimizer step (rollouts of this step)")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> tuple[CheckOptions, argparse.Namespace]:
    """Command-line options; --quick sets tiny defaults that explicit options still override."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny smoke preset (1 step, 2 held-out questions, small caps)")
    p.add_argument("--steps", type=int, help="optimizer steps per mode (default 8; quick 1)")
    p.add_argument("--eval-every", type=int, help="evaluate every this many steps (default 4; quick 1)")
    p.add_argument("--heldout", type=int, help="held-out questions (default 6; quick 2)")
    p.add_argument("--eval-samples", type=int, help="rollouts per held-out question (default 2; quick 1)")
    p.add_argument("--credits", default=",".join(CREDITS), help="comma-separated credit modes, in run order")
    p.add_argument("--delta", type=float, default=0.02, help="steps-to-target: first step with total > base + delta")
    p.add_argument("--n-questions", type=int, help="bundled question pool size incl. held-out (default 24)")
    p.add_argument("--batch-questions", type=int, help="questions per step (default 2; quick 1)")
    p.add_argument("--rollouts", type=int, help="rollouts per question n (default 4; quick 2)")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (LoRA)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--max-tool-calls", type=int, default=2)
    p.add_argument("--caps", help="plan,research,review,answer token caps (default 96,48,64,96; quick 48,32,32,48)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reflection", action="store_true", help="also train the reflection meta-policy (slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grad-checkpointing", action="store_true",
                   help="recompute activations in the update (off by default: SmolLM2 fits easily, and it is slower)")
    p.add_argument("--snippets", type=int, default=3, help="snippets per local_search call (app default 5)")
    p.add_argument("--snippet-chars", type=int, default=400,
                   help="characters per snippet (app default 700): shorter tool outputs, faster CPU prefill")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: with another job on the 2 cores, 2 threads ran ~7x slower than 1; "
                        "on an idle machine 2 threads ran the update 2.2x faster)")
    p.add_argument("--engine", choices=("torch", "llamacpp"), default="torch",
                   help="what decodes the rollouts and evaluation sessions (RUBRICEM_AGENT__EMBEDDED_ENGINE); the "
                        "trainer always recomputes log-probs in torch")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="trainer weights dtype (bfloat16: 1.6x faster update on CPUs with AMX; LoRA stays float32)")
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL, help="converted SmolLM2 folder")
    p.add_argument("--init-adapter", type=Path, help="start both modes from this LoRA adapter (e.g. the shipped SFT "
                   "one, agent/adapters/smollm2-sft); step 0 is then the adapter, not the base model")
    p.add_argument("--data-dir", type=Path,
                   help="throwaway data folder: index, runs (adapters, rollouts), eval logs (default: a new temp folder)")
    p.add_argument("--out", type=Path, required=True, help="folder for learning_check.json and learning_check.png")
    a = p.parse_args(argv)
    q = a.quick

    def pick(value: int | None, normal: int, quick: int) -> int:
        return value if value is not None else (quick if q else normal)

    caps = [int(x) for x in (a.caps or ("48,32,32,48" if q else "96,48,64,96")).split(",")]
    if len(caps) != 4:
        p.error("--caps needs four numbers: plan,research,review,answer")
    credits = tuple(c.strip() for c in a.credits.split(",") if c.strip())
    if not credits or any(c not in CREDITS for c in credits):
        p.error(f"--credits takes a comma-separated subset of {CREDITS}")
    opts = CheckOptions(
        steps=pick(a.steps, 8, 1), eval_every=pick(a.eval_every, 4, 1), heldout=pick(a.heldout, 6, 2),
        eval_samples=pick(a.eval_samples, 2, 1), credits=credits, delta=a.delta,
        n_questions=pick(a.n_questions, 24, 6), batch_questions=pick(a.batch_questions, 2, 1),
        rollouts=pick(a.rollouts, 4, 2), lr=a.lr, lora_r=a.lora_r, max_tool_calls=a.max_tool_calls,
        plan_tokens=caps[0], research_tokens=caps[1], review_tokens=caps[2], answer_tokens=caps[3],
        temperature=a.temperature, reflection=a.reflection, seed=a.seed,
        threads=a.threads, engine=a.engine, snippets=a.snippets, snippet_chars=a.snippet_chars,
        grad_checkpointing=a.grad_checkpointing, dtype=a.dtype, init_adapter=a.init_adapter)
    if a.init_adapter is not None and not (a.init_adapter / "adapter_config.json").is_file():
        p.error(f"--init-adapter {a.init_adapter}: no adapter_config.json there")
    return opts, a


async def main_async(opts: CheckOptions, args: argparse.Namespace) -> dict[str, Any]:
    """Run every credit mode and assemble the report."""
    import torch

    torch.set_num_threads(opts.threads)  # process-wide: the rollout policy and the trainer share it
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rubricem-learning-check-"))
    settings = offline_settings(data_dir, args.model_dir, opts.snippets, opts.snippet_chars, opts.init_adapter,
                                opts.engine)
    runs = data_dir / "runs"  # adapters, rollouts and eval logs stay out of OUT (which holds only the report)
    began = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - began:7.1f}s] {message}", file=sys.stderr, flush=True)

    say(f"learning check: {opts}")
    results: list[dict[str, Any]] = []
    base: EvalPoint | None = None
    for credit in opts.credits:
        r = await run_mode(opts, credit, settings, runs, base, say)
        base = r.pop("_base")
        results.append(r)
    wall = time.perf_counter() - began
    report = {
        "what": "held-out mean reward (offline judge) before/after SS-GRPO vs answer-only training of SmolLM2-135M"
                + (f", both starting from the adapter {opts.init_adapter}" if opts.init_adapter else ""),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "options": asdict(opts),
        "wall_seconds": round(wall, 1),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "heldout_questions": question_pool(make_config(opts, opts.credits[0], runs))[1],
        "runs_dir": str(runs),
        "samples_per_eval": opts.heldout * opts.eval_samples,
        "base": asdict(base) if base else None,
        "modes": results,
        "summary": {r["credit"]: {
            "base": base.mean if base else None,
            "final": r["eval"][-1]["mean"],
            "final_minus_base": {m: r["final_minus_base"][m]["mean"] for m in METRICS},
            "p_sign_flip_total": r["final_minus_base"]["total"]["p_sign_flip"],
            "steps_to_target": r["steps_to_target"],
        } for r in results},
    }
    (out / "learning_check.json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    plot(results, out / "learning_check.png",
         f"SmolLM2-135M{' + ' + opts.init_adapter.name if opts.init_adapter else ''}, LoRA r={opts.lora_r}, lr={opts.lr}, {opts.batch_questions} q × {opts.rollouts} rollouts per "
         f"step; held-out: {opts.heldout} questions × {opts.eval_samples} samples (offline judge)")
    say(f"wrote {out / 'learning_check.json'} and {out / 'learning_check.png'} ({wall:.0f}s)")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: print the summary table."""
    opts, args = parse_args(argv)
    report = asyncio.run(main_async(opts, args))
    for credit, s in report["summary"].items():
        print(f"{credit}: base {fmt(s['base'])}\n{' ' * len(credit)}  final {fmt(s['final'])}\n"
              f"{' ' * len(credit)}  Δtotal {s['final_minus_base']['total']:+.4f} (p={s['p_sign_flip_total']}), "
              f"steps to base+{opts.delta}: {s['steps_to_target']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
