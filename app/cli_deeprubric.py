"""`rubricem deeprubric build|trees|pairs`: DeepRubric's offline pipeline over the local index (METHOD §11).

`build` grows evidence trees from seed pages of the local index (or the pages a `--topic` finds), synthesises one
question and its rubrics per tree, audits them (KEEP / REVISE / DROP) and writes the statistics, all into one
resumable folder; `trees` and `pairs` run the first or the second half. Progress goes to stderr, the final summary
line to stdout. Bad input exits 2 before anything is written.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from app.cli_common import Progress
from app.settings import Settings

MAX_SEEDS = 100_000


def _check(args: argparse.Namespace) -> None:
    """Command-line checks that need no index (ValueError: exit 2, nothing written)."""
    if args.command_name != "pairs" and not 1 <= args.seeds <= MAX_SEEDS:
        raise ValueError(f"--seeds must be a whole number from 1 to {MAX_SEEDS:,}, got {args.seeds}")
    if args.topic is not None and not args.topic.strip():
        raise ValueError("--topic must not be blank")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    if args.command_name == "pairs" and not (out / "trees.jsonl").is_file():
        raise ValueError(f"--out {out}: no trees.jsonl (run `rubricem deeprubric trees` first)")


def cmd_build(args: argparse.Namespace) -> int:
    """Run the stages of the command; prints one summary line."""
    _check(args)
    from agent.tools.local_search import LocalSearch
    from app.container import ensure_corpus, open_index
    from learning.deeprubric.build import BuildSettings, build, check_folder, settings_of
    from learning.deeprubric.corpus import LocalRetriever, SeedPage, draw_seeds, index_pages, topic_seeds
    from learning.deeprubric.tree import TreeConfig

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    out = Path(args.out)
    stages = {"build": ("trees", "pairs"), "trees": ("trees",), "pairs": ("pairs",)}[args.command_name]
    progress = Progress()
    say = progress.say
    seeds: list[tuple[str, SeedPage]] = []
    search: LocalSearch | None = None
    if "trees" in stages:
        tree_cfg = TreeConfig(max_nodes=args.max_nodes, max_depth=args.max_depth)
        topic = " ".join(args.topic.split()) if args.topic else None
        settings = BuildSettings("offline", args.seed, topic, tree_cfg)
        check_folder(out, settings)
        index = open_index(Settings())
        ensure_corpus(index, say, progress.bar)
        search = LocalSearch(index, k=tree_cfg.top_k, snippet_chars=tree_cfg.passage_chars)
        if topic:
            seeds = asyncio.run(topic_seeds(search, topic, args.seeds))
        else:
            seeds = draw_seeds(index_pages(sorted(index.sources())), args.seeds, args.seed)
    else:
        settings = settings_of(out)
    say(f"DeepRubric (offline): {len(seeds)} seed(s) into {out}")

    def retriever(key: str) -> LocalRetriever:
        assert search is not None  # only the trees stage retrieves, and it opened the index
        return LocalRetriever(search, key)

    result = asyncio.run(build(out, seeds, retriever, settings, say=say, stages=stages))
    s = result.stats
    print(f"deeprubric: {s['trees']} trees ({result.trees_built} new, {result.trees_resumed} resumed), "
          f"{s['pairs_kept']} pairs kept (KEEP {s['audit']['KEEP']}, REVISE {s['audit']['REVISE']}, "
          f"DROP {s['audit']['DROP']}, no pair {sum(s['trees_skipped_by_reason'].values())}); "
          f"statistics in {out / 'stats.md'}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `deeprubric build`, `deeprubric trees` and `deeprubric pairs`."""
    dr = sub.add_parser("deeprubric", help="DeepRubric: evidence trees, query+rubric pairs, audit (offline)")
    s = dr.add_subparsers(dest="deeprubric_command", required=True)
    for name, text in (("build", "trees, pairs, audit and statistics in one resumable run"),
                       ("trees", "grow evidence trees only (resumable)"),
                       ("pairs", "synthesise and audit pairs from the trees of a folder (resumable)")):
        p = s.add_parser(name, help=text)
        if name != "pairs":
            p.add_argument("--seeds", type=int, required=True, help="number of trees (seed pages)")
            p.add_argument("--topic", help="seed from the pages local_search finds for this topic")
            p.add_argument("--seed", type=int, default=0, help="random seed for drawing seed pages")
            p.add_argument("--max-nodes", type=int, default=50, help="node budget per tree (METHOD §11.2: 50)")
            p.add_argument("--max-depth", type=int, default=3, help="maximum tree depth (METHOD §11.2: 3)")
        p.add_argument("--out", required=True, help="build folder (an existing one resumes)")
        p.add_argument("--threads", type=int, help="torch CPU threads for query embedding (1 is fastest on a "
                       "busy machine)")
        p.set_defaults(func=cmd_build, command_name=name, seeds=0, topic=None, seed=0)
