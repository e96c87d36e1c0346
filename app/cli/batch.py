"""`rubricem batch QUERIES.jsonl|csv --out DIR`: one Markdown and one JSON report per question, an index, resumable.

Exit codes: 0 every item has a report, 1 some items failed (recorded in DIR/index.md; a rerun retries run failures),
2 the queries file or an option is unusable (nothing was run).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from app.batch import BatchEvent, BatchSummary, ItemFinished, ItemStarted, load_items
from app.settings import Settings


class BatchProgress:
    """A progress bar on stderr (tqdm) with one status line per item above it."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        from tqdm import tqdm

        self.start = time.monotonic()
        self.quiet = quiet
        self.bar = tqdm(total=total, unit="item", file=sys.stderr, disable=quiet, dynamic_ncols=True,
                        desc="batch", mininterval=1.0)

    def say(self, message: str) -> None:
        """One line above the bar, with elapsed seconds."""
        if not self.quiet:
            self.bar.write(f"[{time.monotonic() - self.start:6.1f}s] {message}", file=sys.stderr)

    def __call__(self, event: BatchEvent) -> None:
        match event:
            case ItemStarted(item_id=item_id):
                self.say(f"{item_id}: started")
            case ItemFinished(result=r, finished=n, total=total):
                where = f" (session {r.session_id})" if r.session_id else ""
                if r.status == "done":
                    line = f"done in {r.seconds:.1f}s{where}"
                elif r.status == "skipped":
                    line = "skipped: " + ("finished earlier" if r.recorded == "done"
                                          else f"refused earlier ({r.error})")
                else:
                    line = f"FAILED ({r.error_kind}): {r.error}{where}"
                self.say(f"[{n}/{total}] {r.id}: {line}")
                self.bar.update(1)

    def close(self) -> None:
        """Remove the bar (the summary follows on stdout)."""
        self.bar.close()


def summary_table(s: BatchSummary, source: Path) -> str:
    """The summary printed at the end of a batch."""
    input_failed = sum(1 for r in s.items if r.status == "failed" and r.error_kind == "input")
    lines = [
        f"batch {source} -> {s.out_dir} (policy {s.policy_version}, concurrency {s.concurrency})",
        f"  {'done':<11}{s.done:>6}",
        f"  {'failed':<11}{s.failed:>6}  ({input_failed} bad input, {s.failed - input_failed} run failures)",
        f"  {'skipped':<11}{s.skipped:>6}  (finished or refused in an earlier run)",
        f"  {'total':<11}{s.total:>6}",
        f"  {'seconds':<11}{s.seconds:>8.1f}",
        f"  {'throughput':<11}{s.throughput_per_min:>8.2f} sessions/min (reports completed in this run)",
    ]
    if s.usage is not None:
        from agent.accounting import format_cost

        u = s.usage
        lines += [f"  {'tokens':<11}{u.prompt_tokens:>8,} read, {u.sampled_tokens:,} sampled by the policy "
                  f"({u.policy_calls} calls, {u.items} item(s))",
                  f"  {'cost':<11}{format_cost(u.cost_usd):>8} (policy; the judge's is per session)"]
    failed = [r for r in s.items if r.recorded == "failed"]
    if failed:
        lines.append(f"{len(failed)} item(s) without a report:")
        lines += [f"  {r.id}: {r.error_kind} error: {r.error}" for r in failed]
    lines.append(f"index {s.index_md}")
    return "\n".join(lines)


def cmd_batch(args: argparse.Namespace) -> int:
    """Run a batch of questions; see the module docstring for exit codes."""
    from agent.errors import InputError
    from app.batch import run_batch
    from app.cli.common import run_options as _run_options
    from app.container import build

    settings = Settings()
    source = Path(args.queries)
    items = load_items(source, settings.sessions.batch_max_questions)  # a bad file fails here, before the model
    if args.concurrency < 1:
        raise InputError(f"--concurrency must be at least 1, not {args.concurrency}")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a folder")
    options = _run_options(settings, args)
    progress = BatchProgress(len(items), args.quiet)
    progress.say(f"{len(items)} question(s) from {source}; reports in {out}")
    services = build(settings, say=progress.say)

    async def go() -> BatchSummary:
        try:
            return await run_batch(services.research, items, out, concurrency=args.concurrency, options=options,
                                   progress=progress, prices=settings.prices)
        finally:
            await services.policy.aclose()

    try:
        summary: Any = asyncio.run(go())
    finally:
        progress.close()
    print(summary_table(summary, source))
    return 1 if summary.unfinished else 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `batch` on the main parser."""
    b = sub.add_parser("batch", help="research every question of a JSONL/CSV file: a report per question and an index")
    b.add_argument("queries", help=".jsonl (\"question\", optional \"id\", \"format\") or .csv (a \"question\" column)")
    b.add_argument("--out", required=True, help="output folder; a rerun skips finished items")
    b.add_argument("--concurrency", type=int, default=1, help="research sessions at once (default 1)")
    b.add_argument("--format", choices=["exact_answer", "short_form", "long_form"],
                   help="answer format for items that do not set their own")
    b.add_argument("--max-tool-calls", type=int, dest="max_tool_calls")
    b.add_argument("--seed", type=int)
    b.add_argument("--temperature", type=float)
    b.add_argument("--wall-clock", type=float, dest="wall_clock_s", help="hard time limit of each run, seconds")
    b.add_argument("--quiet", action="store_true", help="no progress on stderr")
    b.set_defaults(func=cmd_batch)
