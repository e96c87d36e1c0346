"""Held-out learning curve (a script, not a test; issue 38): SS-GRPO against answer-only from the shipped SFT adapter,
several seeds, evaluated every few steps on the project's held-out questions with what a small model can move.

What it runs, in an order that gives usable partial results early:
1. The starting policy (the SFT adapter, "init", step 0) on the held-out set, once: every run starts from it.
2. For each evaluation step k (5, 10, 15, 20 by default), for each seed, for each arm (credit mode): train the run
   up to step k (resuming from its checkpoint), then evaluate its adapter NAME@k.
3. At the last step, each run's policy also writes reflections on its own last training rollouts into its bank, and
   is evaluated again with rubric-bank injection on.

The held-out set is learning/eval/heldout.py's (40 questions: 32 with gold passages); each is researched `--samples`
times with sampling seeds fixed per (question, sample), the same for every run and step (common random numbers), and
the samples of a question are judged as one group by the offline judge. Training questions are the SFT training
split (learning/sft/data/train), asked in the same `exact_answer` format; the held-out guard refuses any overlap.
Rollouts and evaluation sessions are decoded by the engine the speed issue chose (llama.cpp); the trainer recomputes
every log-prob in torch.

Everything is resumable: stop it at any point and run the same command again.
- Training resumes from the run's last checkpoint (one per step); a step cut off mid-way is redone, never logged twice.
- An evaluation file gains one question (all its samples) at a time; a question cut off mid-way is redone.
- `--runs` keeps the state (default .cache/learning_curve); its options.json must match the command's options.
After every unit of work the report is rewritten: OUT/curve.json (every number), OUT/summary.md (its tables),
OUT/curve.png, OUT/samples/ (every held-out session's scores, figures and answer) and OUT/train/ (each run's per-step
training rows).

    .venv/bin/python tests/benchmarks/learning_curve.py --out docs/learning_curve          # the full protocol
    for k in 0 1; do .venv/bin/python tests/benchmarks/learning_curve.py --out docs/learning_curve --workers 2 \
        --worker $k & done                                                          # the same, as 2 processes
    .venv/bin/python tests/benchmarks/learning_curve.py --quick --out /tmp/lc --runs /tmp/lc-runs   # a smoke run
    .venv/bin/python tests/benchmarks/learning_curve.py --report-only --out docs/learning_curve     # report only
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_check import DEFAULT_MODEL, eval_steps, judged_scores, offline_settings  # noqa: E402

from agent.config import RunOptions  # noqa: E402
from agent.tools.registry import build_tools  # noqa: E402
from app.container import build_judge, build_policy, build_reflection_judge, ensure_corpus, open_index  # noqa: E402
from app.service import ResearchService  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.training import build_trainer  # noqa: E402
from learning.checkpoint import latest_checkpoint  # noqa: E402
from learning.eval import curve  # noqa: E402
from learning.eval.datasets import bench_spec  # noqa: E402
from learning.eval.heldout import FIGURES, HeldoutItem, load_heldout, session_figures  # noqa: E402
from learning.grpo import run_options, train  # noqa: E402
from learning.engines.files import json_lines  # noqa: E402,F401 - memory_study and training_dose import it from here
from learning.engines.threads import cpu_model  # noqa: E402
from learning.train_config import TrainConfig, load_config  # noqa: E402
from store.records import STAGES  # noqa: E402
from store.session_log import SessionLog  # noqa: E402

COMMIT = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                        check=False).stdout.strip() or None
SFT_ADAPTER = ROOT / "agent" / "adapters" / "smollm2-sft"
TRAIN_SPLIT = ROOT / "learning" / "sft" / "data" / "train"
ARMS = ("ss-grpo", "answer-only")
INIT = "init"
Say = Callable[[str], None]


@dataclass(frozen=True)
class CurveOptions:
    """The protocol (saved in RUNS/options.json; a resumed run must use the same)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    arms: tuple[str, ...] = ARMS
    steps: int = 20
    eval_every: int = 5
    samples: int = 2
    items: int = 0  # 0: every held-out question
    batch_questions: int = 1
    rollouts: int = 4
    lr: float = 5e-5
    caps: tuple[int, int, int, int] = (352, 128, 224, 160)  # fit the SFT adapter's plans (p90)
    max_tool_calls: int = 2
    temperature: float = 0.8
    snippets: int = 3
    snippet_chars: int = 300
    engine: str = "llamacpp"
    dtype: str = "bfloat16"
    bank_reflections: int = 8  # reflections written into each run's bank before the injected evaluation (0: none)
    init_samples: int = 0  # samples per question of the starting point (0: `samples`)
    verifiable_weight: float = 0.0  # the judge's verifiable Answer-stage term in training (0: off)
    rag: bool = False  # also evaluate the vanilla-RAG floor on the same questions (unit "rag")


# The redesigned protocol (issue 45; docs/learning_curve/README.md says why each number): every unit is one whole
# run (train 3 steps of 2 questions x 4 rollouts, then evaluate once), small enough to finish within 75 minutes of one
# worker beside another and to be committed as it ends; the starting point is shared and measured with 2 samples.
PROTOCOL_V2 = CurveOptions(steps=3, eval_every=3, samples=1, init_samples=2, batch_questions=2, rollouts=4,
                           bank_reflections=0, verifiable_weight=0.5, rag=True)
RAG = "rag"


@dataclass(frozen=True)
class Unit:
    """One piece of work: evaluate the starting policy, or train (arm, seed) to `step` and evaluate it."""

    arm: str
    seed: int
    step: int
    sample: int | None = None  # the starting point split into one unit per sample (`init_samples`): which one

    @property
    def run(self) -> str:
        return self.arm if self.arm in (INIT, RAG) else f"{self.arm}-s{self.seed}"


def samples_of(opts: CurveOptions, unit: Unit) -> range:
    """The sample indices of the unit's evaluation. The shared start may take more samples than a run
    (`init_samples`); it then comes as one unit per sample (`Unit.sample`, a file each), so each stays within a
    unit's time and the two workers can share it; the floor takes as many."""
    if unit.sample is not None:
        return range(unit.sample, unit.sample + 1)
    if unit.arm == INIT:
        return range(opts.samples)
    return range(opts.init_samples or opts.samples) if unit.arm == RAG else range(opts.samples)


def plan(opts: CurveOptions) -> list[Unit]:
    """Every unit, in the order they run."""
    units = [Unit(INIT, 0, 0, s) for s in range(opts.init_samples)] if opts.init_samples else [Unit(INIT, 0, 0)]
    units += [Unit(RAG, 0, 0)] if opts.rag else []
    for k in eval_steps(opts.steps, opts.eval_every)[1:]:
        units += [Unit(arm, seed, k) for seed in opts.seeds for arm in opts.arms]
    return units


def worker_of(opts: CurveOptions, unit: Unit, workers: int) -> int:
    """Which worker does `unit`: the starting policy's evaluation is worker 0's; the runs (seed-major, arms
    alternating) are dealt round-robin, so a run's units stay in one process, in order."""
    if unit.arm == INIT:
        return 0 if unit.sample is None else unit.sample % workers
    if unit.arm == RAG:
        return min(1, workers - 1)
    runs = [f"{arm}-s{seed}" for seed in opts.seeds for arm in opts.arms]
    return runs.index(unit.run) % workers


def sampling_seed(item_id: str, sample: int) -> int:
    """The seed of one held-out session: fixed per (question, sample) across runs and steps."""
    return zlib.crc32(f"{item_id}#{sample}".encode()) % (2**31 - 1)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of an evaluation file, one per (item, sample): a torn line is ignored (its question is redone)
    and a record written twice counts once."""
    seen: dict[tuple[Any, Any], dict[str, Any]] = {}
    for r in json_lines(path):
        seen.setdefault((r.get("item"), r.get("sample")), r)
    return list(seen.values())


def write_atomic(path: Path, text: str) -> None:
    """Write aside, then rename: a reader (the other worker) sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def append_records(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Append one question's records in one write, after cutting a torn last line (a kill mid-write) so the first
    new record does not merge into it."""
    if path.is_file():
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):
            with path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def _has_all(records: Sequence[Mapping[str, Any]], items: Sequence[HeldoutItem], samples: int | range) -> bool:
    have = {(r["item"], r["sample"]) for r in records}
    return all((i.id, s) in have for i in items for s in _ids(samples))


def _ids(samples: int | range) -> range:
    """A sample count as the indices 0 … n-1; a range as it is."""
    return samples if isinstance(samples, range) else range(samples)


def complete(path: Path, items: Sequence[HeldoutItem], samples: int | range) -> bool:
    """Whether the evaluation file has every sample of every item."""
    return _has_all(read_records(path), items, samples)


def finished_records(path: Path, items: Sequence[HeldoutItem], samples: int | range) -> list[dict[str, Any]]:
    """The evaluation file's records when it has every sample of every item, else [] (a point in progress)."""
    records = read_records(path)
    return records if _has_all(records, items, samples) else []


def trained_steps(run_dir: Path) -> int:
    """How many optimizer steps the run's last checkpoint holds."""
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    return 0 if ckpt is None else ckpt.step + 1


def train_questions(runs: Path) -> Path:
    """The SFT training split's questions, as a question file for the trainer."""
    path = runs / "train_questions.jsonl"
    if not path.is_file():
        seen: dict[str, dict[str, Any]] = {}
        for name in ("hotpotqa", "musique"):
            for e in bench_spec(name).loader(TRAIN_SPLIT):
                seen.setdefault(e.question, {"question": e.question, "answers": list(e.answers),
                                             "gold_titles": list(e.metadata.get("supporting_titles") or ())})
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in seen.values()))
    return path


def make_config(opts: CurveOptions, unit: Unit, runs: Path) -> TrainConfig:
    """The TrainConfig of a run, trained up to `unit.step`."""
    plan_t, research_t, review_t, answer_t = opts.caps
    return load_config(
        None, None, name=unit.run, credit=unit.arm, out_dir=runs / "train" / unit.run, steps=unit.step,
        questions=train_questions(runs), heldout_questions=0, batch_questions=opts.batch_questions,
        rollouts=opts.rollouts, lr=opts.lr, lora_r=16, lora_alpha=32, max_tool_calls=opts.max_tool_calls,
        plan_tokens=plan_t, research_tokens=research_t, review_tokens=review_t, answer_tokens=answer_t,
        temperature=opts.temperature, reflection=False, judge="offline", seed=unit.seed, format="exact_answer",
        gradient_checkpointing=False, dtype=opts.dtype, init_adapter=SFT_ADAPTER,
        checkpoint_every=1, keep_checkpoints=2,  # a kill loses at most the step in progress
        verifiable_weight=opts.verifiable_weight,
    )


def eval_path(runs: Path, unit: Unit, bank: bool = False) -> Path:
    part = "" if unit.sample is None else f"-sample-{unit.sample}"  # each worker its own file: no shared appends
    return runs / "eval" / unit.run / f"step-{unit.step}{part}{'-bank' if bank else ''}.jsonl"


class HeldoutEvaluator:
    """Researches held-out questions with one policy (and, for injection, a bank) and appends scored records."""

    def __init__(self, settings: Settings, policy: Any, bank: Any, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.log = SessionLog(path.with_suffix(".sqlite3"))  # eval sessions: their own log, never a training one
        index = open_index(settings)
        ensure_corpus(index)
        self.service = ResearchService(policy, build_tools(settings.agent, index), self.log, settings.agent, bank)
        self.judge = build_judge(settings, self.log)
        self.inject = bank is not None
        self.mode = "auto" if self.inject else "none"  # bank retrieval of each session (the memory study: "cross")
        self.source = "eval"  # never learned from; the memory study's training sessions are "api", as a user's

    async def run(self, cfg: TrainConfig, items: Sequence[HeldoutItem], samples: int | range, meta: Mapping[str, Any],
                  say: Say) -> None:
        done = {(r["item"], r["sample"]) for r in read_records(self.path)}
        todo = [i for i in items if any((i.id, s) not in done for s in _ids(samples))]
        for n, item in enumerate(todo, 1):
            began = time.perf_counter()
            records = await self._question(cfg, item, samples, meta)
            append_records(self.path, records)
            total = statistics.fmean(r["scores"].get("total") or 0.0 for r in records)
            say(f"  {meta['run']}@{meta['step']}{' +bank' if self.inject else ''}: {n}/{len(todo)} {item.id} "
                f"total {total:.3f} ({time.perf_counter() - began:.0f}s)")

    async def _question(self, cfg: TrainConfig, item: HeldoutItem, samples: int | range, meta: Mapping[str, Any]
                        ) -> list[dict[str, Any]]:
        base = {**meta, "item": item.id, "source": item.source, "inject": self.inject}
        outs: list[tuple[int, int, Any, float]] = []
        records: list[dict[str, Any]] = []
        for s in _ids(samples):
            seed = sampling_seed(item.id, s)
            opts: RunOptions = run_options(cfg, seed, self.mode).model_copy(
                update={"format": item.format})
            began = time.perf_counter()
            try:
                out = await self.service.run(item.question, opts, source=self.source)
            except Exception as exc:  # noqa: BLE001 - a failed session scores 0, as in training's counts
                records.append(base | {
                    "sample": s, "sampling_seed": seed, "failed": f"{type(exc).__name__}: {exc}",
                    "scores": dict.fromkeys((*STAGES, "total"), 0.0),
                    "figures": {f: (0.0 if item.gold_titles or f in ("cover_em", "boxed", "cited") else None)
                                for f in FIGURES},
                    "seconds": round(time.perf_counter() - began, 1)})
                continue
            outs.append((s, seed, out, time.perf_counter() - began))
        judgements: list[Any] = []
        judge_error = None
        if outs:
            try:
                judgements = await self.judge.judge_group(item.question, [o[2].trajectory for o in outs])
            except Exception as exc:  # noqa: BLE001 - recorded; the rewards stay absent, never a silent 0
                judge_error = f"{type(exc).__name__}: {exc}"
        for k, (s, seed, out, seconds) in enumerate(outs):
            scores: dict[str, float | None] = {}
            if judgements:
                judged = judged_scores(judgements[k])
                scores.update(judged, total=round(judged["total"], 4))
            t, report = out.trajectory, out.report
            records.append(base | {
                "sample": s, "sampling_seed": seed, "session_id": out.session_id, "policy_version": out.policy_version,
                "scores": scores, "figures": session_figures(item, t, report), "judge_error": judge_error,
                "stages_present": sorted(t.stages_present), "malformed": bool(t.malformed),
                "tool_calls": len(t.tool_calls), "searched_titles": sorted({sn.title for sn in t.snippets.values()}),
                "cited_titles": [sn.title for sn in report.references], "answer": report.body[:600],
                "queries": [c.query for c in t.tool_calls], "injected": list(t.injected_bank_items),
                "seconds": round(seconds, 1)})
        return sorted(records, key=lambda r: r["sample"])


class RagEvaluator(HeldoutEvaluator):
    """The floor (`rubricem eval --baseline rag`'s RagBaseline): one search with the question, the top k passages
    in one prompt, one short answer, with the same held-out figures and sampling seeds as the agent. It has no
    stages and cites nothing, so it gets no judge reward and a citation precision of 0 by the figures' definition
    (learning/eval/heldout.py: a report citing nothing scores 0)."""

    def __init__(self, settings: Settings, policy: Any, path: Path, k: int) -> None:
        from learning.eval.baseline import RagBaseline

        super().__init__(settings, policy, None, path)
        self.baseline = RagBaseline(policy, self.service.tools["local_search"], k=k)

    async def _question(self, cfg: TrainConfig, item: HeldoutItem, samples: int | range, meta: Mapping[str, Any]
                        ) -> list[dict[str, Any]]:
        base = {**meta, "item": item.id, "source": item.source, "inject": False}
        records: list[dict[str, Any]] = []
        for s in _ids(samples):
            seed = sampling_seed(item.id, s)
            opts = run_options(cfg, seed, "none")
            began = time.perf_counter()
            out = await self.baseline.run(item.question, opts)
            records.append(base | {
                "sample": s, "sampling_seed": seed, "session_id": out.session_id, "policy_version": out.policy_version,
                "scores": {}, "figures": session_figures(item, out.trajectory, out.report),
                "searched_titles": sorted({sn.title for sn in out.trajectory.snippets.values()}),
                "cited_titles": [], "answer": out.report.body[:600], "seconds": round(time.perf_counter() - began, 1)})
        return records


async def fill_bank(settings: Settings, parts: Any, cfg: TrainConfig, n: int, run_dir: Path, say: Say) -> None:
    """The trained policy reflects on its own last `n` judged training rollouts; accepted reflections enter the run's
    bank (once: a marker file records it)."""
    from learning.reflection.writer import write_reflection

    marker = run_dir / "bank-filled.json"
    if marker.is_file():
        return
    judge = build_reflection_judge(settings)
    sessions = [s for s in parts.log.list_sessions(limit=max(n * 3, 20), status="completed", sources=("rollout",))]
    outcomes = []
    for k, s in enumerate(sessions[:n]):
        try:
            o = await write_reflection(s.session_id, log=parts.log, policy=parts.policy, judge=judge, bank=parts.bank,
                                       candidates=cfg.reflection_candidates, threshold=cfg.reflection_threshold,
                                       max_tokens=cfg.reflection_tokens, seed=cfg.seed * 1000 + k)
            outcomes.append(o.reason)
        except Exception as exc:  # noqa: BLE001 - one failed reflection does not stop the rest
            outcomes.append(f"failed: {type(exc).__name__}: {exc}")
    items = parts.bank.count() if hasattr(parts.bank, "count") else None
    write_atomic(marker, json.dumps({"reflections": len(outcomes), "outcomes": outcomes, "bank_items": items},
                                    indent=1))
    say(f"  {cfg.name}: {len(outcomes)} reflection(s) written, bank holds {items}")


async def run_unit(opts: CurveOptions, settings: Settings, runs: Path, items: Sequence[HeldoutItem], unit: Unit,
                   say: Say) -> None:
    """Do whatever of the unit is not done yet."""
    if unit.arm in (INIT, RAG):
        path = eval_path(runs, unit)
        n = samples_of(opts, unit)
        if complete(path, items, n):
            return
        cfg = make_config(opts, Unit(ARMS[0], 0, 1), runs)  # only its research options are used
        policy = build_policy(settings, say)
        try:
            what = "the vanilla-RAG floor" if unit.arm == RAG else "the starting policy"
            say(f"evaluating {what} ({SFT_ADAPTER.name}) on {len(items)} held-out questions, sample(s) {list(n)}")
            evaluator = (RagEvaluator(settings, policy, path, k=opts.snippets * opts.max_tool_calls)
                         if unit.arm == RAG else HeldoutEvaluator(settings, policy, None, path))
            await evaluator.run(cfg, items, n, {"run": unit.run, "arm": unit.arm, "seed": None, "step": 0}, say)
        finally:
            await policy.aclose()  # type: ignore[attr-defined]
        return
    cfg = make_config(opts, unit, runs)
    assert cfg.out_dir is not None
    last = unit.step == opts.steps and opts.bank_reflections > 0
    need_train = trained_steps(cfg.out_dir) < unit.step
    need_eval = not complete(eval_path(runs, unit), items, opts.samples)
    need_bank = last and not complete(eval_path(runs, unit, bank=True), items, opts.samples)
    if not (need_train or need_eval or need_bank):
        return
    parts, run_dir = build_trainer(settings, cfg, say)
    meta = {"run": unit.run, "arm": unit.arm, "seed": unit.seed, "step": unit.step}
    try:
        if need_train:
            say(f"[{unit.run}] training to step {unit.step} (from {trained_steps(run_dir)})")

            def on_row(row: dict[str, Any]) -> None:
                if "message" in row:
                    say(f"[{unit.run}] {row['message']}")
                    return
                say(f"[{unit.run}] step {row['step'] + 1}: reward {stage_rewards(row)} | loss {row['task/loss']:+.4f} "
                    f"| skipped {row.get('task/skipped')} | {row['seconds']:.0f}s")

            await train(cfg, parts, run_dir, progress=on_row)
        version = f"{cfg.name}@{unit.step}"
        await parts.policy.aload_adapter(run_dir / "adapters" / version, version)  # type: ignore[attr-defined]
        if need_eval:
            await HeldoutEvaluator(settings, parts.policy, None, eval_path(runs, unit)).run(
                cfg, items, opts.samples, meta, say)
        if need_bank:
            await fill_bank(settings, parts, cfg, opts.bank_reflections, run_dir, say)
        if need_bank and not bank_empty(run_dir):
            await HeldoutEvaluator(settings, parts.policy, parts.bank, eval_path(runs, unit, bank=True)).run(
                cfg, items, opts.samples, meta, say)
    finally:
        await parts.policy.aclose()  # type: ignore[attr-defined]
        del parts
        gc.collect()


# ------------------------------------------------------------------------------------------------------------ report


def build_report(opts: CurveOptions, runs: Path, items: Sequence[HeldoutItem], command: str) -> dict[str, Any]:
    """Every number of the curve so far (pure given the files)."""
    steps = eval_steps(opts.steps, opts.eval_every)

    def point(unit: Unit, bank: bool = False) -> list[dict[str, Any]]:
        return finished_records(eval_path(runs, unit, bank), items, samples_of(opts, unit))

    init = ([r for u in plan(opts) if u.arm == INIT for r in point(u)] if opts.init_samples
            else point(Unit(INIT, 0, 0)))
    if opts.init_samples and len({r["sample"] for r in init}) < opts.init_samples:
        init = []  # the start counts once every sample of it is in
    rag = point(Unit(RAG, 0, 0)) if opts.rag else []
    points = {(arm, seed, k): point(Unit(arm, seed, k)) for arm in opts.arms for seed in opts.seeds for k in steps[1:]}
    evals: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for arm in opts.arms:
        evals[arm] = {0: init} if init else {}
        for k in steps[1:]:
            pooled = [r for seed in opts.seeds for r in points[(arm, seed, k)]]
            if pooled:
                evals[arm][k] = pooled
    curves = {arm: {"steps": sorted(pts), "seeds": {k: sorted({r["seed"] for r in pts[k]} - {None}) for k in pts},
                    "metrics": {m: [curve.mean_ci(pts[k], m) for k in sorted(pts)] for m in curve.METRICS}}
              for arm, pts in evals.items()}
    per_seed = {f"{arm}-s{seed}": {m: {k: curve.mean_ci(points[(arm, seed, k)], m)["mean"]
                                       for k in steps[1:] if points[(arm, seed, k)]}
                                   for m in curve.METRICS}
                for arm in opts.arms for seed in opts.seeds}
    common = [k for k in steps[1:] if all(k in evals[a] for a in opts.arms)]
    last = max(common) if common and init else None
    finals: dict[str, Any] = {}
    if last is not None:
        finals = {
            "step": last,
            "seeds": {arm: curves[arm]["seeds"][last] for arm in opts.arms},
            "minus_init": {arm: {m: curve.paired(init, evals[arm][last], m) for m in curve.METRICS}
                           for arm in opts.arms},
            "co_movement": {arm: curve.co_movement(init, evals[arm][last]) for arm in opts.arms},
            "hacking_example": {arm: curve.hacking_example(init, evals[arm][last]) for arm in opts.arms},
        }
        if len(opts.arms) == 2:  # over the seeds both arms have at that step, so the comparison is like for like
            a, b = opts.arms
            both = set(curves[a]["seeds"][last]) & set(curves[b]["seeds"][last])
            pick = {arm: [r for r in evals[arm][last] if r["seed"] in both] for arm in (a, b)}
            finals[f"{a}_minus_{b}"] = {m: curve.paired(pick[b], pick[a], m) for m in curve.METRICS}
            finals["seeds_compared"] = sorted(both)
    floor: dict[str, Any] = {}
    if rag:
        floor = {"metrics": {m: curve.mean_ci(rag, m) for m in FIGURES},
                 "init_minus_rag": {m: curve.paired(rag, init, m) for m in FIGURES} if init else {}}
        if last is not None:
            floor |= {f"{arm}_minus_rag": {m: curve.paired(rag, evals[arm][last], m) for m in FIGURES}
                      for arm in opts.arms}
    bank: dict[str, Any] = {}
    for arm in opts.arms:
        with_bank = [r for seed in opts.seeds for r in point(Unit(arm, seed, opts.steps), bank=True)]
        without = evals[arm].get(opts.steps)
        fills = {f"{arm}-s{seed}": got for seed in opts.seeds
                 if (got := read_json(runs / "train" / f"{arm}-s{seed}" / "bank-filled.json")) is not None}
        if fills:
            bank[f"{arm}_fills"] = fills
        if with_bank and without:
            ids = {r["run"] for r in with_bank}
            bank[arm] = {m: curve.paired([r for r in without if r["run"] in ids], with_bank, m)
                         for m in curve.METRICS}
    units = plan(opts)
    finished = [u for u in units if unit_done(opts, runs, items, u)]
    done = len(finished)
    train_rows = {}  # the rows of runs that have finished a unit: a run still training is not reported (nor in OUT)
    for run in dict.fromkeys(u.run for u in finished if u.arm not in (INIT, RAG)):
        rows = json_lines(runs / "train" / run / "metrics.jsonl")
        if rows:
            train_rows[run] = rows
    return {
        "what": "held-out learning curve of SmolLM2-135M + the shipped SFT adapter: SS-GRPO against answer-only, "
                "offline judge; held-out figures a small model can move (learning/eval/heldout.py)",
        "command": command, "options": asdict(opts),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "commit": COMMIT,  # the code that wrote this report; the agent, judge and figures must not change mid-run
        "progress": {"units_done": done, "units_total": len(units),
                     "train_steps_done": {k: len(v) for k, v in train_rows.items()}},
        "heldout": {"questions": len(items), "with_gold_passages": sum(1 for i in items if i.gold_titles),
                    "samples_per_question": opts.samples,
                    "start_samples_per_question": opts.init_samples or opts.samples,
                    "ids": [i.id for i in items]},
        "curves": curves, "per_seed": per_seed, "final": finals, "rag_floor": floor, "bank_injection": bank,
        "train": {run: [{k: r.get(k) for k in ("step", "seconds", "groups", "task/skipped", "task/loss", "task/kl",
                                                 "task/sampler_kl", *(f"reward/{s}" for s in STAGES),
                                                 "reward/group_sd_answer", "reward/group_sd_total",
                                                 "groups_skipped_same_score", "rollouts_failed")}
                        for r in rows] for run, rows in train_rows.items()},
    }


def bank_empty(run_dir: Path) -> bool:
    """Whether the run's reflections left its bank empty: injection would then add nothing, and the sessions would
    repeat the evaluation without it, so that evaluation is not run (the report says so)."""
    return (read_json(run_dir / "bank-filled.json") or {}).get("bank_items") == 0


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is absent or unreadable."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def unit_done(opts: CurveOptions, runs: Path, items: Sequence[HeldoutItem], unit: Unit) -> bool:
    if not complete(eval_path(runs, unit), items, samples_of(opts, unit)):
        return False
    if unit.arm != INIT and unit.step == opts.steps and opts.bank_reflections > 0:
        return bank_empty(runs / "train" / unit.run) or complete(eval_path(runs, unit, bank=True), items,
                                                                 opts.samples)
    return True


def plot(report: Mapping[str, Any], path: Path) -> None:
    """Held-out curves (mean over questions, 95 % interval) per arm, and the training batches' reward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("total", "judge reward (mean of 4 stages)"), ("answer", "judge: Answer stage"),
              ("gold_recall", "gold-passage recall of searches"), ("citation_precision", "citation precision"),
              ("citation_recall", "citation recall"), ("cover_em", "cover-EM")]
    colours = {"ss-grpo": "tab:blue", "answer-only": "tab:orange"}
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    for ax, (metric, title) in zip(axes.flat, panels, strict=False):
        for arm, c in report["curves"].items():
            xs, pts = c["steps"], c["metrics"][metric]
            ys = [p["mean"] for p in pts]
            ax.plot(xs, ys, marker="o", label=arm, color=colours.get(arm))
            ax.fill_between(xs, [p["ci_low"] for p in pts], [p["ci_high"] for p in pts], alpha=0.15,
                            color=colours.get(arm))
        ax.set_title(title)
        ax.set_xlabel("SS-GRPO / GRPO step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax, arm in zip(axes.flat[6:], report["curves"], strict=False):
        for run, rows in report["train"].items():
            if not run.startswith(arm):
                continue
            xs = [r["step"] + 1 for r in rows]
            ys = [statistics.fmean(r[f"reward/{s}"] for s in STAGES) if all(
                r.get(f"reward/{s}") is not None for s in STAGES) else math.nan for r in rows]
            ax.plot(xs, ys, marker=".", label=run, alpha=0.8)
        ax.set_title(f"{arm}: training batch reward (mean of 4 stages)")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    done = report["progress"]
    fig.suptitle(f"SmolLM2-135M + SFT adapter; {report['heldout']['questions']} held-out questions × "
                 f"{report['heldout']['samples_per_question']} samples; seeds {report['options']['seeds']}; "
                 f"units done {done['units_done']}/{done['units_total']} (bands: 95 % bootstrap over questions)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


SHOWN = ("total", "answer", "gold_recall", "citation_precision", "citation_recall", "cover_em", "boxed")


def _ci(p: Mapping[str, Any]) -> str:
    if not p or p.get("n", 0) == 0 or math.isnan(p["mean"]):
        return "–"
    return f"{p['mean']:.3f} [{p['ci_low']:.3f}, {p['ci_high']:.3f}]"


def _diff(d: Mapping[str, Any]) -> str:
    if not d or d.get("n", 0) == 0 or math.isnan(d["mean"]):
        return "–"
    return f"{d['mean']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] p={d['p']:.3g}"


def summary_md(report: Mapping[str, Any]) -> str:
    """The report's tables in Markdown (summary.md): curves per arm, and the paired tests at the last common step."""
    h = report["heldout"]
    n_start = h.get("start_samples_per_question", h["samples_per_question"])
    start = "" if n_start == h["samples_per_question"] else f", × {n_start} at the start and for the floor"
    lines = [
        "# Learning curve: results so far (written by tests/benchmarks/learning_curve.py; do not edit)", "",
        f"Units done: {report['progress']['units_done']}/{report['progress']['units_total']}; training steps done "
        f"per run: {report['progress']['train_steps_done'] or 'none yet'}. Held-out: {h['questions']} questions "
        f"({h['with_gold_passages']} with gold passages) × {h['samples_per_question']} sample(s) per run{start}. "
        "Each cell: mean over "
        "questions [95 % bootstrap interval]; a step's cell pools every seed whose evaluation is complete.", ""]
    for arm, c in report["curves"].items():
        lines += [f"## {arm}", "", "| step | seeds | " + " | ".join(SHOWN) + " |",
                  "|---|---|" + "---|" * len(SHOWN)]
        for k, step in enumerate(c["steps"]):
            seeds = c["seeds"].get(step) or c["seeds"].get(str(step)) or []
            lines.append(f"| {step} | {','.join(map(str, seeds)) or 'init'} | "
                         + " | ".join(_ci(c["metrics"][m][k]) for m in SHOWN) + " |")
        lines.append("")
    final = report.get("final") or {}
    if final:
        lines += [f"## Paired tests at step {final['step']} (per question; sign-flip p)", "",
                  "| comparison | " + " | ".join(SHOWN) + " |", "|---|" + "---|" * len(SHOWN)]
        for arm, d in final["minus_init"].items():
            lines.append(f"| {arm} − init | " + " | ".join(_diff(d[m]) for m in SHOWN) + " |")
        for key, d in final.items():
            if key.endswith("_minus_answer-only") or key == "ss-grpo_minus_answer-only":
                lines.append(f"| {key.replace('_minus_', ' − ')} | " + " | ".join(_diff(d[m]) for m in SHOWN) + " |")
        lines.append("")
        for arm, v in final["co_movement"].items():
            lines.append(f"- {arm}: reward hacking of the offline judge: **{'yes' if v['reward_hacking'] else 'no'}**"
                         f"; r(Δreward, Δfigure) over questions: "
                         + ", ".join(f"{f} {r}" for f, r in v["r"].items()))
        lines.append("")
    floor = report.get("rag_floor") or {}
    if floor:
        figs = [m for m in SHOWN if m in FIGURES and m != "boxed"]  # it is never asked to box its answer
        lines += ["## The vanilla-RAG floor (one search with the question, one short answer; it cites nothing, so its "
                  "citation figures are 0 by definition)", "", "| | " + " | ".join(figs) + " |",
                  "|---|" + "---|" * len(figs), "| RAG | " + " | ".join(_ci(floor["metrics"][m]) for m in figs) + " |"]
        for key, d in floor.items():
            if key.endswith("_minus_rag"):
                lines.append(f"| {key.replace('_minus_', ' − ')} | " + " | ".join(_diff(d[m]) for m in figs) + " |")
        lines.append("")
    signal = training_signal(report.get("train") or {})
    if signal:
        lines += ["## Training signal (per run: groups whose rollouts all scored the same under the run's credit, "
                  "the mean within-group SD of the Answer score and of the stage mean, the KL to the start per token "
                  "at the first and last step)", "",
                  "| run | groups | all the same | SD Answer | SD stage mean | KL first | KL last |",
                  "|---|---|---|---|---|---|---|"]
        for run, v in signal.items():
            lines.append(f"| {run} | {v['groups']} | {v['same']} | {v['sd_answer']} | {v['sd_total']} | "
                         f"{v['kl_first']} | {v['kl_last']} |")
        lines.append("")
    for arm, d in (report.get("bank_injection") or {}).items():
        if arm.endswith("_fills"):
            lines.append(f"- {arm[:-6]} bank fills: " + "; ".join(
                f"{run}: {v.get('bank_items')} item(s) from {v.get('reflections')} reflection(s)"
                for run, v in d.items()))
        else:
            lines.append(f"- {arm} with bank injection − without, step {report['options']['steps']}: "
                         + ", ".join(f"{m} {_diff(d[m])}" for m in ("total", "citation_precision")))
    return "\n".join(lines) + "\n"


def training_signal(train: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per run: how many groups there were and how many carried no signal, the mean within-group spreads (rows
    written before issue 45 have none: "–"), and the task KL at the first and the last step."""
    def mean_of(rows: Sequence[Mapping[str, Any]], key: str) -> str:
        vals = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
        return f"{statistics.fmean(vals):.3f}" if vals else "–"

    out: dict[str, dict[str, Any]] = {}
    for run, rows in train.items():
        if not rows:
            continue
        kls = [r.get("task/kl") for r in rows]
        out[run] = {"groups": sum(int(r.get("groups") or 0) for r in rows),
                    "same": sum(int(r.get("groups_skipped_same_score") or 0) for r in rows),
                    "sd_answer": mean_of(rows, "reward/group_sd_answer"),
                    "sd_total": mean_of(rows, "reward/group_sd_total"),
                    "kl_first": "–" if kls[0] is None else kls[0], "kl_last": "–" if kls[-1] is None else kls[-1]}
    return out


def stage_rewards(row: Mapping[str, Any]) -> str:
    """A training row's stage rewards on one line (`plan=0.917 research=…`), for progress output."""
    return " ".join(f"{s}={row.get(f'reward/{s}', math.nan):.3f}" for s in STAGES)


def timestamped(began: float) -> Say:
    """A progress printer to stderr, each line with the seconds since `began`."""
    def say(message: str) -> None:
        print(f"[{time.perf_counter() - began:8.1f}s] {message}", file=sys.stderr, flush=True)

    return say


def converted_model(model_dir: Path, lock_dir: Path) -> Path:
    """The trainer's bf16 folder of the bundled SmolLM2: `model_dir` when it is there, else converted into its
    parent folder once (two workers starting together wait for each other on `lock_dir`'s lock)."""
    from learning.engines.weights import bundled_gguf_path, ensure_converted

    if (model_dir / "config.json").is_file():
        return model_dir
    return locked(lock_dir, lambda: ensure_converted(model_dir.parent, bundled_gguf_path()))


def finish_unit(out: Path, row: Mapping[str, Any], report: Callable[[], Any], commit: str | None, say: Say) -> None:
    """A finished unit, under OUT's lock: its row appended to OUT/units.jsonl, the report rewritten, and with
    `commit` (the message), OUT committed (the memory study and the training dose share this)."""
    def work() -> None:
        with (out / "units.jsonl").open("a", encoding="utf-8") as f:  # one line, one write: workers share it
            f.write(json.dumps({**row, "cpu": cpu_model(), "commit": COMMIT,
                                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
        report()
        if commit is not None:
            commit_outputs(out, commit, say)

    locked(out, work)


def locked(out: Path, work: Callable[[], Any]) -> Any:
    """Run `work` holding OUT/.lock, the workers' one lock over OUT and the state they copy from it."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    with (out / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return work()


def write_outputs(opts: CurveOptions, runs: Path, items: Sequence[HeldoutItem], out: Path, command: str,
                  commit: str | None = None, say: Say = lambda _m: None) -> dict:
    """curve.json, curve.png, samples/ and train/ under `out` (rewritten from the run files; finished units only),
    under a lock, so two workers never interleave their copies or rename an older report over a newer one; with
    `commit`, then committed with that message (still under the lock: the two workers' commits never race)."""
    def work() -> dict:
        report = _write_outputs(opts, runs, items, out, command)
        if commit is not None:
            commit_outputs(out, commit, say)
        return report

    return locked(out, work)


def _write_outputs(opts: CurveOptions, runs: Path, items: Sequence[HeldoutItem], out: Path, command: str) -> dict:
    report = build_report(opts, runs, items, command)
    done = [u for u in plan(opts) if unit_done(opts, runs, items, u)]  # a unit in progress never reaches OUT
    for u in done:
        for src in (eval_path(runs, u), eval_path(runs, u, bank=True)):
            if not src.is_file():
                continue  # no bank evaluation (none asked, or the bank stayed empty)
            dst = out / "samples" / src.parent.name / src.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        rows = runs / "train" / u.run / "metrics.jsonl"
        if u.arm not in (INIT, RAG) and rows.is_file():
            (out / "train").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(rows, out / "train" / f"{u.run}.jsonl")
    write_atomic(out / "curve.json", json.dumps(report, indent=1, default=str))
    write_atomic(out / "summary.md", summary_md(report))
    tmp = out / f".curve.{os.getpid()}.tmp.png"
    plot(report, tmp)
    tmp.replace(out / "curve.png")
    return report


# -------------------------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> tuple[CurveOptions, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="report folder (curve.json, curve.png, samples/, train/)")
    p.add_argument("--runs", type=Path, default=None,
                   help="state folder: run checkpoints, adapters, eval logs (resumable; default "
                        ".cache/learning_curve, .cache/learning_curve_v2 for --protocol v2)")
    p.add_argument("--protocol", choices=["v1", "v2"], default="v1",
                   help="v2: the redesigned protocol of issue 45 (PROTOCOL_V2: whole runs of 3 steps x 2 questions x "
                        "4 rollouts with the verifiable term, evaluated once with 1 sample; the start with 2; the RAG "
                        "floor); v1: the protocol of issue 38 (20 steps of 1 question, evaluated every 5)")
    p.add_argument("--commit", action="store_true",
                   help="git-commit OUT after each finished unit (only OUT: nothing else is swept in)")
    p.add_argument("--quick", action="store_true", help="smoke preset: 1 seed, 2 steps, eval every 1, 2 questions, "
                   "1 sample, 2 rollouts, small caps, 1 reflection into the bank")
    p.add_argument("--seeds", help="comma-separated training seeds (default 0,1,2)")
    p.add_argument("--arms", help=f"comma-separated credit modes (default {','.join(ARMS)})")
    p.add_argument("--steps", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--samples", type=int)
    p.add_argument("--items", type=int, help="first N held-out questions only (default: all)")
    p.add_argument("--bank-reflections", type=int)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--report-only", action="store_true", help="rewrite the report from the run files; run nothing")
    p.add_argument("--max-units", type=int, default=0, help="stop after this many units of work (0: all)")
    p.add_argument("--workers", type=int, default=1,
                   help="split the runs over this many processes (start one per --worker; each has its own data "
                        "folder); on 2 cores, 2 workers of 1 thread each do more per hour than 1 of 2")
    p.add_argument("--worker", type=int, default=0, help="which worker this process is, 0 … workers-1")
    p.add_argument("--threads", type=int, help="threads per process for torch and llama.cpp (default: CPUs / workers)")
    a = p.parse_args(argv)
    if a.runs is None:
        a.runs = ROOT / ".cache" / ("learning_curve_v2" if a.protocol == "v2" else "learning_curve")
    opts = PROTOCOL_V2 if a.protocol == "v2" else CurveOptions()
    if a.quick:
        opts = replace(opts, seeds=(0,), steps=2, eval_every=1, samples=1, items=2, rollouts=2, bank_reflections=1,
                       caps=(48, 24, 32, 48), max_tool_calls=1, snippets=2, snippet_chars=200)
    updates: dict[str, Any] = {}
    if a.seeds:
        updates["seeds"] = tuple(int(x) for x in a.seeds.split(",") if x.strip())
    if a.arms:
        updates["arms"] = tuple(x.strip() for x in a.arms.split(",") if x.strip())
        if not updates["arms"] or any(x not in ARMS for x in updates["arms"]):
            p.error(f"--arms takes a comma-separated subset of {ARMS}")
    for name in ("steps", "eval_every", "samples", "items", "bank_reflections"):
        if getattr(a, name) is not None:
            updates[name] = getattr(a, name)
    opts = replace(opts, **updates)
    if not 0 <= a.worker < a.workers:
        p.error("--worker must be in 0 … --workers - 1")
    if opts.steps < 1 or opts.eval_every < 1 or opts.samples < 1 or not opts.seeds:
        p.error("--steps, --eval-every and --samples must be at least 1, with at least one seed")
    return opts, a


def seed_state(runs: Path, out: Path) -> int:
    """Copy the finished units' files of OUT (what was committed) into a state folder that lacks them: on a new
    machine the state folder is empty, and the units that OUT holds must count as done, never be redone. A file the
    state folder already has is left alone. Returns how many files were copied."""
    copied = 0
    pairs = [(src, runs / "eval" / src.parent.name / src.name) for src in sorted((out / "samples").glob("*/*.jsonl"))]
    pairs += [(src, runs / "train" / src.stem / "metrics.jsonl") for src in sorted((out / "train").glob("*.jsonl"))]
    for src, dst in pairs:
        if not dst.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(dst, src.read_text(encoding="utf-8"))  # the other worker never reads half a copy
            copied += 1
    return copied


def commit_outputs(out: Path, message: str, say: Say) -> None:
    """Commit OUT (and nothing else: the pathspec limits the commit to it) so the finished unit outlives the machine.
    A failure is said, never fatal: the files are on disk and the next unit's commit takes them too."""
    add = subprocess.run(["git", "-C", str(out), "add", "--", "."], capture_output=True, text=True, check=False)
    done = subprocess.run(["git", "-C", str(out), "commit", "-q", "-m", message, "--", "."],
                          capture_output=True, text=True, check=False) if add.returncode == 0 else add
    if done.returncode != 0:
        say(f"git commit of {out} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    else:
        say(f"committed {out}: {message}")


def check_options(runs: Path, opts: CurveOptions) -> None:
    """Refuse to resume a state folder made with other options (its numbers would not be comparable)."""
    path = runs / "options.json"
    mine = json.loads(json.dumps(asdict(opts)))
    if path.is_file():
        old = read_json(path)
        if old is None:
            raise SystemExit(f"{path} is unreadable; remove it only if {runs} holds no run of value")
        defaults = json.loads(json.dumps(asdict(CurveOptions())))
        old = {k: old.get(k, defaults.get(k)) for k in {**defaults, **old}}  # fields added since: their default
        if old != mine:
            diff = {k: (old.get(k), mine.get(k)) for k in {**old, **mine} if old.get(k) != mine.get(k)}
            raise SystemExit(f"{runs} holds a curve run with other options {diff}; use another --runs folder or the "
                             "same options")
        return
    runs.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(mine, indent=1))


async def main_async(opts: CurveOptions, a: argparse.Namespace) -> dict[str, Any]:
    import torch

    runs: Path = a.runs
    check_options(runs, opts)
    items = load_heldout()
    items = items[: opts.items] if opts.items else items
    command = " ".join([Path(sys.executable).name, *sys.argv])
    began = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - began:8.1f}s] {message}", file=sys.stderr, flush=True)

    copied = locked(a.out, lambda: seed_state(runs, a.out))  # the committed units count as done on a new machine
    if copied:
        say(f"took {copied} file(s) of finished units from {a.out} into {runs}")
    if a.report_only:
        return write_outputs(opts, runs, items, a.out, command)
    threads = a.threads or max(1, (os.cpu_count() or 1) // a.workers)
    torch.set_num_threads(threads)
    # each worker its own data folder: embedded Chroma (the index, the runs' banks) is not for several processes
    settings = offline_settings(runs / ("data" if a.workers == 1 else f"data-w{a.worker}"), a.model_dir,
                                opts.snippets, opts.snippet_chars, SFT_ADAPTER, opts.engine)
    settings = settings.model_copy(update={"agent": settings.agent.model_copy(update={"embedded_threads": threads})})
    units = plan(opts)
    worked = 0
    say(f"worker {a.worker + 1}/{a.workers}, {threads} thread(s)")
    for n, unit in enumerate(units, 1):
        if worker_of(opts, unit, a.workers) != a.worker or unit_done(opts, runs, items, unit):
            continue
        say(f"unit {n}/{len(units)}: {unit.run} step {unit.step}")
        began_unit = time.perf_counter()
        await run_unit(opts, settings, runs, items, unit, say)
        minutes = (time.perf_counter() - began_unit) / 60
        name = unit.run + ("" if unit.sample is None else f" sample {unit.sample}")
        say(f"unit {name} step {unit.step} done in {minutes:.1f} min")
        a.out.mkdir(parents=True, exist_ok=True)
        with (a.out / "units.jsonl").open("a", encoding="utf-8") as f:  # one line, one write: the workers share it
            f.write(json.dumps({"run": unit.run, "step": unit.step, "sample": unit.sample, "minutes": round(minutes, 1),
                                "worker": a.worker, "workers": a.workers, "threads": threads, "commit": COMMIT,
                                "cpu": cpu_model(), "finished": time.strftime(
                                    "%Y-%m-%dT%H:%M:%SZ", time.gmtime())}) + "\n")
        write_outputs(opts, runs, items, a.out, command, commit=(
            f"Learning curve ({a.protocol}): unit {name} step {unit.step} done ({minutes:.0f} min, worker "
            f"{a.worker + 1}/{a.workers})") if a.commit else None, say=say)
        worked += 1
        if a.max_units and worked >= a.max_units:
            say(f"stopping after {worked} unit(s) (--max-units)")
            break
    report = write_outputs(opts, runs, items, a.out, command) if not worked else build_report(opts, runs, items,
                                                                                             command)
    say(f"wrote {a.out}/curve.json and curve.png ({report['progress']['units_done']}/{len(units)} units done)")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    opts, a = parse_args(argv)
    report = asyncio.run(main_async(opts, a))
    final = report.get("final") or {}
    for arm, figs in (final.get("minus_init") or {}).items():
        print(f"{arm} step {final['step']} − init: " + ", ".join(
            f"{m} {d['mean']:+.4f} (p={d['p']})" for m, d in figs.items() if m in ("total", "citation_precision",
                                                                              "gold_recall", "cover_em")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
