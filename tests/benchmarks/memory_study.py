"""Does memory make the product better, with the weights frozen? (issue 62, part A; pre-registered in
docs/learning/memory/PREREGISTRATION.md, which fixes every number below before any unit ran.)

The shipped SFT adapter answers all along. Three held-out conditions, 40 questions x 3 samples each, the same
sampling seed per (question, sample) in every condition:
- off: no bank;
- a: the product's own reflection writer (`learning.reflection.write_reflection`, production defaults), run on
  judged sessions of training-split questions;
- b: curated experience (`learning.reflection.experience.experience_item`) from the same sessions in which a search
  found a gold passage: the query that found it, the titles, the short answer where it matched gold (the positive
  control; amendment 2 of the pre-registration, which also sets the retrieval threshold to 0.2).
Retrieval is cross-question only (`bank_mode="cross"`); the banks go through the held-out guard on import.

Units, each finished and committed on its own, resumable (rerun the same command):
- `train`: 40 training questions x 1 session, offline-judged, then memory (b) from them (OUT/memory-b.jsonl,
  OUT/train/sessions.jsonl);
- `reflect-0`, `reflect-1`: memory (a), the reflection writer on the same sessions, in two halves (every other
  training question) so that two workers share it and each half ends within a session (about an hour on one core).
  A half first redoes its sessions with the same seeds (the writer needs their trajectories, which live only in the
  git-ignored session log), then writes OUT/memory-a-K.jsonl and OUT/train/reflections-K.jsonl; the half that
  ends last joins them into OUT/memory-a.jsonl and OUT/train/reflections.jsonl;
- `off-sK`, `a-sK`, `b-sK` (K = 0, 1, 2): one condition's sample K of the 40 held-out questions (OUT/samples/).
A unit in progress lives in the git-ignored state folder (RUNS); only finished units reach OUT. On a new machine the
committed units count as done and an unfinished one starts again.

    for k in 0 1; do .venv/bin/python tests/benchmarks/memory_study.py --workers 2 --worker $k --commit & done
    .venv/bin/python tests/benchmarks/memory_study.py --report-only      # OUT/summary.md and results.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_check import DEFAULT_MODEL, offline_settings  # noqa: E402
from learning_curve import (  # noqa: E402
    ARMS,
    COMMIT,
    PROTOCOL_V2,
    SFT_ADAPTER,
    HeldoutEvaluator,
    Unit,
    append_records,
    converted_model,
    finish_unit,
    json_lines,
    locked,
    make_config,
    read_records,
    timestamped,
    write_atomic,
)

from app.container import build_policy, build_reflection_judge  # noqa: E402
from app.settings import Settings  # noqa: E402
from learning.eval.datasets import bench_spec  # noqa: E402
from learning.eval.heldout import HeldoutItem, heldout_guard, load_heldout, short_answer  # noqa: E402
from learning.eval.memory_stats import analyse  # noqa: E402
from learning.reflection.experience import experience_item  # noqa: E402
from learning.reflection.writer import write_reflection  # noqa: E402
from store.rubric_bank import RubricBank, read_jsonl  # noqa: E402

OUT = ROOT / "docs" / "learning" / "memory"
RUNS = ROOT / ".cache" / "memory_study"
TRAIN_SPLIT = ROOT / "learning" / "sft" / "data" / "train"
CONDITIONS = ("off", "a", "b")
SAMPLES = 3
# The confirmatory follow-up (confirm/PREREGISTRATION.md): fresh samples 3..8 of bank off and memory (b) only,
# decided on those alone (never pooled with samples 0..2, so the first look costs it nothing).
CONFIRM_SAMPLES = tuple(range(3, 9))
CONFIRM_CONDITIONS = ("off", "b")
# Every unit of the follow-up runs with the product code its first units ran with (confirm/PREREGISTRATION.md,
# amendment 1): later commits changed how a report marks invented citation ids and which sentences attribution may
# match, which moves citation precision. Its units run from a worktree of this commit (CONFIRM_RUN below).
CONFIRM_CODE = "9ccac4f"
CONFIRM_RUN = ("git worktree add --detach /tmp/confirm-code 9ccac4f && cd /tmp/confirm-code && for k in 0 1; do "
               "/work/main/.venv/bin/python tests/benchmarks/memory_study.py --confirm --out "
               "<this repository>/docs/learning/memory --workers 2 --worker $k --threads 1 --commit & done; wait")
TRAIN_QUESTIONS = 40  # 20 HotpotQA + 20 MuSiQue of the training split, drawn with TRAIN_SEED
TRAIN_SEED = 62
# Amendment 2 (PREREGISTRATION.md): cross-question retrieval at cosine >= 0.2, not the product's 0.4, at which at most
# 5 of the 40 held-out questions have any training question near enough (measured on the questions alone)
MIN_SIMILARITY = 0.2
MATCH_F1 = 0.5  # memory (b): an answer "matched gold" at token F1 >= 0.5 of its short answer, or a cover-EM hit
TRAIN_SAMPLE = 100  # the training sessions' sampling index (sampling_seed): never one of the held-out samples 0..2
Say = Any


ITEMS = 0  # --items: a smoke run's question count (0: the design's)
MEMORY_DIR = OUT  # where the memories are read from (the follow-up study reads the main study's)
CONFIRM = False


def _set_folders(out: Path, runs: Path, items: int, confirm: bool = False) -> None:
    global OUT, RUNS, ITEMS, MEMORY_DIR, CONFIRM
    OUT, RUNS, ITEMS, MEMORY_DIR, CONFIRM = out, runs, items, out, confirm
    if confirm:
        OUT, RUNS = out / "confirm", runs / "confirm"


REFLECT_PARTS = 2  # memory (a) is written in this many halves, part k on training questions k, k + 2, ...


def design() -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The samples and conditions of the study being run."""
    return (CONFIRM_SAMPLES, CONFIRM_CONDITIONS) if CONFIRM else (tuple(range(SAMPLES)), CONDITIONS)


def units() -> list[str]:
    samples, conditions = design()
    evals = [f"{c}-s{k}" for k in samples for c in conditions]
    return evals if CONFIRM else ["train"] + [f"reflect-{k}" for k in range(REFLECT_PARTS)] + evals


# Worker 0 builds memory (b) and the bank-off samples; worker 1 the (b) samples, each after an off sample so that it
# never waits long for memory (b). The two halves of memory (a), then its samples, are split between both.
PLAN = {"train": 0, "reflect-0": 0, "reflect-1": 1, "a-s0": 0, "a-s1": 1, "a-s2": 0,
        "off-s0": 1, "b-s0": 1, "off-s1": 1, "b-s1": 1, "off-s2": 1, "b-s2": 1}


def worker_of(unit: str, workers: int) -> int:
    if unit in PLAN:
        return PLAN[unit] % workers
    return int(unit.rsplit("-s", 1)[1]) % workers  # the follow-up: both conditions of a sample on one worker


def needs(unit: str) -> Path | None:
    """The memory file a unit needs before it can start (None: nothing)."""
    return {"a": MEMORY_DIR / "memory-a.jsonl", "b": MEMORY_DIR / "memory-b.jsonl"}.get(unit.split("-")[0])


def train_items() -> list[HeldoutItem]:
    """The training questions of the study: 20 of each source, drawn with TRAIN_SEED (never a held-out one: the
    split was drawn before any training, and `refuse_heldout` would say so)."""
    rng = random.Random(TRAIN_SEED)
    out: list[HeldoutItem] = []
    for source in ("hotpotqa", "musique"):
        pool = [HeldoutItem(f"{source}:{e.id}", source, e.question, tuple(e.answers),
                            tuple(e.metadata.get("supporting_titles") or ()), e.format)
                for e in bench_spec(source).loader(TRAIN_SPLIT)]
        out += rng.sample(pool, TRAIN_QUESTIONS // 2)
    return out[: ITEMS] if ITEMS else out


def unit_file(root: Path, unit: str) -> Path:
    return root / "samples" / f"{unit}.jsonl"


def unit_done(unit: str, items: Sequence[HeldoutItem]) -> bool:
    if unit == "train":
        return (OUT / "memory-b.jsonl").is_file()
    if unit.startswith("reflect-"):
        return (OUT / "memory-a.jsonl").is_file() or (OUT / f"memory-a-{unit.rsplit('-', 1)[1]}.jsonl").is_file()
    sample = int(unit.rsplit("-s", 1)[1])
    have = {(r.get("item"), r.get("sample")) for r in read_records(unit_file(OUT, unit))}
    return all((i.id, sample) in have for i in items)


def matched(figures: Mapping[str, Any]) -> bool:
    return (figures.get("answer_f1") or 0.0) >= MATCH_F1 or bool(figures.get("cover_em"))


def _mentioned(text: str, pieces: Sequence[str]) -> list[str]:
    low = text.casefold()
    return [p for p in dict.fromkeys(pieces) if p.strip() and p.strip().casefold() in low]


def item_meta(item: Any, record: Mapping[str, Any], memory: str) -> dict[str, Any]:
    """What the item passes on that a later session could visibly reuse: the source session's queries and passage
    titles that its text mentions (the same rule for both memories)."""
    text = f"{item.rubrics}\n{item.takeaways}"
    return {"id": item.id, "memory": memory, "question": item.question, "source_item": record["item"],
            "queries": _mentioned(text, record.get("queries") or []),
            "titles": _mentioned(text, [*record.get("searched_titles", []), *record.get("cited_titles", [])])}


async def train_sessions(settings: Settings, policy: Any, say: Say, items: Sequence[HeldoutItem] | None = None,
                         runs: Path | None = None) -> tuple[HeldoutEvaluator, dict[str, Any]]:
    """The training sessions (by default all 40; those already in `runs` are kept), judged as the product judges
    logged sessions."""
    from learning.judge.pipeline import judge_pending

    runs = runs or RUNS / "train"
    runs.mkdir(parents=True, exist_ok=True)
    cfg = make_config(PROTOCOL_V2, Unit(ARMS[0], 0, 1), RUNS)  # only its research options are used
    evaluator = HeldoutEvaluator(settings, policy, None, runs / "sessions.jsonl")
    evaluator.source = "api"  # logged as a user's session: judged and reflected on as production does
    await evaluator.run(cfg, train_items() if items is None else items, range(TRAIN_SAMPLE, TRAIN_SAMPLE + 1),
                        {"run": "train", "arm": "train", "seed": None, "step": 0}, say)
    judged = await judge_pending(evaluator.log, evaluator.judge)
    if judged.judged or judged.failed:
        say(f"judged {judged.judged} training session(s) ({judged.failed} failed)")
    return evaluator, {r["item"]: r for r in read_records(runs / "sessions.jsonl")}


def experience_memory(records: Mapping[str, Mapping[str, Any]], log: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """Memory (b) as amended before any memory condition ran (PREREGISTRATION.md, amendment 2): an experience item
    from every training session in which a search returned a gold passage; the short answer only where it matched
    gold (`matched`); the item's score is the session's gold recall."""
    by_id = {i.id: i for i in train_items()}
    items, meta = [], []
    for rid, r in records.items():
        if r.get("failed") or not (r["figures"].get("gold_recall") or 0.0) > 0:
            continue
        rec = log.get(r["session_id"])
        item = experience_item(
            question=rec.question, trajectory=rec.trajectory, useful_titles=by_id[rid].gold_titles,
            cited_titles=r["cited_titles"],
            short_answer=short_answer(r.get("answer") or "") if matched(r["figures"]) else None,
            score=float(r["figures"]["gold_recall"]), session_id=rec.session_id, policy_version=rec.policy_version)
        if item is not None:
            items.append(item)
            meta.append(item_meta(item, r, "b"))
    return items, meta


async def run_train(settings: Settings, say: Say) -> None:
    """The training sessions, then memory (b) from them."""
    policy = build_policy(settings, say)
    try:
        evaluator, records = await train_sessions(settings, policy, say)
        b_items, b_meta = experience_memory(records, evaluator.log)
        n_matched = sum(not r.get("failed") and matched(r["figures"]) for r in records.values())
        say(f"memory (b): {len(b_items)} experience item(s) from {len(records)} session(s), {n_matched} of which "
            "matched gold")
    finally:
        await policy.aclose()  # type: ignore[attr-defined]
    (OUT / "train").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RUNS / "train" / "sessions.jsonl", OUT / "train" / "sessions.jsonl")
    _write_memory("b", b_items, b_meta)


def rebuild_b(say: Say) -> None:
    """Amendment 2, applied to the committed train unit on the machine that ran it (its session log is needed):
    the strict memory (b) is kept as memory-b-strict.jsonl, memory (b) rebuilt by `experience_memory`."""
    from store.session_log import SessionLog

    log_path = RUNS / "train" / "sessions.sqlite3"
    if not log_path.is_file():
        raise SystemExit(f"{log_path} is missing: the train unit's session log lives only on the machine that ran it")
    for suffix in ("jsonl", "meta.jsonl"):
        strict = OUT / f"memory-b-strict.{suffix}"
        if not strict.is_file():
            shutil.copyfile(OUT / f"memory-b.{suffix}", strict)
    records = {r["item"]: r for r in read_records(RUNS / "train" / "sessions.jsonl")}
    with SessionLog(log_path) as log:
        items, meta = experience_memory(records, log)
    _write_memory("b", items, meta)
    say(f"memory (b) rebuilt: {len(items)} experience item(s) from {len(records)} session(s)")


async def run_reflect(settings: Settings, say: Say, part: int) -> None:
    """Half `part` of memory (a): the product's reflection writer, production defaults, on every judged training
    session of that half; the half that ends last joins both."""
    runs = RUNS / f"train-{part}"
    every = train_items()
    mine = every[part::REFLECT_PARTS]
    committed = {r["item"]: r for r in read_records(OUT / "train" / "sessions.jsonl")}
    policy = build_policy(settings, say)
    try:
        evaluator, records = await train_sessions(settings, policy, say, mine, runs)
        # The redone sessions use the committed ones' seeds; whether they came out the same is recorded, not assumed.
        same = sum(committed.get(rid, {}).get("answer") == r.get("answer") for rid, r in records.items())
        say(f"redone training sessions: {same} of {len(records)} gave the committed unit's answer")
        bank = RubricBank(settings.store.model_copy(update={"bank": settings.store.bank.model_copy(update={
            "collection": f"memory_study_a{part}"})}), heldout=heldout_guard())
        done = {r["session_id"] for r in json_lines(runs / "reflections.jsonl")}
        judge = build_reflection_judge(settings)
        index = {i.id: n for n, i in enumerate(every, 1)}  # the seed follows the question, whichever half it is in
        for k, (rid, r) in enumerate(records.items(), 1):
            if r.get("failed") or r["session_id"] in done:
                continue
            began = time.perf_counter()
            try:
                o = await write_reflection(r["session_id"], log=evaluator.log, policy=policy, judge=judge, bank=bank,
                                           seed=TRAIN_SEED * 1000 + index[rid])
                row = {"session_id": r["session_id"], "item": rid, "reason": o.reason, "valid": o.valid,
                       "candidates": o.candidates, "best_score": o.best_score, "accepted": o.accepted,
                       "why_invalid": why_invalid(evaluator.log, o.batch_id)}
            except Exception as exc:  # noqa: BLE001 - one session's failure is recorded; the rest go on
                row = {"session_id": r["session_id"], "item": rid, "reason": f"failed: {type(exc).__name__}: {exc}"}
            row["same_as_committed"] = committed.get(rid, {}).get("answer") == r.get("answer")
            append_records(runs / "reflections.jsonl", [row | {"seconds": round(time.perf_counter() - began, 1)}])
            say(f"  reflection {k}/{len(records)} {rid}: {row['reason']} ({time.perf_counter() - began:.0f}s)")
        rows = json_lines(runs / "reflections.jsonl")
        a_items = [bank.get(r["accepted"]) for r in rows if r.get("accepted") and r["reason"] == "accepted"]
        by_session = {r["session_id"]: r for r in records.values() if not r.get("failed")}
        a_meta = [item_meta(i, by_session[i.session_id], "a") for i in a_items if i.session_id in by_session]
    finally:
        await policy.aclose()  # type: ignore[attr-defined]

    def publish() -> None:
        (OUT / "train").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(runs / "reflections.jsonl", OUT / "train" / f"reflections-{part}.jsonl")
        _write_memory(f"a-{part}", a_items, a_meta)
        join_memory_a(say)

    locked(OUT, publish)
    say(f"memory (a), half {part}: {len(a_items)} reflection(s) accepted of {len(rows)} session(s) reflected on")


def why_invalid(log: Any, batch_id: str) -> list[dict[str, Any]]:
    """Each candidate's finish reason, length and validity error (what the report says about memory (a)'s yield)."""
    return [{"finish": c.candidate.finish_reason, "tokens": len(c.candidate.token_ids),
             "error": (c.candidate.validity_error or "")[:160]}
            for c in log.reflection_candidates(batch_id=batch_id)]


def join_memory_a(say: Say) -> None:
    """Once every half is written: memory-a.jsonl (and its meta, and train/reflections.jsonl) as their union."""
    parts = range(REFLECT_PARTS)
    if not all((OUT / f"memory-a-{k}.jsonl").is_file() for k in parts):
        return
    for name in ("memory-a.meta.jsonl", "train/reflections.jsonl", "memory-a.jsonl"):  # the last marks it done
        pieces = [(OUT / name.replace(".", f"-{k}.", 1)).read_text(encoding="utf-8") for k in parts]
        write_atomic(OUT / name, "".join(pieces))
    say(f"memory (a): {len(json_lines(OUT / 'memory-a.jsonl'))} item(s) from {REFLECT_PARTS} halves")


def _write_memory(name: str, items: Sequence[Any], meta: Sequence[Mapping[str, Any]]) -> None:
    write_atomic(OUT / f"memory-{name}.meta.jsonl", "".join(json.dumps(m) + "\n" for m in meta))
    write_atomic(OUT / f"memory-{name}.jsonl", "".join(json.dumps(asdict(i)) + "\n" for i in items))


async def run_eval(settings: Settings, unit: str, items: Sequence[HeldoutItem], say: Say) -> None:
    condition, sample = unit.rsplit("-s", 1)[0], int(unit.rsplit("-s", 1)[1])
    path = unit_file(RUNS, unit)
    path.parent.mkdir(parents=True, exist_ok=True)
    cfg = make_config(PROTOCOL_V2, Unit(ARMS[0], 0, 1), RUNS)
    bank = None
    if condition != "off":
        bank = RubricBank(settings.store.model_copy(update={"bank": settings.store.bank.model_copy(update={
            "collection": f"memory_study_eval_{condition}", "min_similarity": MIN_SIMILARITY})}),
            heldout=heldout_guard())
        bank.clear()
        result = bank.add_many(list(read_jsonl(MEMORY_DIR / f"memory-{condition}.jsonl")))  # through the held-out guard
        say(f"memory ({condition}): {result.stored} item(s) in the bank")
    policy = build_policy(settings, say)
    try:
        evaluator = HeldoutEvaluator(settings, policy, bank, path)
        if bank is not None:
            evaluator.mode = "cross"  # cross-question retrieval only (issue 62)
        await evaluator.run(cfg, items, range(sample, sample + 1),
                            {"run": condition, "arm": condition, "seed": None, "step": 0}, say)
    finally:
        await policy.aclose()  # type: ignore[attr-defined]
    dst = unit_file(OUT, unit)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, dst)


def report(items: Sequence[HeldoutItem]) -> dict[str, Any]:
    samples, conditions = design()
    records = {c: [r for k in samples for r in read_records(unit_file(OUT, f"{c}-s{k}"))] for c in conditions}
    meta = {m["id"]: m for c in ("a", "b") for m in json_lines(MEMORY_DIR / f"memory-{c}.meta.jsonl")}
    result = analyse(records, meta, [i.id for i in items], samples=samples,
                     memories=[c for c in conditions if c != "off"])
    result["units"] = json_lines(OUT / "units.jsonl")
    write_atomic(OUT / "results.json", json.dumps(result, indent=1))
    write_atomic(OUT / "summary.md", summary_md(result))
    return result


def _ci(d: Mapping[str, Any]) -> str:
    holm = f", Holm p {d['p_holm']:.3f} (of {d['holm_family']} tests)" if "p_holm" in d else ""
    return f"{d['mean']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}], p {d['p']:.3f}{holm}"


def summary_md(r: Mapping[str, Any]) -> str:
    lines = ["# Memory with frozen weights: results as they stand", "",
             "Written by `tests/benchmarks/memory_study.py --report-only` from the committed units; the analysis is "
             "the one pre-registered in [PREREGISTRATION.md](PREREGISTRATION.md).", "",
             f"Units done: {', '.join(r['done']) or 'none'}.", ""]
    lines += ["## Means per condition", "", "| condition | n | " + " | ".join(r["metrics"]) + " |",
              "|---|---|" + "---|" * len(r["metrics"])]
    for c, row in r["means"].items():
        lines.append(f"| {c} | {row['n']} | " + " | ".join(
            "–" if row[m] is None else f"{row[m]:.3f}" for m in r["metrics"]) + " |")
    if r.get("tests"):
        lines += ["", "## Differences against bank off (hierarchical bootstrap, 95 % intervals)", "",
                  "| comparison | metric | primary | difference |", "|---|---|---|---|"]
        for t in r["tests"]:
            lines.append(f"| {t['comparison']} | {t['metric']} | {'yes' if t['primary'] else 'no'} | {_ci(t)} |")
    if r.get("acts"):
        lines += ["", "## Does memory act? (the positive control)", "",
                  "| memory | sessions | item in prompt | its query searched | its titles retrieved or cited |",
                  "|---|---|---|---|---|"]
        for c, a in r["acts"].items():
            lines.append(f"| {c} | {a['sessions']} | {a['injected']:.3f} | {a['query_reused']:.3f} | "
                         f"{a['titles_reused']:.3f} |")
    if r.get("decision"):
        lines += ["", "## Decision", "", r["decision"]]
    return "\n".join(lines) + "\n"


async def main_async(a: argparse.Namespace) -> int:
    items = load_heldout()
    items = items[: a.items] if a.items else items
    say = timestamped(time.perf_counter())

    if a.rebuild_b:
        locked(OUT, lambda: rebuild_b(say))
        return 0
    if a.report_only:
        locked(OUT, lambda: report(items))
        print((OUT / "summary.md").read_text(encoding="utf-8"))
        return 0
    import torch

    threads = a.threads or max(1, (os.cpu_count() or 1) // a.workers)
    torch.set_num_threads(threads)
    model_dir = converted_model(a.model_dir, RUNS)
    settings = offline_settings(RUNS / f"data-w{a.worker}", model_dir, PROTOCOL_V2.snippets,
                                PROTOCOL_V2.snippet_chars, SFT_ADAPTER, PROTOCOL_V2.engine)
    settings = settings.model_copy(update={"agent": settings.agent.model_copy(update={"embedded_threads": threads})})
    worked = 0
    while True:
        mine = [u for u in units() if (not a.unit or u in a.unit) and worker_of(u, a.workers) == a.worker]
        todo = [u for u in mine if not unit_done(u, items)]
        ready = [u for u in todo if (n := needs(u)) is None or n.is_file()]
        if not todo or (a.max_units and worked >= a.max_units):
            break
        if not ready:  # the other worker is still building a memory this worker's next unit needs
            say(f"waiting for {', '.join(sorted({str(needs(u).name) for u in todo}))}")  # type: ignore[union-attr]
            await asyncio.sleep(60)
            continue
        unit = ready[0]
        say(f"unit {unit} (worker {a.worker + 1}/{a.workers}, {threads} thread(s))")
        t0 = time.perf_counter()
        if unit == "train":
            await run_train(settings, say)
        elif unit.startswith("reflect-"):
            await run_reflect(settings, say, int(unit.rsplit("-", 1)[1]))
        else:
            await run_eval(settings, unit, items, say)
        minutes = (time.perf_counter() - t0) / 60
        finish_unit(OUT, {"unit": unit, "minutes": round(minutes, 1), "worker": a.worker, "workers": a.workers,
                          "threads": threads}, lambda: report(items),
                    f"Issue 62 memory study: unit {unit} done ({minutes:.0f} min)" if a.commit else None, say)
        say(f"unit {unit} done in {minutes:.1f} min")
        worked += 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--worker", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch/llama.cpp threads (0: cores / workers)")
    p.add_argument("--unit", action="append", help="only these units (repeatable); with --workers, each still "
                   "goes to its worker in PLAN")
    p.add_argument("--max-units", type=int, default=0)
    p.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--commit", action="store_true", help="commit OUT as each unit ends")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--rebuild-b", action="store_true", help="amendment 2: rebuild memory (b) from the train unit's "
                   "session log (on the machine that ran it), keeping the strict one as memory-b-strict.jsonl")
    p.add_argument("--out", type=Path, default=OUT, help="the committed results (default: docs/learning/memory)")
    p.add_argument("--runs", type=Path, default=RUNS, help="the git-ignored state of units in progress")
    p.add_argument("--confirm", action="store_true", help="the confirmatory follow-up (OUT/confirm/"
                   "PREREGISTRATION.md): fresh samples 3..8 of bank off and memory (b)")
    p.add_argument("--items", type=int, default=0, help="only the first N held-out and training questions (a smoke "
                   "run; never with the default --out)")
    a = p.parse_args(argv)
    if a.items and a.out == OUT:
        p.error("--items changes the design: give a --out of its own")
    _set_folders(a.out, a.runs, a.items, a.confirm)
    if unknown := sorted(set(a.unit or ()) - set(units())):
        p.error(f"unknown unit(s) {', '.join(unknown)}; this study's units are {', '.join(units())}")
    if not 0 <= a.worker < a.workers:
        p.error(f"--worker must be in 0..{a.workers - 1}")
    if a.confirm and not a.report_only and not a.items and COMMIT != CONFIRM_CODE:
        p.error(f"the follow-up's units run with the product code of commit {CONFIRM_CODE}, not {COMMIT} "
                f"(confirm/PREREGISTRATION.md, amendment 1): {CONFIRM_RUN}")
    OUT.mkdir(parents=True, exist_ok=True)
    return asyncio.run(main_async(a))


if __name__ == "__main__":
    raise SystemExit(main())
