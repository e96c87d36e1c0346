"""`rubricem train`: run or resume SS-GRPO + reflection meta-policy training with a progress bar and per-stage
rewards."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from app.settings import Settings


def _row_line(row: dict[str, Any]) -> str:
    rewards = " ".join(f"{s}={row.get(f'reward/{s}', float('nan')):.2f}" for s in ("plan", "research", "review",
                                                                                    "answer"))
    skipped = row.get("task/skipped")
    return (f"step {row['step'] + 1}: {rewards} | loss {row['task/loss']:+.4f} | groups {row['groups']} | "
            f"{row['tokens_per_second']:.0f} tok/s | {row['seconds']:.0f}s | {row['version']}"
            + (f" | update skipped: {skipped}" if skipped else ""))


def cmd_train(args: argparse.Namespace) -> int:
    """Train, print one line per step and the adapter to use with `rubricem ask --adapter`."""
    from tqdm import tqdm

    from app.cli.common import Progress
    from app.training import build_trainer
    from learning.grpo import train
    from learning.train_config import load_config

    if args.config is None and args.preset is None:
        raise ValueError("give --config FILE.toml or --preset NAME (e.g. --preset cpu-smoke)")
    init = None
    if args.init_adapter:
        from app.cli.sft import resolve_adapter

        init = resolve_adapter(args.init_adapter, Settings())
    cfg = load_config(Path(args.config) if args.config else None, args.preset, steps=args.steps, init_adapter=init,
                      out_dir=Path(args.out) if args.out else None,
                      questions=Path(args.questions) if args.questions else None, reward=args.reward)
    settings = Settings()
    say = Progress().say
    parts, run_dir = build_trainer(settings, cfg, say)
    say(f"training {cfg.name}: {cfg.steps} steps × {cfg.batch_questions} question(s) × {cfg.rollouts} rollouts, "
        + (f"credit {cfg.credit}" if cfg.reward == "stagewise" else "reward deeprubric (plain GRPO)")
        + f", judge {parts.judge.kind}; run folder {run_dir}")
    bar = tqdm(total=cfg.steps, desc="SS-GRPO", unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_row(row: dict[str, Any]) -> None:
        if "message" in row:
            tqdm.write(str(row["message"]), file=sys.stderr)
            if str(row["message"]).startswith("resumed from checkpoint step"):
                bar.update(int(str(row["message"]).rsplit(" ", 1)[1]) + 1 - bar.n)
            return
        tqdm.write(_row_line(row), file=sys.stderr)
        bar.update(1)

    async def go() -> Any:
        try:
            return await train(cfg, parts, run_dir, progress=on_row)
        finally:
            await parts.policy.aclose()

    summary = asyncio.run(go())
    bar.close()
    print(f"trained {summary.steps_done} step(s)"
          + (f" (resumed after step {summary.resumed_from + 1})" if summary.resumed_from is not None else "")
          + f"; adapter {summary.version} at {summary.adapter}\nmetrics {summary.metrics_path}\n"
          f"use it: rubricem ask --adapter {summary.adapter} \"your question\"")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `train` on the main parser."""
    tr = sub.add_parser("train", help="SS-GRPO + reflection meta-policy training (resumes a crashed run)")
    tr.add_argument("--config", help="a TOML file of training settings (learning/train_config.py lists them)")
    tr.add_argument("--preset", help="a built-in configuration: cpu-smoke")
    tr.add_argument("--steps", type=int, help="override the number of steps")
    tr.add_argument("--out", help="run folder (default DATA_DIR/runs/NAME); an existing run resumes")
    tr.add_argument("--questions", help="question pool: .txt, .jsonl with 'question', or a DeepRubric pairs.jsonl "
                    "(its rubrics become each question's persistent Answer-stage rubrics)")
    tr.add_argument("--reward", choices=["stagewise", "deeprubric"],
                    help="stagewise (default): the stagewise judge's stage scores; deeprubric: DeepRubric's reward "
                    "(METHOD §11.6) against each pair's rubrics, plain GRPO (needs --questions pairs.jsonl)")
    tr.add_argument("--init-adapter", help="start RL from this adapter folder or registry version (e.g. the SFT "
                    "adapter agent/adapters/smollm2-sft, or policy@N)")
    tr.set_defaults(func=cmd_train)
