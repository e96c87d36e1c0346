"""Build statistics like METHOD §11.5's table, computed from the files of a build (so they always match them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from learning.deeprubric.llm import sum_ledgers


def _mean(values: Sequence[float]) -> float:
    return round(fmean(values), 2) if values else 0.0


def compute_stats(trees: Sequence[Mapping[str, Any]], audits: Sequence[Mapping[str, Any]],
                  pairs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Statistics of a build from its tree, audit and pair records (the JSONL lines)."""
    nodes = [len(t["tree"]["nodes"]) for t in trees]
    n_leaves = [len(t["leaves"]) for t in trees]
    counts: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    for t in trees:
        counts.update(t["tree"].get("counts", {}))
        stops.update(n["stop"] for n in t["tree"]["nodes"] if n.get("stop"))
    decisions = Counter(a["decision"] for a in audits)
    dropped = Counter(a.get("reason", "") for a in audits if a["decision"] == "DROP")
    skipped = Counter(a.get("reason", "") for a in audits if a["decision"] == "SKIP")
    dims = Counter(p["dimension"] for a in audits for p in a.get("problems", ()))
    kinds = Counter(r["type"] for p in pairs for r in p["rubrics"])
    total_rubrics = sum(kinds.values())
    modes = sorted({t["mode"] for t in trees} | {p["mode"] for p in pairs})
    ledgers = [r["llm"] for r in (*trees, *audits) if isinstance(r.get("llm"), Mapping)]
    models = sorted({str(r["model"]) for r in (*trees, *audits, *pairs) if r.get("model")})
    llm = {"llm": {"models": models, **sum_ledgers(ledgers)}} if ledgers or models else {}
    return {
        "mode": modes[0] if len(modes) == 1 else modes,
        "trees": len(trees),
        "nodes_per_tree": _mean(nodes),
        "leaves_per_tree": _mean(n_leaves),
        "statements_kept": sum(len(n["statements"]) for t in trees for n in t["tree"]["nodes"]),
        "duplicate_statements_removed": counts["duplicate_statements"],
        "ungrounded_statements_removed": counts["ungrounded_statements"],
        "empty_retrievals": counts["empty_retrievals"],
        "rejected_sub_queries": counts["rejected_children"],
        "stop_reasons": dict(sorted(stops.items())),
        "pairs_audited": sum(decisions[d] for d in ("KEEP", "REVISE", "DROP")),
        "pairs_kept": len(pairs),
        "selected_leaves_per_pair": _mean([len(p["selected_leaf_ids"]) for p in pairs]),
        "rubrics_per_pair": _mean([len(p["rubrics"]) for p in pairs]),
        "rubrics": {"factual": kinds["factual"], "logical": kinds["logical"]},
        "factual_share": round(kinds["factual"] / total_rubrics, 4) if total_rubrics else 0.0,
        "logical_share": round(kinds["logical"] / total_rubrics, 4) if total_rubrics else 0.0,
        "audit": {d: decisions[d] for d in ("KEEP", "REVISE", "DROP")},
        "dropped_by_reason": dict(sorted(dropped.items())),
        "trees_skipped_by_reason": dict(sorted(skipped.items())),
        "problems_by_dimension": dict(sorted(dims.items())),
        **llm,  # the LLM mode only: requests, tokens, repairs, failures and drops of its steps
    }


def stats_markdown(s: Mapping[str, Any]) -> str:
    """The statistics as a Markdown table in the shape of METHOD §11.5."""
    audit = s["audit"]
    rows = [
        ("mode", str(s["mode"])),
        ("evidence trees", f"{s['trees']:,}"),
        ("nodes / leaves per tree (mean)", f"{s['nodes_per_tree']} / {s['leaves_per_tree']}"),
        ("selected leaves per retained example", f"{s['selected_leaves_per_pair']}"),
        ("query–rubric pairs retained", f"**{s['pairs_kept']:,}**"),
        ("rubric criteria per example", f"{s['rubrics_per_pair']}"),
        ("factual / logical rubrics", f"{100 * s['factual_share']:.1f}% / {100 * s['logical_share']:.1f}%"),
        ("audit KEEP / REVISE / DROP", f"{audit['KEEP']} / {audit['REVISE']} / {audit['DROP']}"),
        ("dropped, by reason", _counts(s["dropped_by_reason"])),
        ("trees without a pair, by reason", _counts(s["trees_skipped_by_reason"])),
        ("duplicate / ungrounded statements removed",
         f"{s['duplicate_statements_removed']} / {s['ungrounded_statements_removed']}"),
        ("empty retrievals / rejected sub-queries", f"{s['empty_retrievals']} / {s['rejected_sub_queries']}"),
    ]
    if (llm := s.get("llm")) is not None:
        rows += [
            ("LLM model", ", ".join(llm["models"]) or "?"),
            ("LLM requests (cached) / prompt + completion tokens",
             f"{llm['requests']:,} ({llm['cached']:,}) / {llm['prompt_tokens']:,} + {llm['completion_tokens']:,}"),
            ("LLM step calls, by step", _counts(llm["steps"])),
            ("LLM answers repaired, by step", _counts(llm["repaired"])),
            ("LLM step failures after repair, by reason", _counts(llm["failures"])),
            ("LLM items dropped, by reason", _counts(llm["dropped"])),
        ]
    lines = ["| Statistic | Value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(["# DeepRubric build statistics", "", *lines, ""])


def _counts(c: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in c.items()) or "none"


__all__ = ["compute_stats", "stats_markdown"]
