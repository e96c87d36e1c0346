"""The evaluation runner: each benchmark item goes through `ResearchService.run` (rubric-bank injection off by
default, METHOD D10), is scored with the benchmark's own method, gets its tokens and cost (learning/eval/usage.py) and
is appended to `items.jsonl`; then summary.json, summary.md and plot.png are written. Reruns resume: ids already in
items.jsonl are skipped. `run_eval_seeds` repeats the whole evaluation over N seeds, one `run-K/` folder each, and
writes each metric's mean and standard deviation over the runs (learning/eval/spread.py)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from agent.accounting import PriceTable
from agent.config import RunOptions
from agent.protocols import PolicyClient
from agent.report import Report
from learning.errors import JudgeError
from learning.eval import report as rep
from learning.eval import scoring
from learning.eval.compliance import compliance
from learning.eval.datasets import BenchSpec, EvalError, EvalItem, bench_spec, load_benchmark
from learning.eval.spread import metric_spread
from learning.eval.usage import add_totals, item_usage, policy_model, total_usage
from learning.judge.types import JsonJudge, Usage
from store.records import Trajectory

_log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]
RunProgress = Callable[[int, int, int, str], None]  # (run, done, total, item_id), runs counted from 1

COMPLIANCE_METRICS = ("self_tagged_stages", "valid_tool_calls", "self_citations", "has_self_citation")
ITEMS_FILE, SUMMARY_JSON, SUMMARY_MD, PLOT_FILE, MANIFEST_FILE = (
    "items.jsonl", "summary.json", "summary.md", "plot.png", "run.json",
)  # fmt: skip
RUN_DIR = "run-{}"  # the K-th run of `run_eval_seeds`, counted from 1


class ResearchOutcome(Protocol):
    """What a completed run gives back (app.service.ResearchOutcome has this shape)."""

    session_id: str
    trajectory: Trajectory
    report: Report
    policy_version: str
    seconds: float


class ResearchService(Protocol):
    """The research service the runner drives (app.service.ResearchService; learning must not import app)."""

    policy: PolicyClient

    async def run(self, question: str, options: RunOptions | None = None, *, source: str = "api") -> ResearchOutcome:
        """Research one question (the runner passes source="eval"); raises on a failed run."""
        ...


class JudgeRequiredError(EvalError):
    """The benchmark is scored by an LLM grader and no judge endpoint is configured."""


class EvalOutputConflict(EvalError):
    """The output folder holds results of a different evaluation (another benchmark, policy or injection mode)."""


@dataclass(frozen=True, slots=True)
class EvalSummary:
    """The outcome of an evaluation run (also written to summary.json)."""

    bench: str
    n: int  # items selected (after --limit)
    n_scored: int  # runs that completed and have the primary metric (for rubric benchmarks: were graded)
    n_failed: int  # runs that failed (recorded with their error)
    n_judge_failed: int  # runs that completed but whose LLM grading failed (no score, never a silent 0)
    metrics: dict[str, float]
    metric_counts: dict[str, int]
    primary_metric: str
    policy_version: str
    judge_model: str | None
    injection: str  # "off" (paper protocol, D10) or "on"
    format: str
    data_dir: str
    grader_prompt_version: str | None
    judge_usage: dict[str, Any]
    policy_model: str  # the policy's name in the price table ("embedded" for the in-process one)
    tokens: dict[str, int]  # summed over the completed items (usage.TOKEN_KEYS; `items`: how many)
    cost_usd: dict[str, float | None]  # policy, judge, total; None: unknown (a model the price table does not list)
    out_dir: Path
    items_path: Path
    summary_json: Path
    summary_md: Path
    plot_path: Path
    note: str = ""  # e.g. that the scores are an offline approximation

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as strings)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def _manifest(
    spec: BenchSpec, data_dir: Path, policy_version: str, judge: JsonJudge | None, injection: str, options: RunOptions
) -> dict[str, Any]:
    return {
        "bench": spec.name, "data_dir": str(Path(data_dir).resolve()), "policy_version": policy_version,
        "judge_model": judge.model if judge is not None else None, "injection": injection,
        "options": options.model_dump(mode="json"),
    }  # fmt: skip


def _check_resume(out_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Refuse to mix results of different evaluations in one folder (results would not be comparable)."""
    path = out_dir / MANIFEST_FILE
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EvalOutputConflict(f"{path}: not valid JSON ({exc}); use a fresh --out folder") from exc
    for key in ("bench", "data_dir", "policy_version", "judge_model", "injection"):
        if old.get(key) != manifest[key]:
            raise EvalOutputConflict(
                f"{out_dir} holds an evaluation with {key}={old.get(key)!r}, this run has {manifest[key]!r}; "
                "use another --out folder (or remove it) so results are not mixed"
            )


def _usage_dict(u: Usage) -> dict[str, Any]:
    return u.model_dump()


async def _score(
    spec: BenchSpec, item: EvalItem, outcome: ResearchOutcome, judge: JsonJudge | None, record: dict[str, Any]
) -> None:
    """Fill the record's metrics (and the judge's grade, details and usage). A judge failure is recorded as
    `judge_error` and leaves the judge metrics absent (never a silent 0)."""
    body = outcome.report.body if outcome.report.answer_found else ""
    metrics: dict[str, Any] = {}
    record["metrics"] = metrics
    if spec.kind == "rubric_pairs":
        await _score_rubric_pair(item, outcome, judge, record)
        return
    if spec.kind == "short_form":
        prediction = scoring.extract_prediction(body)
        record["prediction"] = prediction
        metrics.update(scoring.short_form_scores(prediction, item.answers))
        gold_titles = item.metadata.get("supporting_titles")
        if gold_titles:
            retrieved = [s.title for s in outcome.trajectory.snippets.values()]
            metrics["support_recall"] = scoring.support_recall(gold_titles, retrieved)
    if judge is None:
        return
    try:
        if spec.kind == "short_form":
            graded = await scoring.grade_short_form(judge, item, record["prediction"])
        elif spec.kind == "healthbench":
            graded = await scoring.grade_healthbench(judge, item, body)
        elif spec.kind == "deep_research_bench":
            graded = await scoring.grade_race(judge, item, body)
        else:
            graded = await scoring.grade_scholarqa(judge, item, outcome.report.markdown, body)
    except JudgeError as exc:
        record["judge_error"] = f"{type(exc).__name__}: {exc}"
        if exc.usage is not None:  # what the failed grading was still billed (counted in the item's tokens)
            record["judge_failed"] = {"model": judge.model, "usage": _usage_dict(exc.usage)}
        _log.warning("eval %s item %s: grading failed: %s", spec.name, item.id, record["judge_error"])
        return
    metrics.update(graded.metrics)
    record["judge"] = {
        "model": judge.model,
        "grade": graded.grade,
        **graded.details,
        "usage": _usage_dict(graded.usage),
    }


OFFLINE_PAIRS_NOTE = (
    "Approximate: no judge endpoint was configured, so each criterion was scored 0-4 by MiniLM similarity between "
    "the criterion (with its evidence) and the answer's best-matching sentence, not read by a grader."
)


async def _score_rubric_pair(item: EvalItem, outcome: ResearchOutcome, judge: JsonJudge | None,
                             record: dict[str, Any]) -> None:
    """DeepRubric pairs: the §11.6 rubric term (0 when there is no answer), the reward and its other terms."""
    from learning.deeprubric.pairs import PairCriterion, QueryPair
    from learning.deeprubric.scorer import LLMCriterionScorer, OfflineCriterionScorer, score_pair

    pair = QueryPair(item.id, item.question, tuple(
        PairCriterion(c.name, c.group, c.text, c.weight, c.evidence) for c in item.criteria))
    scorer: Any = LLMCriterionScorer(judge) if judge is not None else OfflineCriterionScorer()
    try:
        (breakdown,), group = await score_pair(scorer, pair, [outcome.trajectory])
    except JudgeError as exc:
        record["judge_error"] = f"{type(exc).__name__}: {exc}"
        return
    metrics = record["metrics"]
    metrics.update(breakdown.as_metrics())
    if not breakdown.has_answer:
        metrics["rubric"] = 0.0  # no answer covers no criterion (the reward itself is 0.15·format)
    if group.errors:
        record["judge_error"] = "; ".join(group.errors)
    if breakdown.has_answer and breakdown.rubric is None:  # every criterion failed to score: no silent 0
        metrics.pop("reward", None)
    record["judge"] = {
        "model": scorer.model, "approximate": scorer.approximate,
        "criteria": [{"id": c.id, "type": c.type, "weight": c.weight, "score": s, "criterion": c.description[:300]}
                     for c, s in zip(pair.criteria, group.scores[0], strict=True)],
        "usage": _usage_dict(group.usage),
    }  # fmt: skip


async def _run_item(
    spec: BenchSpec,
    item: EvalItem,
    service: ResearchService,
    options: RunOptions,
    judge: JsonJudge | None,
    injection: str,
    answer_format: str | None = None,
    prices: PriceTable | None = None,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": item.id, "bench": spec.name, "format": answer_format or item.format, "injection": injection,
        "question": item.question, "answers": list(item.answers),
    }  # fmt: skip
    started = time.monotonic()
    try:
        outcome = await service.run(item.question, options.model_copy(update={"format": answer_format or item.format}),
                                    source="eval")
    except Exception as exc:  # noqa: BLE001 - any failed run is recorded and the batch goes on (session marked failed)
        record.update(
            status="failed",
            error=f"{type(exc).__name__}: {exc}",
            session_id=getattr(exc, "session_id", None),
            seconds=round(time.monotonic() - started, 3),
        )
        _log.warning("eval %s item %s: run failed: %s", spec.name, item.id, record["error"])
        return record
    record.update(
        status="ok", session_id=outcome.session_id, policy_version=outcome.policy_version,
        seconds=round(outcome.seconds, 3), tool_calls=len(outcome.trajectory.tool_calls),
        malformed=outcome.trajectory.malformed, answer_found=outcome.report.answer_found,
        answer=outcome.report.body,
    )  # fmt: skip
    await _score(spec, item, outcome, judge, record)
    record["metrics"]["seconds"] = record["seconds"]
    if getattr(outcome, "scaffold", True):  # a baseline has no scaffold to comply with
        figures = compliance(outcome.trajectory)
        record["compliance"] = figures
        record["metrics"].update({k: figures[k] for k in COMPLIANCE_METRICS})
    model = policy_model(service.policy)
    record["policy_model"] = model
    graded = record.get("judge") or record.get("judge_failed")
    record["tokens"], record["cost_usd"] = item_usage(outcome.trajectory, model, graded, prices or {})
    return record


def _summarise(
    spec: BenchSpec,
    items: list[EvalItem],
    records: dict[str, dict[str, Any]],
    manifest: Mapping[str, Any],
    judge: JsonJudge | None,
    out_dir: Path,
) -> EvalSummary:
    chosen = [records[i.id] for i in items if i.id in records]
    ok = [r for r in chosen if r.get("status") == "ok"]
    # Judge-based metrics are simply absent on items whose grading failed, so each mean runs over the items that
    # have that metric (the counts are reported next to it).
    metric_dicts = [r.get("metrics") or {} for r in ok]
    grades = [r["judge"]["grade"] for r in ok if (r.get("judge") or {}).get("grade")]
    metrics = scoring.aggregate(spec.kind, metric_dicts, grades)
    counts: dict[str, int] = {}
    for key in metrics:
        if key.startswith("llm_"):
            counts[key] = len(grades)
        elif spec.kind == "healthbench":
            counts[key] = sum(1 for m in metric_dicts if m.get("score") is not None)
        else:
            counts[key] = sum(1 for m in metric_dicts if m.get(key) is not None)
    primary = scoring.PRIMARY_METRIC[spec.kind]
    per_item = [float(m[primary]) for m in metric_dicts if isinstance(m.get(primary), int | float)]
    # Judge spend, failed gradings included where the error said what they were billed.
    usage = sum((Usage.model_validate((r.get("judge") or r.get("judge_failed") or {}).get("usage") or {})
                 for r in chosen), Usage())
    tokens, costs = total_usage(ok)
    summary = EvalSummary(
        bench=spec.name, n=len(items), n_scored=len(per_item),
        n_failed=sum(1 for r in chosen if r.get("status") != "ok"),
        n_judge_failed=sum(1 for r in ok if "judge_error" in r),
        metrics=metrics, metric_counts=counts, primary_metric=primary,
        policy_version=str(manifest["policy_version"]), judge_model=judge.model if judge is not None else None,
        injection=str(manifest["injection"]),
        format=str(manifest.get("answer_format") or (items[0].format if items else "")),
        data_dir=str(manifest["data_dir"]),
        grader_prompt_version=scoring.grader_prompt_version() if judge is not None else None,
        judge_usage=_usage_dict(usage), policy_model=str(manifest.get("policy_model") or ""), tokens=tokens,
        cost_usd=costs, note=OFFLINE_PAIRS_NOTE if spec.kind == "rubric_pairs" and judge is None else "",
        out_dir=out_dir, items_path=out_dir / ITEMS_FILE, summary_json=out_dir / SUMMARY_JSON,
        summary_md=out_dir / SUMMARY_MD, plot_path=out_dir / PLOT_FILE,
    )  # fmt: skip
    data = {**summary.to_dict(), "written_at": datetime.now(UTC).isoformat(timespec="seconds")}
    rep.write_json(summary.summary_json, data)
    summary.summary_md.write_text(rep.summary_markdown(data, chosen, PLOT_FILE), encoding="utf-8")
    title = (
        f"{spec.name} · n={summary.n_scored} scored · policy {summary.policy_version} · injection {summary.injection}"
    )
    rep.write_plot(summary.plot_path, title, metrics, primary, per_item)
    return summary


async def run_eval(
    bench: str,
    data_dir: Path,
    *,
    service: ResearchService,
    options: RunOptions,
    out_dir: Path,
    limit: int | None = None,
    judge: JsonJudge | None = None,
    progress: Progress | None = None,
    inject_bank: bool = False,
    retry_failed: bool = False,
    answer_format: str | None = None,
    prices: PriceTable | None = None,
) -> EvalSummary:
    """Run the agent on a benchmark and score it with the benchmark's own method.

    Items run one at a time through `service.run` with `options`, except that the answer format is the item's
    (the benchmark's convention) and rubric-bank injection is `inject_bank` (off by default: the papers' protocol,
    METHOD D10); the mode is recorded on every item and in the summary. Each finished item is appended to
    `out_dir/items.jsonl` at once; a rerun skips ids already there (and, with `retry_failed`, reruns the failed ones).

    Args:
        bench: benchmark name (see `learning.eval.datasets.BENCHMARKS`).
        data_dir: the benchmark's data folder (for `shortform`, also a single file).
        service: the research service (policy, tools, session log).
        options: per-run options (token caps, tool budget, temperature, ...).
        out_dir: where items.jsonl, run.json, summary.json, summary.md and plot.png go (created if needed).
        limit: evaluate only the first `limit` items.
        judge: the LLM grader; required by healthbench, deep_research_bench and scholarqa_cs; optional for the
            short-form sets (adds the correct/incorrect/not-attempted grade to EM/F1/cover-EM).
        progress: called as progress(done, total, item_id) after each item (skipped ones included).
        inject_bank: retrieve rubric-bank reflections into prompts (only for the inference-time reuse study).
        retry_failed: rerun items whose earlier run failed instead of keeping the failure.
        answer_format: ask every item in this format instead of the benchmark's (recorded in the manifest).
        prices: the price table (`Settings.prices`) for each item's cost; empty or None: every model costs 0.

    Raises:
        UnknownBenchmarkError, DatasetError: bad benchmark name or data (nothing is run or written).
        JudgeRequiredError: a rubric-scored benchmark without a judge (nothing is run or written).
        EvalOutputConflict: out_dir holds another evaluation's results (or the runs of `run_eval_seeds`).
    """
    spec = bench_spec(bench)
    items = load_benchmark(spec.name, data_dir, limit)
    if spec.needs_judge and judge is None:
        raise JudgeRequiredError(
            f"{spec.name} is scored by an LLM grader: configure a judge endpoint "
            "(RUBRICEM_LEARNING__JUDGE__BASE_URL and RUBRICEM_LEARNING__JUDGE__MODEL) and pass it as `judge`"
        )
    injection = "on" if inject_bank else "off"
    run_options = options.model_copy(update={"inject_bank": inject_bank})
    manifest = _manifest(spec, Path(data_dir), service.policy.policy_version, judge, injection, run_options)
    if answer_format:
        manifest["answer_format"] = answer_format
    manifest["policy_model"] = policy_model(service.policy)
    out_dir = Path(out_dir)
    if (out_dir / RUN_DIR.format(1)).is_dir():
        raise EvalOutputConflict(f"{out_dir} holds an evaluation over several seeds (--runs); give the same --runs, "
                                 "or use another --out folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_resume(out_dir, manifest)
    rep.write_json(out_dir / MANIFEST_FILE, manifest)

    items_path = out_dir / ITEMS_FILE
    records = rep.read_records(items_path)
    for done, item in enumerate(items, 1):
        old = records.get(item.id)
        if old is None or (retry_failed and old.get("status") != "ok"):
            record = await _run_item(spec, item, service, run_options, judge, injection, answer_format, prices)
            record["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
            rep.append_record(items_path, record)
            records[item.id] = record
        if progress is not None:
            progress(done, len(items), item.id)
    return _summarise(spec, items, records, manifest, judge, out_dir)


@dataclass(frozen=True, slots=True)
class EvalSpread:
    """An evaluation repeated over several seeds (`run_eval_seeds`; also written to the top-level summary.json)."""

    bench: str
    seeds: list[int]
    runs: list[EvalSummary]  # in seed order; run K's files are in out_dir/run-K/
    metrics: dict[str, float]  # each metric's mean over the runs' means
    metrics_std: dict[str, float | None]  # its sample standard deviation over the runs (n - 1); None from one run
    metric_runs: dict[str, int]  # how many runs have the metric
    primary_metric: str
    policy_version: str
    policy_model: str
    judge_model: str | None
    injection: str
    format: str
    data_dir: str
    n: int  # items per run
    n_scored: int  # scored items, all runs together
    n_failed: int  # failed runs of items, all runs together
    tokens: dict[str, int]  # summed over all runs
    cost_usd: dict[str, float | None]  # summed over all runs; None: unknown
    out_dir: Path
    summary_json: Path
    summary_md: Path
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the spread, and per run its seed, folder, counts, metrics, tokens and cost."""
        data = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "runs"}
        data = {k: (str(v) if isinstance(v, Path) else v) for k, v in data.items()}
        data["runs"] = [
            {"run": n, "seed": seed, "out_dir": str(s.out_dir), "n_scored": s.n_scored, "n_failed": s.n_failed,
             "n_judge_failed": s.n_judge_failed, "metrics": s.metrics, "tokens": s.tokens, "cost_usd": s.cost_usd}
            for n, (seed, s) in enumerate(zip(self.seeds, self.runs, strict=True), 1)
        ]  # fmt: skip
        return data


def _check_seed(run_dir: Path, seed: int) -> None:
    """A run folder resumes only the seed it was run with (its items would otherwise mix two seeds)."""
    path = run_dir / MANIFEST_FILE
    if not path.is_file():
        return
    try:
        old = (json.loads(path.read_text(encoding="utf-8")).get("options") or {}).get("seed")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise EvalOutputConflict(f"{path}: not a run manifest ({exc}); use a fresh --out folder") from exc
    if old != seed:
        raise EvalOutputConflict(f"{run_dir} was run with seed {old}, this run has seed {seed}; give the same "
                                 "--seed, or use another --out folder")


async def run_eval_seeds(
    bench: str,
    data_dir: Path,
    *,
    runs: int,
    service: ResearchService,
    options: RunOptions,
    out_dir: Path,
    progress: RunProgress | None = None,
    **kwargs: Any,
) -> EvalSpread:
    """`run_eval` `runs` times over the seeds `options.seed`, +1, +2, ... (0, 1, ... when no seed is set), run K
    into `out_dir/run-K/` (its own items.jsonl, summary and plot, resumed like a single run), then each metric's mean
    and sample standard deviation over the runs into `out_dir/summary.json` and `summary.md`.

    A rerun with more runs resumes the finished ones and adds the rest; a run folder refuses another seed, and a
    folder holding a single run (`run_eval`'s layout) refuses to hold runs. `kwargs` go to `run_eval` (limit,
    judge, inject_bank, retry_failed, answer_format, prices).

    Raises:
        ValueError: runs < 1.
        EvalOutputConflict: as `run_eval`, and for the two layout cases above.
    """
    if runs < 1:
        raise ValueError("--runs must be at least 1")
    out_dir = Path(out_dir)
    if (out_dir / MANIFEST_FILE).is_file():
        raise EvalOutputConflict(f"{out_dir} holds a single evaluation run (no --runs); use another --out folder")
    base = options.seed if options.seed is not None else 0
    seeds = [base + k for k in range(runs)]
    summaries: list[EvalSummary] = []
    for k, seed in enumerate(seeds, 1):
        run_dir = out_dir / RUN_DIR.format(k)
        _check_seed(run_dir, seed)
        summaries.append(await run_eval(bench, data_dir, service=service, options=options.model_copy(
            update={"seed": seed}), out_dir=run_dir, progress=_run_tick(progress, k), **kwargs))
    return _write_spread(summaries, seeds, out_dir)


def _run_tick(progress: RunProgress | None, run: int) -> Progress | None:
    if progress is None:
        return None
    return lambda done, total, item_id: progress(run, done, total, item_id)


def _write_spread(summaries: list[EvalSummary], seeds: list[int], out_dir: Path) -> EvalSpread:
    means, stds, counts = metric_spread([s.metrics for s in summaries])
    tokens, costs = add_totals((s.tokens, s.cost_usd) for s in summaries)
    first = summaries[0]
    spread = EvalSpread(
        bench=first.bench, seeds=seeds, runs=summaries, metrics=means, metrics_std=stds, metric_runs=counts,
        primary_metric=first.primary_metric, policy_version=first.policy_version, policy_model=first.policy_model,
        judge_model=first.judge_model, injection=first.injection, format=first.format, data_dir=first.data_dir,
        n=first.n, n_scored=sum(s.n_scored for s in summaries), n_failed=sum(s.n_failed for s in summaries),
        tokens=tokens, cost_usd=costs, out_dir=out_dir, summary_json=out_dir / SUMMARY_JSON,
        summary_md=out_dir / SUMMARY_MD, note=first.note,
    )  # fmt: skip
    data = {**spread.to_dict(), "written_at": datetime.now(UTC).isoformat(timespec="seconds")}
    rep.write_json(spread.summary_json, data)
    spread.summary_md.write_text(rep.spread_markdown(data), encoding="utf-8")
    return spread
