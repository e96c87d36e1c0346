"""Benchmark (not a test): verified citations (issue 48) on the held-out questions that have gold passages.

Each of the 32 held-out questions with gold passages (learning/eval/heldout.py) is researched once by the product's
default policy (SmolLM2-135M + the shipped SFT adapter, llama.cpp), at the learning curve's budgets (stage caps
352/128/224/160, 2 tool calls, 3 snippets of 300 characters, temperature 0.8, the curve's sampling seed of sample 0).
The service runs with `attribute_uncited` and `verify_citations` off, so each session's report is the model's own;
then, on the same session, the report before (`build_report`) and after the support check (`verify_report`) are
scored with the held-out figures (recomputed from the stored session at every report, so a change to the check needs
no new sessions):

- citation precision against gold (the share of the report's references that are gold passages; 0 when it cites
  nothing), per question, after − before: mean, 95 % bootstrap interval, sign-flip p (learning/eval/curve.py);
- the share of cited claims the check finds unsupported, before, and after (marked claims over all claims);
- every claim the check changed (re-attributed or unsupported) goes to `labels.jsonl` with its sentence and the
  passage it cited, for a reader to label `reader_keeps` (true: the cited passage does support the sentence, so the
  check dropped a claim a reader would keep). `--report-only` then adds the false-drop rate over the labelled rows.

    .venv/bin/python tests/benchmarks/citation_support.py --out docs/citations
    .venv/bin/python tests/benchmarks/citation_support.py --out docs/citations --report-only   # after labelling

Sessions are resumable: a question already in `sessions.jsonl` is not run again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from agent.config import RunOptions, StageTokenCaps  # noqa: E402
from agent.report import Report, attribute_report, build_report, verify_report  # noqa: E402
from agent.support import support_matrix  # noqa: E402
from learning.eval.curve import paired, sign_flip_p  # noqa: E402
from learning.eval.heldout import load_heldout, session_figures  # noqa: E402
from store.embeddings import embed_texts  # noqa: E402
from store.records import PromptRecord, Snippet, ToolCallRecord, Trajectory  # noqa: E402

CAPS = StageTokenCaps(plan=352, research=128, review=224, answer=160)  # the learning curve's (docs/learning_curve)


def _settings(data: Path) -> Any:
    from app.settings import Settings

    from app.container import SHIPPED_SFT_ADAPTER

    s = Settings()
    converted = ROOT / ".cache" / "models" / "smollm2-135m-instruct"  # `make install` converted it: no second copy
    agent = s.agent.model_copy(update={
        "attribute_uncited": False, "verify_citations": False, "local_search_k": 3, "snippet_chars": 300,
        **({"embedded_model_path": converted, "embedded_adapter_path": SHIPPED_SFT_ADAPTER}
           if (converted / "config.json").is_file() else {})})
    return s.model_copy(update={"agent": agent, "store": s.store.model_copy(update={"data_dir": data})})


async def run_sessions(out: Path, limit: int, samples: int) -> None:
    from app.container import build
    from learning_curve import sampling_seed  # the curve's seeds, so its sessions and these are the same draws

    items = [i for i in load_heldout() if i.gold_titles][: limit or None]
    path = out / "sessions.jsonl"
    done = {(r["item"], r.get("sample", 0)) for r in map(json.loads, path.read_text().splitlines())} \
        if path.exists() else set()
    todo = [(i, s) for s in range(samples) for i in items if (i.id, s) not in done]
    if not todo:
        return
    data = Path(tempfile.mkdtemp(prefix="citations-"))
    services = build(_settings(data), say=lambda *_: None, progress=None)
    try:
        for n, (item, sample) in enumerate(todo, 1):
            began = time.perf_counter()
            opts = RunOptions(format=item.format, max_tool_calls=2, temperature=0.8,
                              seed=sampling_seed(item.id, sample), wall_clock_s=3600, token_caps=CAPS,
                              inject_bank=False)
            try:
                result = await services.research.run(item.question, opts, source="eval")
            except Exception as exc:  # noqa: BLE001 - recorded, the question counts with no report
                row = {"item": item.id, "error": f"{type(exc).__name__}: {exc}"}
            else:
                row = session_row(item, result.trajectory)
            row["sample"], row["seconds"] = sample, round(time.perf_counter() - began, 1)
            with path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            print(f"[{n}/{len(todo)}] {item.id} #{sample}: {row['seconds']} s", file=sys.stderr, flush=True)
    finally:
        await services.policy.aclose()


def session_row(item: Any, traj: Any) -> dict[str, Any]:
    """What the figures are computed from (again, with the current check, at every report): the report as the
    model wrote it, and every passage the session retrieved."""
    raw = build_report(traj)
    return {"item": item.id, "question": item.question, "body": raw.body, "answer_found": raw.answer_found,
            "references": [s.id for s in raw.references],
            "snippets": {s.id: {"tool": s.tool, "title": s.title, "text": s.text, "url": s.url}
                         for s in traj.snippets.values()}}


def scored(row: dict[str, Any], items: dict[str, Any]) -> dict[str, Any]:
    """The stored session's figures before and after the support check, and its claims with their passages."""
    item = items[row["item"]]
    snippets = {i: Snippet(i, v["tool"], v["title"], v["text"], v["url"]) for i, v in row["snippets"].items()}
    traj = Trajectory(session_id=row["item"], question=row["question"],
                      prompt=PromptRecord(text="", token_ids=(), prompt_sha=""), turns=(),
                      tool_calls=(ToolCallRecord(tool="local_search", query="", snippets=tuple(snippets.values())),))
    raw = Report("", row["body"], tuple(snippets[i] for i in row["references"]), 0, row["answer_found"])
    checked = verify_report(raw, traj, embed_texts)
    gold = {t.casefold() for t in item.gold_titles}
    claims = []
    for c in checked.support.claims if checked.support else ():
        cited_score = float(support_matrix([c.text], [snippets[i] for i in c.cited], embed_texts).max())
        claims.append({**c.as_dict(), "cited_score": round(cited_score, 3), "cited_passages": [
            {"id": i, "title": snippets[i].title, "text": snippets[i].text,
             "gold": snippets[i].title.casefold() in gold}
            for i in c.cited], "kept_titles": [snippets[i].title for i in c.kept]})
    matched = attribute_report(raw, traj, embed_texts)  # what the product does first to an uncited answer
    return {**row, "before": session_figures(item, traj, raw), "after": session_figures(item, traj, checked),
            "matched": session_figures(item, traj, matched),
            "matched_checked": session_figures(item, traj, verify_report(matched, traj, embed_texts)),
            "body_after": checked.body, "claims": claims}


def write_labels(out: Path, rows: list[dict[str, Any]]) -> None:
    """Every claim, for a reader to label `reader_keeps` (does the passage it cited support it?); labels survive a
    rerun (keyed by item, sample and sentence)."""
    path = out / "labels.jsonl"
    old = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            old[(r["item"], r.get("sample", 0), r["text"], tuple(p["title"] for p in r["cited"]))] = \
                r.get("reader_keeps")
    lines = []
    for row in rows:
        for c in row.get("claims", []):
            key = (row["item"], row.get("sample", 0), c["text"], tuple(p["title"] for p in c["cited_passages"]))
            lines.append({"item": row["item"], "sample": row.get("sample", 0), "text": c["text"],
                          "status": c["status"], "score": c["score"], "cited_score": c["cited_score"],
                          "cited": [{"title": p["title"], "text": p["text"]} for p in c["cited_passages"]],
                          "now_cites": c["kept_titles"], "reader_keeps": old.get(key)})
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")


def calibration(labelled: list[dict[str, Any]]) -> dict[str, Any]:
    """The check's verdict on the cited passage (support >= threshold) against the reader's, over the labelled
    claims, at the thresholds around SUPPORT_MIN: precision and recall of "unsupported" (the drops), and the
    false-drop rate (drops the reader would keep)."""
    out = {}
    for t in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6):
        drop = [x for x in labelled if x["cited_score"] < t]
        bad = [x for x in labelled if not x["reader_keeps"]]
        hit = sum(1 for x in drop if not x["reader_keeps"])
        out[str(t)] = {"drops": len(drop), "precision": round(hit / len(drop), 3) if drop else None,
                       "recall": round(hit / len(bad), 3) if bad else None,
                       "false_drop_rate": round((len(drop) - hit) / len(drop), 3) if drop else None}
    return out


def pipeline(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """Gold citation precision and recall of the report at each step the product takes (`ResearchService`): as
    written (`before`), with an uncited answer's sentences matched to passages (`matched`, `attribute_report`, which
    predates the check), and then checked (`matched_checked`, what the product shows now); each step against the
    one before it and the model's own, per question."""
    def records(side: str) -> list[dict[str, Any]]:
        return [{"item": r["item"], "figures": r[side]} for r in ok]

    sides = ("before", "matched", "matched_checked")
    return {
        "mean": {side: {f: round(statistics.fmean(r[side][f] or 0.0 for r in ok), 4) if ok else None
                        for f in ("citation_precision", "citation_recall")} for side in sides},
        "matched_minus_before": paired(records("before"), records("matched"), "citation_precision"),
        "matched_checked_minus_matched": paired(records("matched"), records("matched_checked"), "citation_precision"),
        "matched_checked_minus_before": paired(records("before"), records("matched_checked"), "citation_precision"),
        "recall_matched_checked_minus_before": paired(records("before"), records("matched_checked"),
                                                      "citation_recall"),
    }


def report(out: Path) -> dict[str, Any]:
    items = {i.id: i for i in load_heldout()}
    rows = [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]
    ok = [scored(r, items) for r in rows if "error" not in r]
    write_labels(out, ok)

    def records(side: str) -> list[dict[str, Any]]:
        return [{"item": r["item"], "figures": r[side]} for r in ok]

    claims = [c for r in ok for c in r["claims"]]
    counts = {s: sum(1 for c in claims if c["status"] == s) for s in ("supported", "reattributed", "unsupported")}
    per_q_unsupported = [(sum(1 for c in r["claims"] if c["status"] == "unsupported"), len(r["claims"]))
                         for r in ok if r["claims"]]
    labels = [json.loads(x) for x in (out / "labels.jsonl").read_text().splitlines()]
    labelled = [x for x in labels if x["reader_keeps"] is not None]
    dropped = [x for x in labelled if x["status"] != "supported"]  # the check moved or removed its citation
    kept_by_reader = sum(1 for x in dropped if x["reader_keeps"])
    gold_of = {(r["item"], r.get("sample", 0), c["text"]): [p["gold"] for p in c["cited_passages"]]
               for r in ok for c in r["claims"]}  # (the same sentence cited twice: either citation's)
    summary = {
        "sessions": len(rows), "failed": len(rows) - len(ok), "claims": len(claims), "claims_by_status": counts,
        "citation_precision": {
            "before": statistics.fmean(r["before"]["citation_precision"] or 0.0 for r in ok) if ok else None,
            "after": statistics.fmean(r["after"]["citation_precision"] or 0.0 for r in ok) if ok else None,
            "after_minus_before": paired(records("before"), records("after"), "citation_precision")},
        "citation_recall": paired(records("before"), records("after"), "citation_recall"),
        "unsupported_share": {
            "before": round((counts["reattributed"] + counts["unsupported"]) / len(claims), 4) if claims else None,
            "after": round(counts["unsupported"] / len(claims), 4) if claims else None,
            "questions_with_claims": len(per_q_unsupported)},
        "labelled_claims": len(labelled),
        "reader_unsupported_share": {  # the reader's view: cited claims whose cited passage does not support them
            "before": round(sum(1 for x in labelled if not x["reader_keeps"]) / len(labelled), 4) if labelled else None,
            "after_still_cited": round(sum(1 for x in labelled if not x["reader_keeps"] and x["status"] == "supported")
                                       / len(labelled), 4) if labelled else None},
        "false_drops": {"dropped_labelled": len(dropped), "reader_keeps": kept_by_reader,
                        "rate": round(kept_by_reader / len(dropped), 4) if dropped else None,
                        "changed_citing_gold": sum(1 for x in labels if x["status"] != "supported" and
                                                   any(gold_of.get((x["item"], x["sample"], x["text"]), [])))},
        "calibration": calibration(labelled),
        "product_pipeline": pipeline(ok),
        "seconds": round(sum(r.get("seconds", 0) for r in rows), 1),
    }
    d = [r["after"]["citation_precision"] - r["before"]["citation_precision"] for r in ok
         if r["after"]["citation_precision"] is not None and r["before"]["citation_precision"] is not None]
    summary["citation_precision"]["sign_flip_p"] = round(sign_flip_p(d), 4) if d else None
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out / "claims.jsonl").write_text("".join(json.dumps({k: r[k] for k in ("item", "before", "after", "body",
                                                                          "body_after", "claims")},
                                                         ensure_ascii=False) + "\n" for r in ok), encoding="utf-8")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "citations")
    ap.add_argument("--limit", type=int, default=0, help="only the first N questions (0: all 32)")
    ap.add_argument("--samples", type=int, default=3, help="sessions per question (the curve's seeds 0..N-1)")
    ap.add_argument("--report-only", action="store_true")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.report_only:
        asyncio.run(run_sessions(a.out, a.limit, a.samples))
    print(json.dumps(report(a.out), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
