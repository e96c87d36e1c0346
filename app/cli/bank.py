"""`rubricem bank ...` (rubric-bank hygiene) and `rubricem reflect` (write reflections for judged sessions)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.settings import Settings
from store.records import BankItem


def _line(it: BankItem, similarity: float | None = None) -> str:
    sim = f"{similarity:6.3f}  " if similarity is not None else ""
    question = " ".join(it.question.split())
    question = question if len(question) <= 70 else question[:69] + "…"
    return f"{it.id}  {sim}u={it.score:.2f}  {it.created_at[:19]}  {it.policy_version:<12}  {question}"


def cmd_bank(args: argparse.Namespace) -> int:
    """List, search, show, delete, export, import or deduplicate rubric-bank items."""
    from app.container import open_bank

    bank = open_bank(Settings())
    action = args.action
    if action == "list":
        items = bank.list_items(limit=args.limit)
        print(f"{bank.count():,} item(s) in the rubric bank" + (f", newest {len(items)} shown" if items else ""))
        for it in items:
            print(_line(it))
    elif action == "search":
        r = bank.retrieve(args.query, k=args.k, min_similarity=args.min_similarity)
        print(f"mode: {r.mode}" + (" (the same question was reflected on before)" if r.mode == "within" else ""))
        for h in r.hits:
            print(_line(h.item, h.similarity))
    elif action == "show":
        it = bank.get(args.item_id)
        print(f"id        {it.id}\nquestion  {it.question}\nscore     {it.score:.3f}\njudge     {it.judge_model}\n"
              f"policy    {it.policy_version}\nsession   {it.session_id}\ncreated   {it.created_at}\n")
        print(f"<reflection_rubrics>\n{it.rubrics}\n</reflection_rubrics>\n"
              f"<reflection_takeaways>\n{it.takeaways}\n</reflection_takeaways>")
    elif action == "delete":
        bank.delete(args.item_id)
        print(f"deleted {args.item_id}")
    elif action == "export":
        n = bank.export_jsonl(Path(args.path))
        print(f"exported {n:,} item(s) to {args.path}")
    elif action == "import":
        result = bank.import_jsonl(Path(args.path), progress=_progress)
        print(f"read {result.read:,}, stored {result.stored:,}, replaced {result.replaced:,}, "
              f"skipped {result.skipped:,} (an item for the same question is newer), evicted {result.evicted:,}")
    elif action == "dedupe":
        removed = bank.dedupe()
        print(f"removed {len(removed):,} near-identical item(s); {bank.count():,} left")
    return 0


def cmd_reflect(args: argparse.Namespace) -> int:
    """Write reflections for judged, completed sessions that have none yet (the inference side of the meta-policy)."""
    import asyncio

    from app.cli.common import Progress
    from app.container import build, build_reflection_judge
    from learning.reflection.writer import reflect_pending

    settings = Settings()
    progress = Progress()
    services = build(settings, say=progress.say, progress=progress.bar)
    judge = build_reflection_judge(settings, say=progress.say)

    async def go() -> object:
        try:
            return await reflect_pending(services.log, services.policy, judge, services.bank, limit=args.limit,
                                         progress=progress.say, candidates=args.candidates,
                                         threshold=args.threshold, seed=args.seed)
        finally:
            await services.policy.aclose()
            client = getattr(judge, "client", None)
            if client is not None:
                await client.aclose()

    summary = asyncio.run(go())
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(summary.reasons.items())) or "none"  # type: ignore[attr-defined]
    print(f"reflected on {summary.sessions} session(s): {summary.accepted} accepted into the bank, "  # type: ignore[attr-defined]
          f"{summary.refused} not reflectable, {summary.failed} failed; outcomes: {reasons}")  # type: ignore[attr-defined]
    return 1 if summary.failed and not summary.stored else 0  # type: ignore[attr-defined]


def _progress(done: int, total: int) -> None:
    print(f"  {done:,}/{total:,}", file=sys.stderr, flush=True)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `bank` and `reflect` on the main parser."""
    bank = sub.add_parser("bank", help="inspect and maintain the rubric bank of reflections")
    acts = bank.add_subparsers(dest="action", required=True)
    lst = acts.add_parser("list", help="newest items first")
    lst.add_argument("--limit", type=int, default=20)
    srch = acts.add_parser("search", help="what a research run on QUERY would retrieve (within or cross-episode)")
    srch.add_argument("query")
    srch.add_argument("--k", type=int, help="cross-episode items (default: settings, 2)")
    srch.add_argument("--min-similarity", type=float, dest="min_similarity",
                      help="cosine threshold for cross-episode items (default: settings)")
    for name, text in (("show", "print one item"), ("delete", "remove one item")):
        one = acts.add_parser(name, help=text)
        one.add_argument("item_id")
    exp = acts.add_parser("export", help="write every item to a JSONL file (atomic)")
    exp.add_argument("path")
    imp = acts.add_parser("import", help="add items from a JSONL export (the newest per question wins)")
    imp.add_argument("path")
    acts.add_parser("dedupe", help="remove near-identical items, keeping the newest")
    bank.set_defaults(func=cmd_bank)
    ref = sub.add_parser("reflect", help="write reflections for judged sessions into the rubric bank")
    ref.add_argument("--limit", type=int, help="at most this many sessions")
    ref.add_argument("--candidates", type=int, default=8, help="reflection candidates m per session (paper: 8)")
    ref.add_argument("--threshold", type=float, default=0.5, help="minimum reflection score u to enter the bank")
    ref.add_argument("--seed", type=int, help="sampling seed")
    ref.set_defaults(func=cmd_reflect)
