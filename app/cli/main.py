"""The `rubricem` command: ask, ingest, sessions, judge, eval, bank, ... and mcp (the other app/cli/*.py modules).

Exit codes: 0 success, 1 the run failed (the session is marked failed in the log), 2 bad input or configuration.
Progress goes to stderr; reports and listings go to stdout (so `rubricem ask ... > report.md` works).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pydantic import ValidationError

from agent.errors import AgentError, IngestError, InputError
from agent.report import stored_report
from agent.support import support_summary
from app.cli import bank as cli_bank, batch as cli_batch, deeprubric as cli_deeprubric, loop as cli_loop
from app.cli import mcp as cli_mcp, policy_server as cli_policy_server, resume as cli_resume, sft as cli_sft
from app.cli import train as cli_train, ui as cli_ui, users as cli_users
from app.cli.common import Progress, with_adapter
from app.cli.common import run_options as _run_options
from app.container import ConfigurationError
from app.scheduler import CycleLocked
from app.settings import Settings
from learning.errors import LearningError
from store.doc_index import DocIndexError
from store.errors import InvalidInput, SessionNotFound, StoreError
from store.records import SessionSource
from store.registry import RegistryError
from store.rubric_bank import BankItemNotFound

if TYPE_CHECKING:
    from app.service import ResearchOutcome  # imported when a command runs: `rubricem --help` stays quick


def cmd_ask(args: argparse.Namespace) -> int:
    from agent.run import validate_question
    from app.container import build
    from app.service import RunFailedError

    settings = with_adapter(Settings(), args.adapter)
    progress = Progress(args.quiet)
    question = validate_question(args.question, settings.agent.max_question_chars)  # fail fast, before loading
    options = _run_options(settings, args)
    for target in (args.out, args.json):  # refuse an unwritable output before spending minutes on research
        if target and not Path(target).resolve().parent.is_dir():
            raise OutputPathError(f"cannot write {target}: its folder does not exist")
    services = build(settings, say=progress.say, progress=progress.bar)

    async def go() -> Any:
        try:
            # A clarifying question before the plan (--clarify, else sessions.clarify) and the plan's approval
            # (--approve-plan) are asked here, in the terminal (issue 21; app/cli/resume.py).
            svc = services.research
            return await cli_resume.drive(
                svc.start(question, options, on_event=progress.event, source="cli", approve_plan=args.approve_plan,
                          clarify=args.clarify),
                lambda sid, d: svc.resume(sid, d, on_event=progress.event))
        finally:
            await services.policy.aclose()

    try:
        outcome = asyncio.run(go())
    except RunFailedError as exc:
        where = f"; session {exc.session_id} is marked failed" if exc.session_id else ""
        print(f"error: the research run failed ({exc}){where}", file=sys.stderr)
        return 1
    if outcome is None or not hasattr(outcome, "report"):  # the user rejected the plan, or left it waiting
        return cli_resume.print_outcome(outcome, progress)
    report = outcome.report
    progress.say(
        f"done: {len(outcome.trajectory.tool_calls)} tool calls, {len(report.references)} references"
        + (f", {report.unknown_citations} invented citation ids (marked unsupported)" if report.unknown_citations
           else "")
        + (f"; citations: {support_summary(report.support)}" if report.support else "")
        + (" (malformed trajectory: a stage was missing)" if outcome.trajectory.malformed else "")
    )
    print(report.markdown)  # the report reaches stdout even if writing a file below fails
    if args.out:
        Path(args.out).write_text(report.markdown, encoding="utf-8")
        progress.say(f"report written to {args.out}")
    if args.json:
        Path(args.json).write_text(json.dumps(ask_payload(outcome), indent=2, ensure_ascii=False), encoding="utf-8")
        progress.say(f"JSON written to {args.json}")
    return 0


def ask_payload(outcome: ResearchOutcome) -> dict[str, Any]:
    """What `ask --json` writes for a finished session."""
    from app.service import citation_counts, stage_summary

    report = outcome.report
    return {
        "session_id": outcome.session_id,
        "report": report.markdown,
        "citations": [{"id": s.id, "title": s.title, "text": s.text} for s in report.references],
        "support": report.support.as_dict() if report.support else None,  # each cited claim, checked
        # `invented_citations` (issue 64), from the one helper batch records and MCP results use too
        **citation_counts(report),
        "stages": stage_summary(outcome.trajectory),
        "policy_version": outcome.policy_version,
    }


def cmd_ingest(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from agent.ingest import IngestLimits, ingest, load_documents
    from app.container import open_index
    from app.uploads import upload_limits

    settings = Settings()
    progress = Progress()
    path = Path(args.path)
    # The PDF caps of RUBRICEM_UPLOADS__* hold here too (a PDF bomb is one whoever hands it over); the per-file size
    # cap of chat uploads does not: the operator's own corpus files may be large.
    limits = replace(upload_limits(settings.uploads), max_file_bytes=IngestLimits().max_file_bytes)
    docs = load_documents(path, limits)  # every file is read (and refused) before the index is touched
    progress.say(f"read {len(docs):,} chunks from {path}")
    index = open_index(settings)
    result = ingest(path, index, progress=progress.bar, limits=limits)
    progress.say(f"indexed {result.chunks:,} chunks from {len(result.sources)} file(s); index holds {index.count():,}")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    """What a first `ask` would otherwise do before its first token (issue 47), run by `make install`: the bundled
    model's tokenizer folder; for the embedded llamacpp engine, its CPU variant probes, thread plan, the Q8_0 copy of
    the base (with `embedded_base_q8`) and the shipped adapter's GGUF conversion (one policy built and closed); and
    the demo corpus in the local index when the user has ingested nothing of their own. Each step's seconds are
    printed."""
    import time

    from app.container import ensure_corpus, open_index

    settings = Settings()
    progress = Progress()
    cfg = settings.agent
    if cfg.policy_backend == "embedded" and cfg.embedded_model_path is None:
        from learning.engines.weights import ensure_tokenizer

        t = time.monotonic()
        folder = ensure_tokenizer(settings.store.model_cache)
        progress.say(f"tokenizer and config of the bundled SmolLM2 in {folder} ({time.monotonic() - t:.1f} s)")
        if cfg.embedded_engine == "llamacpp":
            from app.container import build_policy

            t = time.monotonic()
            policy = build_policy(settings, say=progress.say)  # variant probes, thread plan, Q8_0 base, adapter
            engine = getattr(policy, "engine", None)
            variant = getattr(engine, "cpu_variant", None)
            threads = getattr(policy, "threads", None)
            asyncio.run(policy.aclose())
            which = (f"CPU variant {variant.name} (probed on this CPU)" if variant is not None
                     else "its built-in CPU backend")
            plan = f", {threads.decode} decode / {threads.prefill} prompt threads ({threads.source})" if threads else ""
            progress.say(f"llama.cpp runs {which}{plan} ({time.monotonic() - t:.1f} s)")
    t = time.monotonic()
    index = open_index(settings)
    ensure_corpus(index, say=progress.say, progress=progress.bar)
    progress.say(f"local index ready: {index.count():,} chunks ({time.monotonic() - t:.1f} s)")
    return 0


def cmd_sessions(args: argparse.Namespace) -> int:
    from agent.accounting import format_cost, usage_of, usages
    from store.session_log import SessionLog

    settings = Settings()
    log = SessionLog.from_config(settings.store)
    if args.action == "list" and args.user == "":
        cli_users.print_user_counts(log)
        return 0
    if args.action == "list":
        rows = log.list_sessions(limit=args.limit, status=args.status, sources=args.source, owner=args.user)
        if not rows:
            print("no sessions")
        costs = usages(log, [r.session_id for r in rows], settings.prices)  # policy and judge, under the price table
        for r in rows:
            cost = format_cost(costs[r.session_id].total_cost) if r.session_id in costs else "-"
            print(f"{r.session_id}  {r.shown_status:<11}  {r.source:<7}  {r.created_at}  {cost:>9}  "
                  f"{_short(r.question, 70)}")
        return 0
    rec = log.get(args.session_id)
    traj = rec.trajectory
    status = "interrupted" if log.interrupted(rec.session_id) else rec.status  # its process is gone (issue 34)
    print(f"session   {rec.session_id}\nstatus    {status}\nquestion  {rec.question}\npolicy    {rec.policy_version}")
    if status == "interrupted":
        print(f"resume    rubricem resume {rec.session_id}  (its process stopped; checkpointed sessions go on)")
    print(f"created   {rec.created_at}\nfinished  {rec.finished_at or '-'}")
    print(f"source    {rec.source}{' (never trained on)' if rec.training_opt_out else ''}")
    print(f"owner     {rec.owner}")
    if rec.team is not None:  # issue 49: the owner's team as the session started, whose policy served it
        print(f"team      {rec.team}")
    serving = rec.metrics.get("serving")
    if isinstance(serving, dict) and serving.get("warning"):  # the team's own version could not serve it
        print(f"serving   {serving['warning']}")
    if rec.error:
        print(f"error     {rec.error}")
    print(f"turns     {len(traj.turns)} ({sum(len(t.token_ids) for t in traj.turns)} tokens, "
          f"{sum(sum(t.mask) for t in traj.turns)} trainable); tool calls {len(traj.tool_calls)}")
    support = stored_report(rec).support if rec.status == "completed" else None
    if support is not None:
        print(f"citations {support_summary(support)}")
    for j in log.judgements(rec.session_id) if rec.status == "completed" else []:
        stages = j.payload.get("stages", {}) if j.status == "ok" else {}
        scores = ", ".join(
            f"{name}={'-' if v.get('score') is None else format(v['score'], '.2f')}" for name, v in stages.items()
        )
        print(f"judgement {j.created_at} {j.status} {j.judge_kind}/{j.judge_model}: {scores or j.error}")
    usage = usage_of(log, rec.session_id, settings.prices)
    if usage is not None:
        print(_usage_table(usage, settings.prices))
    if args.turns:
        for i, t in enumerate(traj.turns):
            read = f" / read {t.prompt_tokens}" if t.prompt_tokens is not None else ""
            print(f"--- turn {i}: {t.stage} / {t.kind} / {len(t.token_ids)} tokens{read} / {t.policy_version}")
            print(t.text)
    if rec.report:
        print("\n" + rec.report)
    return 0


def _usage_table(usage: Any, prices: Any) -> str:
    """`sessions show`'s tokens-and-cost table (agent.accounting.usage_rows): calls, prompt and output tokens, cost."""
    from agent.accounting import format_cost, prices_note, unpriced_models, usage_rows

    lines = [f"tokens    {prices_note(prices)}",
             f"  {'':<9}{'calls':>6}{'prompt':>11}{'output':>9}{'cost':>11}  (output: sampled, or the judge's)"]
    for row in usage_rows(usage):
        lines.append(f"  {row.label:<9}{row.calls:>6}{row.prompt_tokens:>11,}{row.output_tokens:>9,}"
                     f"{format_cost(row.cost):>11}  {row.note}".rstrip())
    missing = unpriced_models(usage)
    if missing:
        lines.append(f"  unknown cost: the price table does not list {', '.join(missing)}")
    return "\n".join(lines)


def cmd_judge(args: argparse.Namespace) -> int:
    from app.container import build_judge
    from learning.judge.pipeline import judge_pending
    from store.session_log import SessionLog

    settings = Settings()
    progress = Progress()
    since = _parse_date(args.since) if args.since else None
    log = SessionLog.from_config(settings.store)
    judge = build_judge(settings, log, say=progress.say)

    async def go() -> Any:
        try:
            return await judge_pending(log, judge, since=since, limit=args.limit, progress=progress.say)
        finally:
            client = getattr(judge, "client", None)
            if client is not None:
                await client.aclose()

    summary = asyncio.run(go())
    u = summary.usage
    print(f"judge {judge.model} ({judge.kind}{', approximate' if judge.kind == 'offline' else ''}): "
          f"{summary.judged} judged, {summary.failed} failed, {summary.groups} question group(s), "
          f"{summary.failed_stages} unscorable stage(s), {summary.fallbacks} answer-only fallback(s)")
    if u.calls or u.cached_calls:
        from agent.accounting import format_cost, judge_cost

        # The same price rule as the session views: the price table when it lists the judge's model.
        cost = judge_cost(settings.prices, judge.model, judge.kind, u.prompt_tokens, u.completion_tokens, u.cost_usd)
        print(f"judge calls {u.calls} (+{u.cached_calls} cached), tokens {u.prompt_tokens}+{u.completion_tokens}, "
              f"cost {format_cost(cost)}")
    return 1 if summary.failed and not summary.judged else 0


def cmd_eval(args: argparse.Namespace) -> int:
    from app.container import build, build_judge_client
    from learning.eval.datasets import bench_spec, load_benchmark
    from learning.eval.runner import run_eval, run_eval_seeds

    settings = with_adapter(Settings(), args.adapter)
    progress = Progress()
    data = Path(args.data)
    if not data.exists():
        raise InputError(f"--data {data}: no such folder or file")
    if args.limit is not None and args.limit < 1:
        raise InputError("--limit must be at least 1")
    if args.runs < 1:
        raise InputError("--runs must be at least 1")
    if bench_spec(args.bench).needs_judge and not settings.learning.judge.base_url:
        raise InputError(f"{args.bench} is scored by an LLM grader: set RUBRICEM_LEARNING__JUDGE__BASE_URL and "
                         "RUBRICEM_LEARNING__JUDGE__MODEL (see README, 'Judging and evaluation')")
    load_benchmark(args.bench, data, limit=1)  # a bad folder fails here, before the model and index are loaded
    out = Path(args.out) if args.out else Path("eval-runs") / args.bench
    options = _run_options(settings, args).model_copy(update={"inject_bank": args.inject_bank})
    judge = build_judge_client(settings) if settings.learning.judge.base_url else None
    # Benchmarks grade the model's own citations: references matched after writing or repaired by the support check
    # (reading aids in the UI and the reports) would lift citation scores for citations the model never wrote.
    settings = settings.model_copy(update={"agent": settings.agent.model_copy(
        update={"attribute_uncited": False, "verify_citations": False})})
    services = build(settings, say=progress.say, progress=progress.bar)

    def tick(label: str) -> Any:
        return lambda done, total, item_id: progress.say(f"{label}[{done}/{total}] {item_id}")

    def run_tick(label: str) -> Any:
        return lambda run, done, total, item_id: progress.say(
            f"{label}run {run}/{args.runs} [{done}/{total}] {item_id}")

    runs: list[tuple[str, Any, Path]] = [("agent", services.research, out / "agent" if args.baseline else out)]
    if args.baseline == "rag":
        from learning.eval.baseline import RagBaseline

        if "local_search" not in services.tools:
            raise InputError("--baseline rag needs local_search (a document index)")
        runs.insert(0, (f"rag k={args.k}", RagBaseline(services.policy, services.tools["local_search"], args.k),
                        out / "rag"))

    async def one(label: str, service: Any, run_out: Path) -> Any:
        shown = f"{label} " if args.baseline else ""
        common: dict[str, Any] = {"service": service, "options": options, "out_dir": run_out, "limit": args.limit,
                                  "judge": judge, "inject_bank": args.inject_bank, "answer_format": args.format,
                                  "prices": settings.prices}
        if args.runs == 1:  # one run keeps the single-run layout: items.jsonl and the summary in OUT itself
            return await run_eval(args.bench, data, progress=tick(shown), **common)
        return await run_eval_seeds(args.bench, data, runs=args.runs, progress=run_tick(shown), **common)

    async def go() -> list[Any]:
        try:
            return [await one(label, service, run_out) for label, service, run_out in runs]
        finally:
            await services.policy.aclose()
            if judge is not None:
                await judge.aclose()

    summaries = asyncio.run(go())
    for (label, _, _), summary in zip(runs, summaries, strict=True):
        _print_eval(label, summary, args.runs)
    if args.baseline:
        from learning.eval.report import write_comparison

        write_comparison(out / "comparison.md", out / "comparison.png", f"{args.bench}: agent beside the baseline",
                         {label: s.to_dict() for (label, _, _), s in zip(runs, summaries, strict=True)})
        print(f"comparison {out / 'comparison.md'}\nplot {out / 'comparison.png'}")
    return 0


def _print_eval(label: str, summary: Any, runs: int) -> None:
    """One evaluation's outcome on stdout: its metrics (over several seeds: mean ± sample std), tokens and cost."""
    from agent.accounting import format_cost
    from learning.eval.report import mean_std_text

    items = f"{summary.n} items" if runs == 1 else f"{runs} runs (seeds {', '.join(map(str, summary.seeds))}) × " \
        f"{summary.n} items"
    print(f"{summary.bench} [{label}]: {items}, {summary.n_failed} failed runs, policy {summary.policy_version}, "
          f"bank injection {summary.injection}, judge {summary.judge_model or 'none'}")
    for name, value in summary.metrics.items():
        if runs > 1:
            print(f"  {name:<22} {mean_std_text(value, summary.metrics_std.get(name))}")
        else:
            print(f"  {name:<22} {value:.4f}" if isinstance(value, float) else f"  {name:<22} {value}")
    t, c = summary.tokens, summary.cost_usd
    print(f"tokens policy {t['policy_prompt']} in / {t['policy_sampled']} out ({t['policy_calls']} calls), judge "
          f"{t['judge_prompt']} in / {t['judge_completion']} out; cost {format_cost(c['total'])} (policy "
          f"{summary.policy_model} {format_cost(c['policy'])}, judge {format_cost(c['judge'])})")
    if runs > 1:
        print(f"runs {', '.join(str(r.out_dir) for r in summary.runs)}\nsummary {summary.summary_md}")
    else:
        print(f"items {summary.items_path}\nsummary {summary.summary_md}\nplot {summary.plot_path}")


def _parse_date(text: str) -> Any:
    from datetime import UTC, datetime

    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InputError(f"--since must be an ISO date such as 2026-11-01 or 2026-11-01T12:00, not {text!r}") from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(prog="rubricem", description="Deep-research agent: plan, search, review, answer.")
    sub = p.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="research a question and print a cited Markdown report")
    ask.add_argument("question")
    ask.add_argument("--out", help="also write the report to this Markdown file")
    ask.add_argument("--json", help="write session id, report, citations, stages and policy version as JSON")
    ask.add_argument("--format", choices=["exact_answer", "short_form", "long_form"])
    ask.add_argument("--max-tool-calls", type=int, dest="max_tool_calls")
    ask.add_argument("--seed", type=int)
    ask.add_argument("--temperature", type=float)
    ask.add_argument("--wall-clock", type=float, dest="wall_clock_s", help="hard time limit in seconds")
    ask.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ask.add_argument("--adapter", help="a trained LoRA adapter folder (embedded backend), e.g. from rubricem train; "
                     "`none` for the plain base model (default: the shipped SFT adapter, unless "
                     "RUBRICEM_AGENT__EMBEDDED_SFT=false)")
    ask.add_argument("--approve-plan", action="store_true", dest="approve_plan",
                     help="pause after the plan to accept, edit or reject it (interactive)")
    ask.add_argument("--clarify", action=argparse.BooleanOptionalAction, default=None,
                     help="before planning, let the policy ask one question if the request is ambiguous (answered "
                     "here; empty = go on without). Default: RUBRICEM_SESSIONS__CLARIFY (auto: on for endpoint "
                     "policies, off for the embedded model)")
    ask.set_defaults(func=cmd_ask)
    ing = sub.add_parser("ingest", help="add files (txt, md, html, pdf, jsonl) or a folder to the local index")
    ing.add_argument("path")
    ing.set_defaults(func=cmd_ingest)
    pre = sub.add_parser("prepare", help="do once what a first ask would: the tokenizer folder, the llama.cpp CPU "
                         "variant probes, the demo corpus index (make install runs it)")
    pre.set_defaults(func=cmd_prepare)
    jud = sub.add_parser("judge", help="judge completed, not-yet-judged sessions and store the judgements")
    jud.add_argument("--since", help="only sessions finished at or after this ISO date/time (UTC if no zone)")
    jud.add_argument("--limit", type=int, help="at most this many sessions")
    jud.set_defaults(func=cmd_judge)
    evl = sub.add_parser("eval", help="run the agent on a benchmark and score it with that benchmark's method; "
                         "tokens and cost (RUBRICEM_PRICES) per item and in total")
    evl.add_argument("bench", help="hotpotqa, musique, 2wikimultihopqa, bamboogle, simpleqa, frames, shortform, "
                     "healthbench, deep_research_bench, scholarqa_cs, rubric-pairs (DeepRubric pairs)")
    evl.add_argument("--data", required=True, help="the benchmark's data folder (rubric-pairs: a pairs.jsonl)")
    evl.add_argument("--limit", type=int, help="at most this many items")
    evl.add_argument("--out", help="output folder (default eval-runs/BENCH); a rerun resumes")
    evl.add_argument("--runs", type=int, default=1, metavar="N", help="repeat the whole evaluation over N seeds: "
                     "--seed, --seed+1, ... (0, 1, ... without --seed), run K in OUT/run-K/, and report each metric's "
                     "mean and sample standard deviation over the runs in OUT/summary.json and summary.md (default 1: "
                     "one run, in OUT)")
    evl.add_argument("--inject-bank", action="store_true", help="retrieve rubric-bank reflections (off, as in the paper)")
    evl.add_argument("--max-tool-calls", type=int, dest="max_tool_calls")
    evl.add_argument("--seed", type=int)
    evl.add_argument("--temperature", type=float)
    evl.add_argument("--wall-clock", type=float, dest="wall_clock_s", help="hard time limit per question, seconds")
    evl.add_argument("--format", choices=["exact_answer", "short_form", "long_form"],
                     help="ask every item in this answer format (default: the benchmark's)")
    evl.add_argument("--baseline", choices=["rag"], help="also run vanilla RAG (one local_search with the question, "
                     "top k passages, one short answer) with the same policy and index, and compare")
    evl.add_argument("--k", type=int, default=5, help="passages in the RAG baseline's prompt")
    evl.add_argument("--adapter", help="a LoRA adapter folder for the embedded policy, or `none` for the base model "
                     "(default: the shipped SFT adapter, unless RUBRICEM_AGENT__EMBEDDED_SFT=false)")
    evl.set_defaults(func=cmd_eval)
    ses = sub.add_parser("sessions", help="list or show logged research sessions")
    ses_sub = ses.add_subparsers(dest="action", required=True)
    lst = ses_sub.add_parser("list")
    lst.add_argument("--limit", type=int, default=20)
    lst.add_argument("--status", choices=["running", "completed", "failed"])
    lst.add_argument("--source", action="append", choices=list(get_args(SessionSource)),
                     help="only sessions from this source (repeatable): chat, cli, batch, api, eval (benchmark runs), "
                     "probe (promotion-gate probes), rollout")
    lst.add_argument("--user", nargs="?", const="", help="only this person's sessions; without a name, the number "
                     "of sessions per person")
    show = ses_sub.add_parser("show")
    show.add_argument("session_id")
    show.add_argument("--turns", action="store_true", help="print every turn")
    ses.set_defaults(func=cmd_sessions)
    cli_resume.add_parsers(sub, ses_sub)
    cli_bank.add_parsers(sub)
    cli_train.add_parsers(sub)
    cli_sft.add_parsers(sub)
    cli_deeprubric.add_parsers(sub)
    cli_loop.add_parsers(sub)
    cli_batch.add_parsers(sub)
    cli_ui.add_parsers(sub)
    cli_mcp.add_parsers(sub)
    cli_users.add_parsers(sub)
    cli_policy_server.add_parsers(sub)
    return p


class OutputPathError(AgentError):
    """An output file given on the command line cannot be written."""


def _settings_error(exc: ValidationError) -> str:
    # Never str(exc): pydantic echoes the input values, which may include API keys.
    parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_input=False)]
    return "invalid setting or option: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rubricem` console script."""
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValidationError as exc:
        print(f"error: {_settings_error(exc)}", file=sys.stderr)
        return 2
    except (InputError, IngestError, SessionNotFound, BankItemNotFound, InvalidInput, ConfigurationError,
            OutputPathError, RegistryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CycleLocked as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # command-line values the parser cannot check (e.g. retrain without --now)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except LearningError as exc:  # dataset/benchmark problems are bad input; judge failures are run failures
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        bad_input = type(exc).__module__.startswith("learning.eval") or isinstance(exc, ValueError)
        return 2 if bad_input else 1
    except (AgentError, StoreError, DocIndexError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
