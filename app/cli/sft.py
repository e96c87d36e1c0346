"""`rubricem sft generate` and `rubricem sft train`: distil scaffold trajectories, then fine-tune the student on them.

`generate` runs a teacher over a questions file with the project's own tools (the evidence-chain teacher by default,
or any OpenAI-compatible endpoint with `--teacher llm`); it resumes what an earlier run left. `train` fine-tunes
the policy (LoRA by default) on the kept trajectories, resumes from the last checkpoint, writes a loss curve and
registers the adapter as a policy version (marked SFT) that `rubricem ask --adapter`, the embedded default and
`rubricem train --init-adapter` can start from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from app.cli.common import Progress
from app.settings import Settings


def _student_tokenizer(settings: Settings, say: Any) -> tuple[Any, Path]:
    from transformers import AutoTokenizer

    from learning.engines.weights import ensure_converted

    model_dir = settings.agent.embedded_model_path or ensure_converted(settings.store.model_cache)
    return AutoTokenizer.from_pretrained(str(model_dir)), Path(model_dir)


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate teacher trajectories; prints the outcome counts."""
    from agent.tools.registry import build_tools
    from app.container import ensure_corpus, open_index
    from learning.sft.evidence_teacher import EvidenceChainTeacher
    from learning.sft.generate import generate
    from learning.sft.llm_teacher import LLMTeacher
    from learning.sft.questions import load_questions

    questions = [q for path in args.questions for q in load_questions(Path(path))]  # all files checked first
    settings = Settings()
    progress = Progress()
    say = progress.say
    index = open_index(settings)
    ensure_corpus(index, say, progress.bar)
    tools = build_tools(settings.agent, index)
    if "local_search" not in tools:
        raise ValueError("local_search is not available: the document index could not be opened")
    if args.teacher == "llm":
        if not args.teacher_url or not args.teacher_model:
            raise ValueError("--teacher llm needs --teacher-url and --teacher-model")
        key = settings.learning.teacher_api_key
        teacher: Any = LLMTeacher(args.teacher_url, args.teacher_model, tools,
                                  api_key=key.get_secret_value() if key else None, max_rounds=args.max_rounds)
    else:
        teacher = EvidenceChainTeacher(tools["local_search"])
    tokenizer, _ = _student_tokenizer(settings, say)

    def count(messages: Any) -> int:
        text = tokenizer.apply_chat_template(list(messages), tokenize=False)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    total = len(questions) * args.variants
    done = [0]

    def on_line(key: str, outcome: str) -> None:
        done[0] += 1
        say(f"[{done[0]}/{total - report_skip[0]}] {key}: {outcome}")

    from learning.sft.generate import read_lines

    out = Path(args.out)
    report_skip = [len(read_lines(out / "trajectories.jsonl"))] if (out / "trajectories.jsonl").exists() else [0]
    say(f"teacher {teacher.name}: {len(questions)} question(s) × {args.variants} variant(s) into {out}")
    report = asyncio.run(generate(
        questions, out, teacher, tools, variants=args.variants, seed=args.seed, max_tool_calls=args.max_tool_calls,
        concurrency=args.concurrency, count_tokens=count, context_tokens=settings.agent.defaults.context_tokens,
        progress=on_line,
    ))  # fmt: skip
    print(json.dumps(report.as_dict(), indent=2))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Fine-tune on kept trajectories; prints the adapter folder and its registered version."""
    import torch

    from learning.sft.generate import kept_examples
    from learning.sft.train import plot_loss, preset, train_sft
    from store.registry import Registry
    from store.session_log import SessionLog

    examples = list(kept_examples(Path(args.data)))
    if not examples:
        raise ValueError(f"{args.data}: no kept trajectories (run `rubricem sft generate` first)")
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings()
    say = Progress().say
    _, model_dir = _student_tokenizer(settings, say)
    cfg = preset(args.preset, epochs=args.epochs, learning_rate=args.lr, seed=args.seed, grad_accum=args.grad_accum)
    if args.full:
        from dataclasses import replace

        cfg = replace(cfg, lora=None)
    out = Path(args.out)
    say(f"SFT ({cfg.preset}): {len(examples)} trajectories, {cfg.epochs:g} epoch(s), lr {cfg.learning_rate:g}, "
        f"{'LoRA r=' + str(cfg.lora.r) if cfg.lora else 'full fine-tuning'}; run folder {out}")

    def on_step(row: dict[str, Any]) -> None:
        if "message" in row:
            say(str(row["message"]))
            return
        say(f"step {row['step']}/{row['of']}: loss {row['loss']:.4f} | lr {row['lr']:.2e} | "
            f"{row['tokens_per_second']:.0f} tok/s | {row['seconds']:.1f}s")

    init = resolve_adapter(args.init_adapter, settings) if args.init_adapter else None
    result = train_sft(examples, model_dir, out, cfg, init_adapter=init, max_steps=args.max_steps, on_step=on_step)
    plot = plot_loss(result.metrics, out / "loss.png")
    if plot is not None:
        say(f"loss curve: {plot}")
    if args.register and result.steps == result.meta["total_steps"]:
        registry = Registry(SessionLog.from_config(settings.store))
        version = registry.register(result.adapter, parent="base", training_run=f"sft:{result.meta['version']}",
                                    data_window={"kind": "sft", "data_sha": result.meta["data_sha"],
                                                 "examples": result.meta["examples"]})
        say(f"registered as {version.name} (SFT); promote with `rubricem versions promote {version.name}` or use it "
            f"with `rubricem ask --adapter {result.adapter}`")
    print(str(result.adapter))
    return 0


def resolve_adapter(value: str, settings: Settings) -> Path:
    """An adapter folder, or a registry version name (`policy@N`) resolved to its folder."""
    path = Path(value)
    if path.is_dir():
        return path
    from store.registry import Registry
    from store.session_log import SessionLog

    version = Registry(SessionLog.from_config(settings.store)).get(value)
    if not version.adapter_path:
        raise ValueError(f"{value} has no adapter (it is the base model)")
    return Path(version.adapter_path)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `sft generate` and `sft train`."""
    sft = sub.add_parser("sft", help="SFT distillation: teacher trajectories, then supervised fine-tuning")
    s = sft.add_subparsers(dest="sft_command", required=True)
    gen = s.add_parser("generate", help="write teacher trajectories for a questions file (resumable)")
    gen.add_argument("--questions", action="append", required=True,
                     help="HotpotQA/MuSiQue JSON or JSONL questions file (repeatable)")
    gen.add_argument("--out", required=True, help="output folder (an existing one resumes)")
    gen.add_argument("--teacher", choices=("evidence", "llm"), default="evidence",
                     help="evidence: written from gold evidence, no endpoint; llm: an OpenAI-compatible endpoint")
    gen.add_argument("--teacher-url", help="llm teacher endpoint root (API key: RUBRICEM_LEARNING__TEACHER_API_KEY)")
    gen.add_argument("--teacher-model", help="llm teacher model name")
    gen.add_argument("--max-rounds", type=int, default=10, help="rounds per trajectory (llm teacher)")
    gen.add_argument("--max-tool-calls", type=int, help="tool-call budget stated in the prompt (default: varied)")
    gen.add_argument("--variants", type=int, default=1, help="trajectories per question (different seeds/formats)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--concurrency", type=int, default=1, help="questions in flight at once")
    gen.set_defaults(func=cmd_generate)
    tr = s.add_parser("train", help="fine-tune the policy on kept trajectories (resumes a run folder)")
    tr.add_argument("--data", required=True, help="a `sft generate` output folder or trajectories.jsonl")
    tr.add_argument("--out", required=True, help="run folder; the adapter goes to OUT/adapter")
    tr.add_argument("--preset", default="cpu", help="cpu (2 cores, about an hour) or gpu-8b (METHOD §10.6)")
    tr.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    tr.add_argument("--epochs", type=float)
    tr.add_argument("--lr", type=float)
    tr.add_argument("--grad-accum", type=int)
    tr.add_argument("--seed", type=int)
    tr.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (resume later)")
    tr.add_argument("--threads", type=int, help="torch CPU threads")
    tr.add_argument("--init-adapter", help="start from this adapter folder or registry version (policy@N)")
    tr.add_argument("--no-register", dest="register", action="store_false",
                    help="do not register the adapter as a policy version")
    tr.set_defaults(func=cmd_train)

