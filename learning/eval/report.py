"""Evaluation outputs: the per-item JSONL (appended as items finish, read back for resuming), summary.json, a
Markdown summary table with tokens and cost, a PNG plot (matplotlib, Agg backend, imported only when a plot is drawn),
and for an evaluation over several seeds each metric's mean ± standard deviation."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.accounting import format_cost

_log = logging.getLogger(__name__)

MAX_TABLE_ITEMS = 50  # rows of the per-item table in summary.md (the JSONL has them all)


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line and flush it to disk, so a crash loses at most the item in progress."""
    line = json.dumps(record, ensure_ascii=False, default=str)
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_records(path: Path) -> dict[str, dict[str, Any]]:
    """The records of an items.jsonl by item id (a later line for the same id wins).

    A line that does not parse (a write cut short by a crash) is skipped with a warning; its item is simply run
    again.
    """
    out: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return out
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            _log.warning("%s line %d is not valid JSON (an interrupted write?); that item will be run again", path, n)
            continue
        if isinstance(rec, dict) and isinstance(rec.get("id"), str):
            out[rec["id"]] = rec
    return out


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON atomically (temp file, then rename)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "" if value is None else str(value)


def _cell(text: Any, limit: int = 80) -> str:
    s = " ".join(_fmt(text).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def _tokens(t: Mapping[str, Any] | None, side: str) -> str:
    """'1234 / 56': the prompt and sampled (completion) tokens of the policy or the judge; '' without figures."""
    if not t:
        return ""
    out = "policy_sampled" if side == "policy" else "judge_completion"
    return f"{t.get(f'{side}_prompt', 0)} / {t.get(out, 0)}"


def usage_lines(summary: Mapping[str, Any]) -> list[str]:
    """The tokens and cost rows of a summary's facts table (empty for a summary written before they existed)."""
    t, c = summary.get("tokens"), summary.get("cost_usd")
    if not t or not c:
        return []
    tokens = (f"| Tokens (in / out) | policy {_tokens(t, 'policy')} over {t.get('policy_calls', 0)} calls; judge "
              f"{_tokens(t, 'judge')} ({t.get('items', 0)} completed items) |")
    spent = (f"| Cost | {format_cost(c.get('total'))} (policy `{summary.get('policy_model', '')}` "
             f"{format_cost(c.get('policy'))}, judge {format_cost(c.get('judge'))}) |")
    return [tokens, spent]


def summary_markdown(summary: Mapping[str, Any], records: Sequence[Mapping[str, Any]], plot_name: str) -> str:
    """The human-readable summary: run facts (tokens and cost included), the metric table and the first items."""
    judge = summary.get("judge_model") or "none (no LLM grading)"
    lines = [
        f"# Evaluation: {summary['bench']}",
        "",
        "| | |",
        "|---|---|",
        f"| Data | `{summary['data_dir']}` |",
        (
            f"| Items | {summary['n']} (scored {summary['n_scored']}, run failed {summary['n_failed']}, "
            f"judge failed {summary['n_judge_failed']}) |"
        ),
        f"| Policy version | `{summary['policy_version']}` |",
        f"| Judge | {judge} |",
        f"| Rubric-bank injection | {summary['injection']} |",
        f"| Answer format | {summary['format']} |",
        *usage_lines(summary),
        "",
        *([f"> **Note.** {summary['note']}", ""] if summary.get("note") else []),
        "## Metrics",
        "",
        "Means over the items scored; items whose run failed are counted in `run failed`, not scored as 0.",
        "",
        "| metric | value | items |",
        "|---|---:|---:|",
    ]
    counts = summary.get("metric_counts", {})
    lines += [f"| {k} | {_fmt(v)} | {counts.get(k, '')} |" for k, v in summary["metrics"].items()]
    if not summary["metrics"]:
        lines.append("| (no scored items) | | |")
    primary = summary.get("primary_metric", "")
    lines += [
        "",
        f"![{summary['bench']} plot]({plot_name})",
        "",
        f"## Items (first {MAX_TABLE_ITEMS})",
        "",
        f"| id | status | {primary} | policy tokens in / out | judge tokens in / out | cost | answer | error |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for rec in records[:MAX_TABLE_ITEMS]:
        metrics = rec.get("metrics") or {}
        tokens = rec.get("tokens")
        spent = format_cost((rec.get("cost_usd") or {}).get("total")) if tokens else ""
        lines.append(
            f"| {_cell(rec['id'], 48)} | {rec.get('status', '')} | {_fmt(metrics.get(primary))} | "
            f"{_tokens(tokens, 'policy')} | {_tokens(tokens, 'judge')} | {spent} | "
            f"{_cell(rec.get('prediction') or rec.get('answer') or '')} | "
            f"{_cell(rec.get('error') or rec.get('judge_error') or '')} |"
        )
    return "\n".join(lines) + "\n"


def mean_std_text(mean: float, std: float | None) -> str:
    """'0.5000 ± 0.7071', or the mean alone when there is no deviation (one run)."""
    return _fmt(float(mean)) if std is None else f"{mean:.4f} ± {std:.4f}"


def spread_markdown(spread: Mapping[str, Any]) -> str:
    """The summary of an evaluation over several seeds: each metric's mean ± sample standard deviation over the
    runs, then one row per run (its seed, counts, primary metric, tokens and cost)."""
    judge = spread.get("judge_model") or "none (no LLM grading)"
    runs = spread["runs"]
    primary = spread.get("primary_metric", "")
    lines = [
        f"# Evaluation: {spread['bench']}, {len(runs)} runs",
        "",
        "| | |",
        "|---|---|",
        f"| Data | `{spread['data_dir']}` |",
        f"| Runs | {len(runs)}, seeds {', '.join(str(s) for s in spread['seeds'])}; {spread['n']} items each |",
        f"| Items, all runs | scored {spread['n_scored']}, run failed {spread['n_failed']} |",
        f"| Policy version | `{spread['policy_version']}` |",
        f"| Judge | {judge} |",
        f"| Rubric-bank injection | {spread['injection']} |",
        f"| Answer format | {spread['format']} |",
        *usage_lines(spread),
        "",
        *([f"> **Note.** {spread['note']}", ""] if spread.get("note") else []),
        "## Metrics",
        "",
        "Mean over the runs of each run's metric, ± the sample standard deviation over the runs (n − 1).",
        "",
        "| metric | mean ± std | runs |",
        "|---|---:|---:|",
    ]
    stds, counts = spread.get("metrics_std", {}), spread.get("metric_runs", {})
    lines += [f"| {k} | {mean_std_text(v, stds.get(k))} | {counts.get(k, '')} |" for k, v in spread["metrics"].items()]
    if not spread["metrics"]:
        lines.append("| (no scored items) | | |")
    header = (f"| run | seed | scored | failed | {primary} | policy tokens in / out | judge tokens in / out | cost "
              "| folder |")
    lines += ["", "## Runs", "", header, "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        lines.append(
            f"| {r['run']} | {r['seed']} | {r['n_scored']} | {r['n_failed']} | {_fmt(r['metrics'].get(primary))} | "
            f"{_tokens(r.get('tokens'), 'policy')} | {_tokens(r.get('tokens'), 'judge')} | "
            f"{format_cost((r.get('cost_usd') or {}).get('total'))} | `{r['out_dir']}` |"
        )
    return "\n".join(lines) + "\n"


UNBOUNDED = ("seconds", "self_citations")  # per-item means not on a 0-1 scale: in the tables, not the bar charts

COMPARED = ("em", "f1", "cover_em", "support_recall", "self_tagged_stages", "valid_tool_calls", "has_self_citation",
            "self_citations", "seconds")


def write_comparison(md_path: Path, png_path: Path, title: str, runs: Mapping[str, Mapping[str, Any]]) -> None:
    """A table and a grouped bar chart of several evaluations of one benchmark (e.g. the agent beside vanilla RAG).

    `runs` maps a label to that run's summary dict (`EvalSummary.to_dict()`).
    """
    keys = [k for k in COMPARED if any(k in (r.get("metrics") or {}) for r in runs.values())]
    lines = [f"# {title}", "", "| run | n | " + " | ".join(keys) + " | cost |",
             "|---|---:|" + "---:|" * (len(keys) + 1)]
    for label, r in runs.items():
        m, sd = r.get("metrics") or {}, r.get("metrics_std") or {}  # an evaluation over seeds: mean ± std
        cells = ["" if m.get(k) is None else mean_std_text(m[k], sd.get(k)) if sd else _fmt(m.get(k)) for k in keys]
        spent = format_cost((r.get("cost_usd") or {}).get("total")) if r.get("cost_usd") else ""
        seeds = f", {len(r['seeds'])} runs" if r.get("seeds") else ""
        lines.append(f"| {label} ({r.get('policy_version', '')}{seeds}) | {r.get('n_scored', r.get('n', ''))} | "
                     + " | ".join(cells) + f" | {spent} |")
    md_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bounded = [k for k in keys if k not in UNBOUNDED]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    try:
        width = 0.8 / max(1, len(runs))
        for n, (label, r) in enumerate(runs.items()):
            m = r.get("metrics") or {}
            xs = [i + n * width for i in range(len(bounded))]
            ax.bar(xs, [float(m.get(k) or 0.0) for k in bounded], width, label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(bounded))], bounded, rotation=20, fontsize=8)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8)
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(png_path, dpi=100)
    finally:
        plt.close(fig)


def write_plot(path: Path, title: str, metrics: Mapping[str, float], primary: str, per_item: Sequence[float]) -> Path:
    """A PNG with the metric means (bars) and the distribution of the primary metric over items (histogram)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    try:
        names = [k for k in metrics if k not in UNBOUNDED]
        if names:
            values = [metrics[k] for k in names]
            left.barh(names, values, color="#4C72B0")
            left.set_xlim(min(0.0, *values), max(1.0, *values))
            left.invert_yaxis()
            for y, v in enumerate(values):
                left.text(v, y, f" {v:.3f}", va="center", fontsize=8)
        else:
            left.text(0.5, 0.5, "no scored items", ha="center", va="center", transform=left.transAxes)
        left.set_title("metric means")
        if per_item:
            lo, hi = min(0.0, *per_item), max(1.0, *per_item)
            right.hist(per_item, bins=10, range=(lo, hi), color="#55A868", edgecolor="white")
        else:
            right.text(0.5, 0.5, "no scored items", ha="center", va="center", transform=right.transAxes)
        right.set_title(f"per-item {primary} (n={len(per_item)})")
        right.set_xlabel(primary)
        right.set_ylabel("items")
        right.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
