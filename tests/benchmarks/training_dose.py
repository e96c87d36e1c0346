"""A training dose that moves the policy (issue 62, part B; pre-registered in
docs/learning/training/PREREGISTRATION.md, which fixes the numbers below before any unit ran).

One SS-GRPO run from the shipped SFT adapter on training-split questions, 24 steps of 4 questions x 4 rollouts
(384 rollouts), lr 1e-4, KL beta 0.001 to the SFT adapter, the verifiable Answer term on (weight 0.5), the offline
judge, the learning curve's research options (llama.cpp rollouts). Then the 40 held-out questions x 3 samples with
the end adapter, against the start, which is the memory study's bank-off condition (the same adapter, options and
sampling seeds: docs/learning/memory/samples/off-s*.jsonl).

Units, each finished and committed on its own (rerun the same command to go on):
- `train-uK` (K = 0..5): steps 4K+1 … 4K+4. Every unit is a run of its own in RUNS/train-uK: it starts from the
  adapter the previous unit committed (OUT/adapter/, the SFT adapter for u0), anchors its KL to the SFT adapter
  (`TrainConfig.reference_adapter`), and draws its questions with seed 62 + K. AdamW's moments restart at each unit
  (they are not committed: 2 x the adapter's size); a unit killed mid-way resumes from its last checkpoint on the
  same machine and starts again on a new one. When it ends, its adapter replaces OUT/adapter/ (9.8 MB, the only
  weights committed) and its metrics rows go to OUT/train/.
- `eval-sK` (K = 0, 1, 2): the end adapter on the held-out questions, sample K.

    .venv/bin/python tests/benchmarks/training_dose.py --commit            # every unit still to do, in order
    .venv/bin/python tests/benchmarks/training_dose.py --report-only       # OUT/summary.md, results.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_check import DEFAULT_MODEL, offline_settings  # noqa: E402
from learning_curve import (  # noqa: E402
    COMMIT,
    PROTOCOL_V2,
    SFT_ADAPTER,
    HeldoutEvaluator,
    converted_model,
    finish_unit,
    json_lines,
    locked,
    read_records,
    stage_rewards,
    timestamped,
    train_questions,
    write_atomic,
)

from learning.eval.dose_stats import positive_control  # noqa: E402
from learning.eval.heldout import HeldoutItem, load_heldout  # noqa: E402
from learning.eval.memory_stats import PRIMARY, SECONDARY, analyse  # noqa: E402
from learning.train_config import TrainConfig, load_config  # noqa: E402

OUT = ROOT / "docs" / "learning" / "training"
# Amendment 1 (PREREGISTRATION.md): every unit runs with the product code of this commit, the code of the start it is
# compared with (the memory study's bank-off samples); later report code moves citation precision (issue 64).
DOSE_CODE = "9ccac4f"
DOSE_RUN = ("git worktree add --detach /tmp/confirm-code 9ccac4f; cd /tmp/confirm-code && /work/main/.venv/bin/python "
            "tests/benchmarks/training_dose.py --out <this repository>/docs/learning/training --runs "
            "<this repository>/.cache/training_dose --commit")
RUNS = ROOT / ".cache" / "training_dose"
MEMORY = ROOT / "docs" / "learning" / "memory"  # the start's held-out samples (the memory study's bank off)
UNITS_OF_TRAINING = 6
STEPS_PER_UNIT = 4
SAMPLES = 3
EVAL_THREADS = 1  # the start's samples were decoded with one thread per worker
DOSE: dict[str, Any] = {"batch_questions": 4, "rollouts": 4, "lr": 1e-4, "beta": 0.001, "verifiable_weight": 0.5,
                        "credit": "ss-grpo", "seed": 62}
SMOKE_ITEMS = 0  # --smoke: held-out questions evaluated (0: all)
Say = Any


def units() -> list[str]:
    return [f"train-u{k}" for k in range(UNITS_OF_TRAINING)] + [f"eval-s{k}" for k in range(SAMPLES)]


def adapter_dir() -> Path:
    return OUT / "adapter"


def trained_units() -> int:
    """How many training units OUT's adapter holds (0: none yet, start from the SFT adapter)."""
    meta = OUT / "adapter" / "unit.json"
    return int(json.loads(meta.read_text())["units"]) if meta.is_file() else 0


def unit_done(unit: str, items: Sequence[HeldoutItem]) -> bool:
    kind, k = unit.rsplit("-", 1)[0], int(unit.rsplit("-", 1)[1][1:])
    if kind == "train":
        return trained_units() > k
    have = {(r.get("item"), r.get("sample")) for r in read_records(OUT / "samples" / f"{unit}.jsonl")}
    return all((i.id, k) in have for i in items)


def unit_config(k: int, runs: Path) -> TrainConfig:
    plan_t, research_t, review_t, answer_t = PROTOCOL_V2.caps
    start = adapter_dir() if k > 0 else SFT_ADAPTER
    return load_config(
        None, None, name=f"dose-u{k}", credit=DOSE["credit"], out_dir=runs / f"train-u{k}", steps=STEPS_PER_UNIT,
        questions=train_questions(runs), heldout_questions=0, batch_questions=DOSE["batch_questions"],
        rollouts=DOSE["rollouts"], lr=DOSE["lr"], beta=DOSE["beta"], lora_r=16, lora_alpha=32,
        max_tool_calls=PROTOCOL_V2.max_tool_calls, plan_tokens=plan_t, research_tokens=research_t,
        review_tokens=review_t, answer_tokens=answer_t, temperature=PROTOCOL_V2.temperature, reflection=False,
        judge="offline", seed=DOSE["seed"] + k, format="exact_answer", gradient_checkpointing=False,
        dtype=PROTOCOL_V2.dtype, init_adapter=start, reference_adapter=SFT_ADAPTER if k > 0 else None,
        checkpoint_every=1, keep_checkpoints=2, verifiable_weight=DOSE["verifiable_weight"])


async def run_training_unit(settings_for: Any, k: int, say: Say) -> None:
    from app.training import build_trainer
    from learning.grpo import train

    cfg = unit_config(k, RUNS)
    settings = settings_for(cfg.init_adapter)  # the rollout policy starts from the unit's own start adapter
    parts, run_dir = build_trainer(settings, cfg, say)

    def on_row(row: dict[str, Any]) -> None:
        if "message" in row:
            say(f"[u{k}] {row['message']}")
            return
        say(f"[u{k}] step {k * STEPS_PER_UNIT + row['step'] + 1}: reward {stage_rewards(row)} | "
            f"kl {row.get('task/kl')} | sampler kl {row.get('task/sampler_kl')} | {row['seconds']:.0f}s")

    try:
        summary = await train(cfg, parts, run_dir, progress=on_row)
    finally:
        await parts.policy.aclose()  # type: ignore[attr-defined]
    published = run_dir / "adapters" / f"{cfg.name}@{STEPS_PER_UNIT}"
    if not (published / "adapter_model.safetensors").is_file():
        raise RuntimeError(f"unit {k} ended without its step-{STEPS_PER_UNIT} adapter ({summary})")
    rows = json_lines(run_dir / "metrics.jsonl")
    (OUT / "train").mkdir(parents=True, exist_ok=True)
    write_atomic(OUT / "train" / f"u{k}.jsonl", "".join(
        json.dumps(r | {"global_step": k * STEPS_PER_UNIT + r["step"]}) + "\n" for r in rows if "step" in r))
    tmp = OUT / ".adapter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.copyfile(published / name, tmp / name)
    (tmp / "unit.json").write_text(json.dumps({"units": k + 1, "steps": (k + 1) * STEPS_PER_UNIT,
                                               "from": os.path.relpath(cfg.init_adapter, ROOT)
                                               if cfg.init_adapter else None}, indent=1))
    shutil.rmtree(adapter_dir(), ignore_errors=True)
    tmp.replace(adapter_dir())


async def run_eval_unit(settings_for: Any, k: int, items: Sequence[HeldoutItem], say: Say) -> None:
    from app.container import build_policy
    from learning_curve import ARMS, Unit, make_config

    path = RUNS / "samples" / f"eval-s{k}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    end = RUNS / "end-adapter"  # a copy: OUT/adapter may be replaced while this unit runs (it never is, but cheap)
    if not end.is_dir():
        shutil.copytree(adapter_dir(), end)
    # one decoding thread, as the memory study's bank-off samples (the start) were decoded: the same numerics
    settings = settings_for(end, EVAL_THREADS)
    cfg = make_config(PROTOCOL_V2, Unit(ARMS[0], 0, 1), RUNS)  # the same research options as the start's samples
    policy = build_policy(settings, say)
    try:
        await HeldoutEvaluator(settings, policy, None, path).run(
            cfg, items, range(k, k + 1), {"run": "end", "arm": "end", "seed": None, "step": 24}, say)
    finally:
        await policy.aclose()  # type: ignore[attr-defined]
    (OUT / "samples").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, OUT / "samples" / f"eval-s{k}.jsonl")


def pinned(commit: str | None) -> bool:
    """Whether `commit` (a unit row's `git describe --always --dirty`) is DOSE_CODE with no local change: git may
    print a longer abbreviation as the repository grows, never a shorter one."""
    return bool(commit) and not str(commit).endswith("-dirty") and str(commit).startswith(DOSE_CODE)


def report(items: Sequence[HeldoutItem]) -> dict[str, Any]:
    rows = sorted((r for k in range(UNITS_OF_TRAINING) for r in json_lines(OUT / "train" / f"u{k}.jsonl")),
                  key=lambda r: r["global_step"])
    control = positive_control([r | {"step": r["global_step"]} for r in rows])
    start = [r for k in range(SAMPLES) for r in read_records(MEMORY / "samples" / f"off-s{k}.jsonl")]
    end = [r for k in range(SAMPLES) for r in read_records(OUT / "samples" / f"eval-s{k}.jsonl")]
    # the memory study's analysis, with "end" in the place of a memory: paired by question and sample, Holm over
    # the primary metrics
    heldout = analyse({"off": start, "b": end}, {}, [i.id for i in items]) if start and end else None
    if heldout is not None:  # the memory study's decision rule and positive control are not this study's
        heldout.pop("decision", None)
        heldout.pop("acts", None)
        heldout["means"] = {{"off": "start", "b": "end"}[c]: v for c, v in heldout["means"].items()}
        for t in heldout["tests"]:
            t["comparison"] = "end - start"
    units = json_lines(OUT / "units.jsonl")
    off_code = [u["unit"] for u in units if not pinned(u.get("commit"))]  # against amendment 1: named, not hidden
    out = {"dose": DOSE | {"steps": len(rows), "units": len(rows) // STEPS_PER_UNIT,
                           "rollouts_total": sum(len(x) for r in rows for x in r.get("reward/rollout_totals") or [])},
           "control": control, "heldout": heldout, "units": units, "units_off_code": off_code,
           "metrics": {"primary": list(PRIMARY), "secondary": list(SECONDARY)}}
    write_atomic(OUT / "results.json", json.dumps(out, indent=1, default=float))
    write_atomic(OUT / "summary.md", summary_md(out))
    return out


def summary_md(r: Mapping[str, Any]) -> str:
    d, c = r["dose"], r["control"]
    lines = ["# A training dose that moves the policy: results as they stand", "",
             "Written by `tests/benchmarks/training_dose.py --report-only`; the analysis is the one pre-registered in "
             "[PREREGISTRATION.md](PREREGISTRATION.md).", "",
             *([f"**Units run with other code than `{DOSE_CODE}` (amendment 1): {', '.join(r['units_off_code'])}.**",
                ""] if r.get("units_off_code") else []),
             f"Dose so far: {d['steps']} steps of {d['batch_questions']} questions x {d['rollouts']} rollouts "
             f"({d['rollouts_total']} rollouts), lr {d['lr']}, KL beta {d['beta']}, final KL "
             f"{c['kl_last']:.4f} per token (engine gap {c['engine_gap']:.4f}).", "",
             "| step | training reward | 95 % interval | KL to the start | sampler KL |", "|---|---|---|---|---|"]
    for s in c["steps"]:
        lines.append(f"| {s['step'] + 1} | {s['mean']:.3f} | [{s['lo']:.3f}, {s['hi']:.3f}] | {s['kl']} | "
                     f"{s['sampler_kl']} |")
    t = c.get("trend")
    if t:
        lines += ["", f"Slope {t['slope']:+.4f} per step [{t['lo']:+.4f}, {t['hi']:+.4f}], permutation p "
                      f"{t['p']:.4f}. Reward rose: **{'yes' if c['reward_rose'] else 'no'}**; moved past 10x the "
                      f"engine gap and 0.05: **{'yes' if c['moved'] else 'no'}**."]
    h = r.get("heldout")
    if h:
        lines += ["", "## Held-out, end against start (hierarchical bootstrap, 95 % intervals)", "",
                  "| metric | primary | end - start |", "|---|---|---|"]
        for t in h["tests"]:
            lines.append(f"| {t['metric']} | {'yes' if t['primary'] else 'no'} | {t['mean']:+.3f} "
                         f"[{t['lo']:+.3f}, {t['hi']:+.3f}], p {t['p']:.3f}"
                         + (f", Holm p {t['p_holm']:.3f}" if "p_holm" in t else "") + " |")
    return "\n".join(lines) + "\n"


async def main_async(a: argparse.Namespace) -> int:
    items = load_heldout()
    items = items[:SMOKE_ITEMS] if SMOKE_ITEMS else items
    say = timestamped(time.perf_counter())

    if a.report_only:
        locked(OUT, lambda: report(items))
        print((OUT / "summary.md").read_text(encoding="utf-8"))
        return 0
    import torch

    threads = a.threads or (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    RUNS.mkdir(parents=True, exist_ok=True)
    model_dir = converted_model(a.model_dir, RUNS)

    def settings_for(adapter: Path, n_threads: int = threads) -> Any:
        s = offline_settings(RUNS / "data", model_dir, PROTOCOL_V2.snippets, PROTOCOL_V2.snippet_chars, adapter,
                             PROTOCOL_V2.engine)
        return s.model_copy(update={"agent": s.agent.model_copy(update={"embedded_threads": n_threads})})

    worked = 0
    for unit in units():
        if unit_done(unit, items) or (a.unit and unit not in a.unit):
            continue
        if unit.startswith("eval") and trained_units() < UNITS_OF_TRAINING:
            say(f"{unit}: the training units are not all done; stopping")
            break
        k = int(unit.rsplit("-", 1)[1][1:])
        say(f"unit {unit} ({threads} thread(s))")
        t0 = time.perf_counter()
        if unit.startswith("train"):
            await run_training_unit(settings_for, k, say)
        else:
            await run_eval_unit(settings_for, k, items, say)
        minutes = (time.perf_counter() - t0) / 60

        finish_unit(OUT, {"unit": unit, "minutes": round(minutes, 1), "threads": threads}, lambda: report(items),
                    f"Issue 62 training dose: unit {unit} done ({minutes:.0f} min)" if a.commit else None, say)
        say(f"unit {unit} done in {minutes:.1f} min")
        worked += 1
        if a.max_units and worked >= a.max_units:
            break
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    global OUT, RUNS
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=0, help="torch/llama.cpp threads (0: every core)")
    p.add_argument("--unit", action="append", choices=units(), help="only these units (repeatable)")
    p.add_argument("--max-units", type=int, default=0)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--commit", action="store_true", help="commit OUT as each unit ends")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--runs", type=Path, default=RUNS)
    p.add_argument("--smoke", action="store_true", help="1 step of 1 question x 2 rollouts per unit (needs --out)")
    a = p.parse_args(argv)
    if a.smoke and a.out == OUT:
        p.error("--smoke changes the design: give a --out of its own")
    OUT, RUNS = a.out, a.runs
    if not (a.report_only or a.smoke) and not pinned(COMMIT):
        p.error(f"the run's units use the product code of commit {DOSE_CODE}, not {COMMIT} "
                f"(PREREGISTRATION.md, amendment 1): {DOSE_RUN}")
    if a.smoke:  # two units of one step, then one sample of two held-out questions: every path, in minutes
        global STEPS_PER_UNIT, UNITS_OF_TRAINING, SMOKE_ITEMS
        STEPS_PER_UNIT, UNITS_OF_TRAINING, SMOKE_ITEMS = 1, 2, 2
        DOSE.update(batch_questions=1, rollouts=2)
    OUT.mkdir(parents=True, exist_ok=True)
    return asyncio.run(main_async(a))


if __name__ == "__main__":
    raise SystemExit(main())
