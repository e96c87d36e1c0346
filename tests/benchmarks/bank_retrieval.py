"""Benchmark (not a test): rubric-bank retrieval latency at 100,000 items on real embedded Chroma.

Fills a bank with N items whose question embeddings are precomputed (random unit vectors in MiniLM's 384
dimensions, clustered into topics so that neighbourhoods exist, as in a real bank), then times `RubricBank.retrieve`
for Q held-out questions in the two ways the app can call it:

- excluding query embedding: the query vector is given (what the trainer does with cached embeddings);
- including query embedding: the question text is embedded with the bundled MiniLM first (what a research run does).

Each retrieval is the full product path: the within-episode hash lookup, then the cross-episode top-k query that
excludes the question's own hash. Half the timed questions are in the bank (within-episode hits); the new ones are
all different, so the bank's query-embedding cache never answers a timed retrieval.

--baseline also times the retrieval path the bank had before its question index (a metadata-filtered get, count,
then the query, embedding with `encode`; `reference_retrieve` in tests/store/test_bank_equivalence.py) on the same
questions in the same run, alternating which of the two goes first, and counts the retrievals whose results differ.
`open_seconds` is the time to open the bank, which includes indexing a bank written before the question index.
A within-episode hit embeds nothing, so `..._new_questions_only` gives the figures of the cross-episode half alone.

    .venv/bin/python tests/benchmarks/bank_retrieval.py [--items 100000] [--queries 200] [--dir DIR] [--out F.json]
                                                        [--baseline]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import chromadb
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from store.config import BankConfig, StoreConfig  # noqa: E402
from store.embeddings import embed_texts  # noqa: E402
from store.records import BankItem, Retrieval  # noqa: E402
from store.rubric_bank import RubricBank  # noqa: E402
from tests.store.test_bank_equivalence import encode_old, reference_retrieve, same_retrieval  # noqa: E402

DIM = 384  # all-MiniLM-L6-v2
TOPICS = 500


def synthetic(n: int, seed: int = 0) -> tuple[list[BankItem], np.ndarray]:
    """n items with topic-clustered unit vectors; created over the last 90 days."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((TOPICS, DIM)).astype(np.float32)
    topic = rng.integers(0, TOPICS, n)
    vecs = centres[topic] + 0.6 * rng.standard_normal((n, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    start = datetime(2026, 8, 1, tzinfo=UTC)
    items = [
        BankItem.new(
            question=f"Synthetic research question {i} about topic {topic[i]}: what changed and why?",
            rubrics="Critical Requirement: state the cause. Pitfalls: undated claims.",
            takeaways="1. Search the primary source first.\n2. Cite each number.",
            score=float(rng.uniform(0.3, 1.0)), judge_model="bench-judge", policy_version="policy@0",
            session_id=f"bench-{i}", created_at=(start + timedelta(seconds=77 * i)).isoformat(),
        )
        for i in range(n)
    ]
    return items, vecs


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / mean in milliseconds."""
    ms = sorted(1000 * s for s in samples)
    return {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 2),
            "mean_ms": round(statistics.fmean(ms), 2), "n": len(ms)}


def time_writes(bank: RubricBank, n: int, baseline: bool) -> dict[str, object]:
    """`put` into a full bank: the first write's eviction scans the bank's metadata once, later ones rank in memory.
    The baseline is the ranking the eviction did before: every item read back (`items()`) and sorted."""
    from store.rubric_bank import retention

    rng = np.random.default_rng(2)
    samples, evicted = [], 0
    for i in range(n):
        it = BankItem.new(question=f"A written question {i}: which archive holds the charter?", rubrics="r",
                          takeaways="t", score=float(rng.uniform(0.2, 1.0)), judge_model="bench",
                          policy_version="policy@0", session_id=f"w-{i}")
        vec = rng.normal(size=384).astype(np.float32)
        t0 = time.perf_counter()
        res = bank.put(it, embedding=vec / np.linalg.norm(vec))
        samples.append(time.perf_counter() - t0)
        evicted += len(res.evicted)
    out: dict[str, object] = {"first_write_seconds": round(samples[0], 3), "evicted": evicted,
                              "later_writes": percentiles(samples[1:]) if n > 1 else {}}
    if baseline:
        now = datetime.now(UTC)
        t0 = time.perf_counter()
        sorted(bank.items(), key=lambda x: (retention(x, now, bank.config.half_life_days), x.created_at))
        out["baseline_ranking_seconds"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> None:
    """Fill, time, report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dir", type=Path, help="data folder (default: a fresh temporary one); reused if it is filled")
    ap.add_argument("--out", type=Path, help="also write the numbers as JSON")
    ap.add_argument("--baseline", action="store_true", help="also time the previous retrieval path, interleaved")
    ap.add_argument("--writes", type=int, default=0,
                    help="after the queries, time this many `put`s into the full bank (each evicts one item); with "
                         "--baseline also the previous eviction ranking (every item read back and sorted)")
    args = ap.parse_args()

    data = args.dir or Path(tempfile.mkdtemp(prefix="bank-bench-"))
    config = StoreConfig(data_dir=data, bank=BankConfig(capacity=max(args.items, 1)))
    t0 = time.perf_counter()
    bank = RubricBank(config)
    open_s = time.perf_counter() - t0
    items, vecs = synthetic(args.items)
    fill_s = 0.0
    if bank.count() < args.items:
        t0 = time.perf_counter()
        last = [t0]

        def tick(done: int, total: int) -> None:
            if time.perf_counter() - last[0] > 10 or done == total:
                last[0] = time.perf_counter()
                print(f"  filled {done:,}/{total:,} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)

        bank.add_many(items, vecs, progress=tick)
        fill_s = time.perf_counter() - t0
    print(f"bank holds {bank.count():,} items (filled in {fill_s:.1f}s)", file=sys.stderr)

    rng = np.random.default_rng(1)
    in_bank = rng.choice(args.items, args.queries // 2, replace=False)
    new_q = [f"A new question {n} on topic {int(t)}: which sources disagree?"
             for n, t in enumerate(rng.integers(0, TOPICS, args.queries - len(in_bank)))]
    questions = [items[int(i)].question for i in in_bank] + new_q
    query_vecs = np.concatenate([vecs[in_bank], vecs[rng.integers(0, args.items, len(new_q))]])
    embed_texts(["warm-up"])  # load MiniLM before timing

    collection = chromadb.PersistentClient(path=str(config.chroma_path)).get_collection(config.bank.collection)
    knobs = {"top_k": bank.config.top_k, "min_similarity": bank.config.min_similarity}
    uncached = encode_old.__wrapped__  # the reference's own embedding, never from its test-time cache

    def new(q: str, v: np.ndarray | None) -> Retrieval:
        return bank.retrieve(q, embedding=v)

    def old(q: str, v: np.ndarray | None) -> Retrieval:
        return reference_retrieve(collection, q, embedding=v, embed=uncached, **knobs)  # type: ignore[arg-type]

    paths = {"new": new, "old": old} if args.baseline else {"new": new}
    for warm in paths.values():
        warm(questions[0], query_vecs[0])  # the HNSW index into memory
    times: dict[str, dict[str, list[float]]] = {p: {"excl": [], "incl": []} for p in paths}
    modes, differ = {"within": 0, "cross": 0, "none": 0}, 0
    for n, (q, v) in enumerate(zip(questions, query_vecs, strict=True)):
        for phase, given in (("excl", v), ("incl", None)):
            got = {}
            for name in sorted(paths, reverse=n % 2 == 1):  # alternate which path runs first
                t0 = time.perf_counter()
                got[name] = paths[name](q, given)
                times[name][phase].append(time.perf_counter() - t0)
            differ += args.baseline and not same_retrieval(got["new"], got["old"])
            if phase == "excl":
                modes[got["new"].mode] += 1

    def figures(path: str) -> dict[str, dict[str, float]]:
        excl, incl = times[path]["excl"], times[path]["incl"]
        return {"excluding_query_embedding": percentiles(excl), "including_query_embedding": percentiles(incl),
                "including_query_embedding_new_questions_only": percentiles(incl[len(in_bank):])}

    result: dict[str, object] = {
        "items": bank.count(), "queries": len(questions), "fill_seconds": round(fill_s, 1),
        "open_seconds": round(open_s, 2), "modes": modes, **figures("new"),
    }
    if args.baseline:
        result["baseline"] = figures("old")
        result["retrievals_that_differ"] = int(differ)
    if args.writes:
        result["writes_at_capacity"] = time_writes(bank, args.writes, args.baseline)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
