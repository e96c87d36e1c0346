"""`rubricem deeprubric build|trees|pairs`: DeepRubric's offline pipeline over the local index (METHOD §11).

`build` grows evidence trees from seed pages of the local index (or the pages a `--topic` finds), synthesises one
question and its rubrics per tree, audits them (KEEP / REVISE / DROP) and writes the statistics, all into one
resumable folder; `trees` and `pairs` run the first or the second half. Progress goes to stderr, the final summary
line to stdout. Bad input exits 2 before anything is written.

`--mode llm` has the configured judge endpoint (`RUBRICEM_LEARNING__JUDGE__BASE_URL`, `..._MODEL`,
`..._JSON_MODE`, through the judge client with its cache, retries and accounting) write the sub-queries, statements,
gate decisions, pairs and audits (`learning/deeprubric/llm.py`); without an endpoint it exits 2 before anything is
written. A folder keeps the mode (and model) it was started with.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from app.cli.common import Progress
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
    if args.mode == "llm" and not Settings().learning.judge.base_url:
        raise ValueError("--mode llm needs an LLM endpoint: set RUBRICEM_LEARNING__JUDGE__BASE_URL and "
                         "RUBRICEM_LEARNING__JUDGE__MODEL (and RUBRICEM_LEARNING__JUDGE__JSON_MODE if the server "
                         "has no json_schema response format)")


def cmd_build(args: argparse.Namespace) -> int:
    """Run the stages of the command; prints one summary line."""
    _check(args)
    from agent.tools.local_search import LocalSearch
    from app.container import ensure_corpus, open_index
    from learning.deeprubric.build import BuildSettings, Components, build, check_folder, llm_components, settings_of
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
    client = None
    components: Components | None = None
    model = ""
    if args.mode == "llm":
        from app.container import build_judge_client

        client = build_judge_client(Settings())  # ConfigurationError (exit 2) on unusable judge settings
        model = client.model
    if "trees" in stages:
        tree_cfg = TreeConfig(max_nodes=args.max_nodes, max_depth=args.max_depth)
        topic = " ".join(args.topic.split()) if args.topic else None
        settings = BuildSettings(args.mode, args.seed, topic, tree_cfg, model)
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
        if (settings.mode, settings.model) != (args.mode, model):
            raise ValueError(f"--out {out} was built in the {settings.mode} mode"
                             f"{f' with {settings.model!r}' if settings.model else ''}; pass --mode "
                             f"{settings.mode}{' with that judge model' if settings.model else ''}")
    if client is not None:
        components = llm_components(client, statements_per_node=settings.tree.statements_per_node)
    say(f"DeepRubric ({args.mode}{f', {model}' if model else ''}): {len(seeds)} seed(s) into {out}")

    def retriever(key: str) -> LocalRetriever:
        assert search is not None  # only the trees stage retrieves, and it opened the index
        return LocalRetriever(search, key)

    async def run() -> object:
        try:
            return await build(out, seeds, retriever, settings, components, say=say, stages=stages)
        finally:
            if client is not None:
                await client.aclose()

    result = asyncio.run(run())
    s = result.stats  # type: ignore[attr-defined]
    llm = s.get("llm")
    cost = (f"; LLM: {llm['requests']} requests, {llm['prompt_tokens'] + llm['completion_tokens']:,} tokens, "
            f"{sum(llm['failures'].values())} step failures" if llm else "")
    built, resumed = result.trees_built, result.trees_resumed  # type: ignore[attr-defined]
    print(f"deeprubric: {s['trees']} trees ({built} new, {resumed} resumed), "
          f"{s['pairs_kept']} pairs kept (KEEP {s['audit']['KEEP']}, REVISE {s['audit']['REVISE']}, "
          f"DROP {s['audit']['DROP']}, no pair {sum(s['trees_skipped_by_reason'].values())}){cost}; "
          f"statistics in {out / 'stats.md'}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register `deeprubric build`, `deeprubric trees` and `deeprubric pairs`."""
    dr = sub.add_parser("deeprubric", help="DeepRubric: evidence trees, query+rubric pairs, audit (offline or LLM)")
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
        p.add_argument("--mode", choices=("offline", "llm"), default="offline",
                       help="who writes sub-queries, statements, pairs and audits: the deterministic offline rules "
                       "(default) or the configured judge endpoint (RUBRICEM_LEARNING__JUDGE__*)")
        p.add_argument("--threads", type=int, help="torch CPU threads for query embedding (1 is fastest on a "
                       "busy machine)")
        p.set_defaults(func=cmd_build, command_name=name, seeds=0, topic=None, seed=0)
