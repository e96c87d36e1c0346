"""Benchmark (not a test): the store under load and faults, on SQLite and on PostgreSQL (issue 17, item 4).

1. **Load.** W writer processes each run S research sessions through the real `ResearchService` and graph with a
   scripted policy and an in-memory search tool (so neither a model nor an index is the bottleneck: every second is
   the agent's own work and the store's), while a judge process judges finished sessions with the offline judge and a
   registry process does a retraining cycle's store writes in a loop (read the data window, register a version, move
   `live`). Reported: sessions/s, p50/p99 of a turn commit (`append_turn`, timed in the writers), and lost or
   duplicated rows (every session a writer finished must be in the log with exactly its turns, indices contiguous).
2. **kill -9.** One more writer whose model is slow is SIGKILLed inside a session: its session is left `running`
   (resumable) and the crash sweep marks it `failed`; every other session is untouched.
3. **Scale.** The same queries at 10k and 100k sessions (bulk-copied from real ones): `completed_unjudged()`, the
   session list, the registry's `live()` and the data window.

    .venv/bin/python tests/benchmarks/store_load.py [--backend sqlite|postgresql|both] [--writers 4] [--sessions 25]
        [--scale 10000,100000] [--out store_load.json]

PostgreSQL is a real server started from Debian's binaries (tests/postgres.py), as the tests do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.config import AgentConfig, RunOptions, StageTokenCaps  # noqa: E402
from store.config import StoreConfig  # noqa: E402
from store.records import Snippet  # noqa: E402
from store.session_log import SessionLog  # noqa: E402

OPTS = RunOptions(format="short_form", max_tool_calls=2, seed=1, wall_clock_s=600, context_tokens=65536,
                  token_caps=StageTokenCaps(plan=256, research=128, review=128, answer=256))


class EchoSearch:
    """A search tool that answers at once with three fixed passages (the store, not search, is measured)."""

    name = "local_search"
    description = "Search the local document collection; argument: a query."

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        return [Snippet(id=f"{call_id}-{i}", tool=self.name, title=f"Passage {i}",
                        text=f"Haymo of Faversham passage {i} about {query}: books were translated into Latin.")
                for i in range(3)]


class TimedLog(SessionLog):
    """The real session log, timing each turn commit."""

    commit_ms: list[float]

    def append_turn(self, session_id: str, turn: Any) -> int:  # noqa: D102
        start = time.perf_counter()
        try:
            return super().append_turn(session_id, turn)
        finally:
            self.commit_ms.append((time.perf_counter() - start) * 1000)


def _open(store: StoreConfig, cls: type[SessionLog] = SessionLog) -> SessionLog:
    if store.database_url is not None:
        return cls(database_url=store.database_url)
    return cls(store.sqlite_path)


def writer(store: StoreConfig, sessions: int, slow_s: float, out: str) -> None:
    """One writer process: `sessions` research sessions; what it wrote goes to `out` (JSON) at the end."""
    from app.service import ResearchService
    from tests.agent.scripts import well_formed
    from tests.fakes import ScriptedPolicy

    log = _open(store, TimedLog)
    log.commit_ms = []  # type: ignore[attr-defined]
    script = well_formed(n_calls=2, bogus_cite=False)

    def slow_script(context: str, stop: Sequence[str]) -> str:
        time.sleep(slow_s)  # the kill -9 writer: slow enough to be caught inside a session
        return script(context, stop)

    svc = ResearchService(ScriptedPolicy(slow_script if slow_s else script), {"local_search": EchoSearch()},
                          log, AgentConfig())
    written: dict[str, int] = {}
    start, began = time.perf_counter(), time.time()
    for i in range(sessions):
        outcome = asyncio.run(svc.run(f"Question {i} from {os.getpid()}: what language were books translated into?",
                                      OPTS))
        written[outcome.session_id] = len(outcome.trajectory.turns)
        if slow_s:
            print(f"session {outcome.session_id} done", flush=True)
    Path(out).write_text(json.dumps({"written": written, "seconds": time.perf_counter() - start,
                                     "began": began, "ended": time.time(),
                                     "commit_ms": log.commit_ms}))  # type: ignore[attr-defined]


def judge_loop(store: StoreConfig, stop_file: str, out: str) -> None:
    """The judge beside the writers: judge whatever has finished, until the writers are done, then once more."""
    from app.container import build_judge
    from app.settings import Settings
    from learning.judge.pipeline import judge_pending

    log = _open(store)
    judge = build_judge(Settings(store=store), log, say=lambda _m: None)
    judged = rounds = 0
    while True:
        last = Path(stop_file).exists()
        summary = asyncio.run(judge_pending(log, judge, progress=lambda _m: None))
        judged += summary.judged
        rounds += 1
        if last:
            break
        time.sleep(0.2)
    Path(out).write_text(json.dumps({"judged": judged, "rounds": rounds}))


def registry_loop(store: StoreConfig, stop_file: str, out: str) -> None:
    """A retraining cycle's store writes in a loop: data window, a new version, `live` moved to it."""
    from store.registry import Registry

    log = _open(store)
    reg = Registry(log)
    moves = 0
    adapter = Path(tempfile.mkdtemp(prefix="adapter-"))
    (adapter / "adapter_config.json").write_text("{}")  # registered and promoted, never loaded
    while not Path(stop_file).exists():
        reg.sessions_in_window(None, log.now())
        version = reg.register(adapter, parent=reg.live().name, training_run="bench", data_window={})
        reg.promote(version.name, "bench")
        moves += 1
        time.sleep(0.5)
    Path(out).write_text(json.dumps({"moves": moves}))


def pct(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


def check_rows(log: SessionLog, written: Mapping[str, int]) -> dict[str, int]:
    """Lost and duplicated rows: every written session present with exactly its turns, indices 0..n-1."""
    lost = dup = 0
    with log.transaction(write=False) as conn:
        rows = conn.execute("SELECT session_id, COUNT(*), MIN(idx), MAX(idx), COUNT(DISTINCT idx) FROM turns "
                            "GROUP BY session_id").fetchall()
    found = {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}
    for sid, n in written.items():
        count, lo, hi, distinct = found.get(sid, (0, None, None, 0))
        lost += max(0, n - distinct)
        dup += max(0, count - n) + (count - distinct)
        if count and (lo != 0 or hi != count - 1):
            lost += 1
    return {"lost_rows": lost, "duplicated_rows": dup, "sessions_checked": len(written)}


@dataclass
class Backend:
    name: str
    store: StoreConfig


def run_load(backend: Backend, writers: int, sessions: int, work: Path) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    stop = work / f"{backend.name}.stop"
    outs = [work / f"{backend.name}-w{i}.json" for i in range(writers)]
    judge_out, reg_out = work / f"{backend.name}-judge.json", work / f"{backend.name}-registry.json"
    _open(backend.store).close()  # migrate once before the race
    side = [ctx.Process(target=judge_loop, args=(backend.store, str(stop), str(judge_out))),
            ctx.Process(target=registry_loop, args=(backend.store, str(stop), str(reg_out)))]
    procs = [ctx.Process(target=writer, args=(backend.store, sessions, 0.0, str(o))) for o in outs]
    for p in side:
        p.start()
    start = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    wall = time.perf_counter() - start
    stop.touch()
    for p in side:
        p.join()
    assert all(p.exitcode == 0 for p in procs + side), [p.exitcode for p in procs + side]
    results = [json.loads(o.read_text()) for o in outs]
    written = {sid: n for r in results for sid, n in r["written"].items()}
    # From the first writer's first session to the last writer's end (process start-up excluded).
    window = max(r["ended"] for r in results) - min(r["began"] for r in results)
    commits = [ms for r in results for ms in r["commit_ms"]]
    log = _open(backend.store)
    return {
        "writers": writers, "sessions": len(written), "wall_s": round(wall, 2), "writing_s": round(window, 2),
        "sessions_per_s": round(len(written) / window, 2),
        "turn_commits": len(commits), "turn_commit_ms_p50": round(pct(commits, 0.5), 2),
        "turn_commit_ms_p99": round(pct(commits, 0.99), 2),
        "judge": json.loads(judge_out.read_text()), "registry": json.loads(reg_out.read_text()),
        **check_rows(log, written),
    }


def run_kill(backend: Backend, work: Path) -> dict[str, Any]:
    """SIGKILL a writer inside its second session; the first must be intact, the second running then failed."""
    import subprocess

    url = backend.store.database_url.get_secret_value() if backend.store.database_url is not None else None
    code = ("import sys; sys.path.insert(0, %r); from tests.benchmarks.store_load import writer, StoreConfig\n"
            "writer(StoreConfig(data_dir=%r, database_url=%r), 3, 0.3, %r)")
    cmd = [sys.executable, "-c", code % (str(ROOT), str(backend.store.data_dir), url, str(work / "killed.json"))]
    env = {**os.environ, "RUBRICEM_STORE__DATABASE_URL": ""}
    log = _open(backend.store)
    before = {s.session_id for s in log.list_sessions(limit=100000)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline().split()[1]
    time.sleep(0.8)  # inside the second session: each of its ~7 generations sleeps 0.3 s
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    mine = [s for s in log.list_sessions(limit=100000) if s.session_id not in before]
    second = [s for s in mine if s.session_id != first]
    status_after_kill = {s.session_id: s.status for s in mine}
    swept = log.mark_stale_running_failed(older_than=timedelta(0))
    rec = log.get(first)
    return {
        "killed_session_status": [status_after_kill[s.session_id] for s in second],
        "swept_to_failed": swept,
        "killed_session_after_sweep": [log.get(s.session_id).status for s in second],
        "finished_session_status": rec.status,
        "finished_session": check_rows(log, {first: len(rec.trajectory.turns)}),
    }


def bulk_copy(log: SessionLog, target: int, turns_each: int = 2) -> int:
    """Grow the log to `target` sessions by copying a real finished session under new ids, one second apart in time,
    with its first `turns_each` turns (a full copy of every turn would take gigabytes at 100k sessions; the queries
    measured read the sessions table and count turns through the turns table's key)."""
    with log.transaction(write=False) as conn:
        cur = conn.execute("SELECT * FROM sessions WHERE status = 'completed' LIMIT 1")
        keep = [i for i, d in enumerate(cur.description) if d[0] != "rowid"]  # PostgreSQL's identity column
        cols = [cur.description[i][0] for i in keep]
        first = cur.fetchone()
        template = [first[i] for i in keep]
        tcur = conn.execute("SELECT * FROM turns WHERE session_id = ? ORDER BY idx",
                            (template[cols.index("session_id")],))
        tkeep = [i for i, d in enumerate(tcur.description) if d[0] != "rowid"]
        tcols = [tcur.description[i][0] for i in tkeep]
        turns = [[r[i] for i in tkeep] for r in tcur.fetchall()][:turns_each]
        have = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
    s_sql = f"INSERT INTO sessions ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    t_sql = f"INSERT INTO turns ({', '.join(tcols)}) VALUES ({', '.join('?' * len(tcols))})"
    sid_at, tsid_at = cols.index("session_id"), tcols.index("session_id")
    times = [cols.index(c) for c in ("created_at", "finished_at") if c in cols]
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    added = 0
    while have + added < target:
        batch = min(2000, target - have - added)
        srows, trows = [], []
        for j in range(batch):
            sid = uuid.uuid4().hex
            row = list(template)
            row[sid_at] = sid
            for at in times:
                row[at] = (t0 + timedelta(seconds=added + j)).isoformat()
            srows.append(row)
            for t in turns:
                tr = list(t)
                tr[tsid_at] = sid
                trows.append(tr)
        with log.transaction(write=True) as conn:
            conn.executemany(s_sql, srows)
            conn.executemany(t_sql, trows)
        added += batch
    return have + added


def timed(fn: Any, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 2)


def run_scale(backend: Backend, sizes: Sequence[int]) -> list[dict[str, Any]]:
    from store.registry import Registry

    log = _open(backend.store)
    reg = Registry(log)
    out = []
    for size in sizes:
        n = bulk_copy(log, size)
        out.append({
            "sessions": n,
            "completed_unjudged_ms": timed(lambda: log.completed_unjudged()),
            "completed_unjudged_limit_100_ms": timed(lambda: log.completed_unjudged(limit=100)),
            "list_sessions_50_ms": timed(lambda: log.list_sessions(limit=50)),
            "registry_live_ms": timed(lambda: reg.live()),
            "data_window_ms": timed(lambda: reg.sessions_in_window(None, log.now())),
        })
        print(f"  {backend.name} at {n} sessions: {out[-1]}", flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=25, help="sessions per writer")
    ap.add_argument("--scale", default="10000,100000", help="session counts for the scaling part ('' skips it)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="store-load-"))
    report: dict[str, Any] = {"writers": args.writers, "sessions_per_writer": args.sessions, "cpus": os.cpu_count()}
    server = None
    try:
        backends: list[Backend] = []
        if args.backend in ("sqlite", "both"):
            backends.append(Backend("sqlite", StoreConfig(data_dir=work / "sqlite")))
        if args.backend in ("postgresql", "both"):
            from tests.postgres import PostgresServer, why_unavailable

            reason = why_unavailable()
            if reason:
                raise SystemExit(f"PostgreSQL is unavailable: {reason}")
            server = PostgresServer()
            server.start()
            backends.append(Backend("postgresql", StoreConfig(data_dir=work / "pg",
                                                              database_url=server.url(server.create_database()))))
        sizes = [int(s) for s in args.scale.split(",") if s.strip()]
        for b in backends:
            print(f"{b.name}: {args.writers} writers × {args.sessions} sessions, judge and registry beside", flush=True)
            entry: dict[str, Any] = {"load": run_load(b, args.writers, args.sessions, work)}
            print(f"  {entry['load']}", flush=True)
            entry["kill9"] = run_kill(b, work)
            print(f"  kill -9: {entry['kill9']}", flush=True)
            if sizes:
                entry["scale"] = run_scale(b, sizes)
            report[b.name] = entry
    finally:
        if server is not None:
            server.stop()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
