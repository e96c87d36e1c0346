"""Adapters per team, measured (a script, not a test; issue 49 item 5): two synthetic teams, each asking questions
of its own corpus topic, each team's adapter trained by the product's own team cycle on that team's sessions only,
then every team's held-out questions researched under its own adapter, under the other team's and under the global
policy, with the figures a small model can move (gold-passage recall of the searches, citation precision) and the
offline judge's reward.

How it runs (all on the embedded default: in-process SmolLM2 with the shipped SFT adapter as the global policy,
llama.cpp decoding, the bundled corpus, SQLite):
1. Two teams, `culture` (films, music, books, television, art, games) and `history` (everything else: people,
   places, institutions, events), split by a keyword rule on each question and its gold titles (`topic`). Each team
   has two consenting members; three more people, who do not consent, ask the held-out questions: one in each team and
   one in no team (the global policy). Their sessions never enter a training window.
2. Each team's members ask `--train-sessions` questions of their topic from the SFT training split (never a held-out
   question: the guard in the cycle refuses them), then `app.scheduler.run_cycle(team=...)` runs the team's cycle:
   judge, one SS-GRPO step (by default) from the global live version, the two-part team gate, promotion. The gate's
   tolerance is wide (`--tolerance`, default 1.0) so that both teams get an adapter to measure; the gate's report
   is kept in the results either way.
3. Each team's first `--items` held-out questions with gold passages (alternating HotpotQA and MuSiQue) are asked by
   the three non-consenting people, so each question is served by the team's own adapter, by the other team's and by
   the global policy, with the same sampling seed (common random numbers). Which version served each session is read
   back from the session's own record (`metrics.serving`). Each session is judged alone by the offline judge.
4. Paired over questions: own − global and own − other, mean with a 95% bootstrap interval and a sign-flip p.

Resumable: `--runs` (default .cache/team_adapters) keeps the store; a team with a live version is not trained again,
and an evaluation record already written is not redone. Results: OUT/team_adapters.json, OUT/summary.md and
OUT/samples.jsonl (every evaluation session's figures and answer).

    .venv/bin/python tests/benchmarks/team_adapters.py --out docs/teams
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from learning_check import judged_scores  # noqa: E402

from agent.config import SHIPPED_SFT_ADAPTER, AgentConfig, RunOptions, StageTokenCaps  # noqa: E402
from app.settings import Settings  # noqa: E402
from learning.config import LearningConfig, RetrainConfig  # noqa: E402
from learning.engines.threads import cpu_model  # noqa: E402
from learning.eval import curve  # noqa: E402
from learning.eval.datasets import bench_spec  # noqa: E402
from learning.eval.heldout import HeldoutItem, load_heldout, session_figures  # noqa: E402
from store.config import StoreConfig  # noqa: E402
from store.owner import acting_as  # noqa: E402
from store.registry import Registry  # noqa: E402
from store.session_log import SessionLog  # noqa: E402
from store.teams import Teams  # noqa: E402
from store.users import Users  # noqa: E402

TEAMS = ("culture", "history")
TRAIN_SPLIT = ROOT / "learning" / "sft" / "data" / "train"
# The topic rule (a decision for this benchmark): a question is `culture` when it or one of its gold titles names a
# work or an artist; everything else is `history`. Read against the 32 held-out questions with gold passages it
# gives 15 and 17 (those asked are listed in the summary), and it is applied the same way to the training split.
_CULTURE = re.compile(r"\b(films?|movie|song|album|band|novel|sitcom|voice|video game|photographer|painter|rapper|"
                      r"play|author|writer|novelist|magazine|music\w*|singer|actor|actress|television|tv|book|episode|"
                      r"directed|director|starring|comic|opera|poem|poet)\b", re.I)
ADAPTERS = ("own", "other", "global")
METRICS = ("gold_recall", "citation_precision", "total")
# The learning curve's research options (docs/learning_curve): the shipped SFT adapter's plans need ~352 tokens.
CAPS = StageTokenCaps(plan=352, research=128, review=224, answer=160)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def topic(question: str, titles: Sequence[str] = ()) -> str:
    return "culture" if _CULTURE.search(" ".join((question, *titles))) else "history"


def heldout_items(team: str, n: int) -> list[HeldoutItem]:
    """The team's first `n` held-out questions with gold passages, alternating sources (HotpotQA, MuSiQue)."""
    by_source: dict[str, list[HeldoutItem]] = {}
    for item in load_heldout():
        if item.gold_titles and topic(item.question, item.gold_titles) == team:
            by_source.setdefault(item.source, []).append(item)
    mixed = [i for pair in zip(*by_source.values(), strict=False) for i in pair]
    rest = [i for items in by_source.values() for i in items if i not in mixed]
    return (mixed + rest)[:n]


def train_questions(team: str, n: int) -> list[str]:
    """`n` questions of the team's topic from the SFT training split (distinct, in the split's order)."""
    seen: list[str] = []
    for name in ("hotpotqa", "musique"):
        for e in bench_spec(name).loader(TRAIN_SPLIT):
            if e.question not in seen and topic(e.question, e.metadata.get("supporting_titles") or ()) == team:
                seen.append(e.question)
    return seen[::max(1, len(seen) // n)][:n]  # spread over the split, not its first few


def make_settings(runs: Path, a: argparse.Namespace) -> Settings:
    from learning.engines.weights import bundled_gguf_path, ensure_converted

    probes = runs / "general-probes.txt"  # the global gate set: two bundled-corpus questions of neither team's list
    probes.parent.mkdir(parents=True, exist_ok=True)
    probes.write_text("Who was Haymo of Faversham?\nWhat is the Franciscan order?\n", encoding="utf-8")
    retrain = RetrainConfig(steps=a.steps, rollouts=a.rollouts, batch_questions=2, max_token_caps=96,
                            probe_questions=probes, probe_samples=1, tolerance=a.tolerance,
                            min_new_sessions=a.train_sessions, unload_grace_s=0)
    defaults = RunOptions(format="exact_answer", max_tool_calls=2, temperature=0.8, seed=0, token_caps=CAPS)
    agent = AgentConfig(embedded_model_path=ensure_converted(ROOT / ".cache" / "models"),
                        embedded_adapter_path=SHIPPED_SFT_ADAPTER, embedded_engine="llamacpp",
                        embedded_gguf_path=bundled_gguf_path(), defaults=defaults, local_search_k=3,
                        snippet_chars=300)
    s = Settings(agent=agent, store=StoreConfig(data_dir=runs / "data"), learning=LearningConfig(retrain=retrain))
    return s.model_copy(update={"learning": s.learning.model_copy(update={
        "judge": s.learning.judge.model_copy(update={"base_url": None})})})  # the offline judge


def set_up_people(log: SessionLog) -> None:
    users, teams = Users(log), Teams(log)
    known = {u.user_id for u in users.list()}
    for team in TEAMS:
        if team not in teams.names():
            teams.add(team)
        for who, consent in ((f"member-1@{team}.example", True), (f"member-2@{team}.example", True),
                             (f"eval@{team}.example", False)):
            if who not in known:
                users.add(who, kind="oidc", consent=consent)
                teams.assign(who, team)
    if "eval@global.example" not in known:
        users.add("eval@global.example", kind="oidc", consent=False)


async def train_team(settings: Settings, team: str, n_sessions: int) -> dict[str, Any]:
    """The team's members ask its training questions; then the team's own cycle runs (once: a team with a live
    version of its own is not trained again)."""
    from app.container import build
    from app.scheduler import run_cycle

    log = SessionLog(settings.store.sqlite_path)
    reg = Registry(log)
    live = reg.team_live(team)
    if live is not None:
        return {"cycle": live.training_run, "version": live.name, "resumed": True}
    asked = len(reg.sessions_in_window(None, log.now(), team=team))
    if asked < n_sessions:
        services = build(settings)
        try:
            for k, question in enumerate(train_questions(team, n_sessions)[asked:], asked):
                began = time.perf_counter()
                with acting_as(f"member-{k % 2 + 1}@{team}.example"):
                    out = await services.research.run(question, settings.agent.defaults.model_copy(
                        update={"seed": 7_000 + k}), source="chat")
                say(f"{team}: training session {k + 1}/{n_sessions} on {out.policy_version} "
                    f"({time.perf_counter() - began:.0f}s): {question[:70]}")
        finally:
            await services.policy.aclose()  # type: ignore[attr-defined]
    began = time.perf_counter()
    result = await run_cycle(settings, trigger="cli", force=True, team=team, say=lambda m: say(f"{team}: {m}"))
    if result.cycle.team != team:  # a cycle a kill left running was resumed first: now this team's own
        result = await run_cycle(settings, trigger="cli", force=True, team=team, say=lambda m: say(f"{team}: {m}"))
    say(f"{team}: {result.message} ({time.perf_counter() - began:.0f}s)")
    gate = reg.get(result.candidate).eval_report if result.candidate else None
    return {"cycle": result.cycle.cycle_id, "status": result.cycle.status, "version": result.candidate,
            "message": result.message, "numbers": result.cycle.numbers, "gate": gate,
            "seconds": round(time.perf_counter() - began, 1)}


def read_samples(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut off by a kill: that session is redone
            continue
    return rows


def asker(team: str, adapter: str) -> str:
    other = TEAMS[1 - TEAMS.index(team)]
    return {"own": f"eval@{team}.example", "other": f"eval@{other}.example", "global": "eval@global.example"}[adapter]


async def evaluate(settings: Settings, items: Mapping[str, Sequence[HeldoutItem]], path: Path) -> None:
    """Every team's held-out questions under its own adapter, the other team's and the global policy's."""
    from app.container import build, build_judge

    done = {(r["team"], r["item"], r["adapter"]) for r in read_samples(path)}
    # Question by question, the two teams alternating: a run stopped early still has both teams' first questions.
    todo = [(t, items[t][k], a) for k in range(max(map(len, items.values()))) for t in TEAMS if k < len(items[t])
            for a in ADAPTERS if (t, items[t][k].id, a) not in done]
    if not todo:
        return
    log = SessionLog(settings.store.sqlite_path)
    reg = Registry(log)
    expected: dict[str, str] = {}
    for team in TEAMS:  # without its own version a team's "own" rows would silently measure the global policy
        live = reg.team_live(team)
        if live is None:
            raise SystemExit(f"team {team} has no version of its own (its cycle was skipped or rejected): "
                             "see training.json; nothing to compare")
        expected[team] = live.name
    services = build(settings)
    judge = build_judge(settings, log)
    try:
        for n, (team, item, adapter) in enumerate(todo, 1):
            seed = 100_000 + sum(map(ord, item.id))  # the same for all three adapters: common random numbers
            opts = settings.agent.defaults.model_copy(update={"seed": seed, "format": item.format})
            began = time.perf_counter()
            with acting_as(asker(team, adapter)):
                out = await services.research.run(item.question, opts, source="eval")
            seconds = time.perf_counter() - began
            other = TEAMS[1 - TEAMS.index(team)]
            # The global live alias `base` is served under the deployment's starting adapter's own name ("sft").
            want = {"own": expected[team], "other": expected[other], "global": None}[adapter]
            serving = dict(log.get(out.session_id).metrics.get("serving") or {})  # type: ignore[call-overload]
            wrong = out.policy_version != want if want else out.policy_version.startswith("team:")
            if wrong or serving.get("warning"):
                raise SystemExit(f"{team}/{adapter} session {out.session_id} was served by {out.policy_version}, "
                                 f"not {want} ({serving.get('warning') or 'no warning'}); not recorded")
            (judgement,) = await judge.judge_group(item.question, [out.trajectory])
            row = {"team": team, "item": item.id, "adapter": adapter, "asked_by": asker(team, adapter),
                   "version": out.policy_version, "serving": serving,
                   "seed": seed, "scores": {k: round(v, 4) for k, v in judged_scores(judgement).items()},
                   "figures": session_figures(item, out.trajectory, out.report),
                   "cited_titles": [r.title for r in out.report.references], "answer": out.report.body[:400],
                   "seconds": round(seconds, 1)}
            with path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")
            say(f"eval {n}/{len(todo)} {team}/{adapter} on {out.policy_version}: {item.id} total "
                f"{row['scores']['total']:.3f} gold recall {row['figures']['gold_recall']} ({seconds:.0f}s)")
    finally:
        await services.policy.aclose()  # type: ignore[attr-defined]


def _value(row: Mapping[str, Any], metric: str) -> float | None:
    v = row["scores"].get(metric) if metric == "total" else row["figures"].get(metric)
    return None if v is None else float(v)


def report(rows: Sequence[Mapping[str, Any]], training: Mapping[str, Any], items: Mapping[str, Sequence[HeldoutItem]],
           a: argparse.Namespace) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for team in TEAMS:
        ids = {i.id for i in items[team]}  # a later run with fewer --items reports on those only
        by = {ad: {r["item"]: r for r in rows if r["team"] == team and r["adapter"] == ad and r["item"] in ids}
              for ad in ADAPTERS}
        cells: dict[str, Any] = {}
        for ad in ADAPTERS:
            rs = list(by[ad].values())
            cells[ad] = {"n": len(rs), "versions": sorted({r["version"] for r in rs}),
                         "seconds_median": round(statistics.median(r["seconds"] for r in rs), 1) if rs else None,
                         **{m: _mean([_value(r, m) for r in rs]) for m in METRICS}}
        diffs: dict[str, Any] = {}
        for ref in ("global", "other"):
            common = sorted(set(by["own"]) & set(by[ref]))
            for m in METRICS:
                d = [x - y for i in common if (x := _value(by["own"][i], m)) is not None
                     and (y := _value(by[ref][i], m)) is not None]
                ci = [round(x, 4) for x in curve._bootstrap(d, 2000, 0)] if len(d) > 1 else None
                diffs[f"own-{ref}/{m}"] = {"n": len(d), "mean": _mean(d), "ci95": ci,
                                           "p": round(curve.sign_flip_p(d), 4) if d else None}
        table[team] = {"adapters": cells, "paired": diffs, "questions": [i.id for i in items[team]]}
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    return {"command": " ".join(sys.argv), "commit": commit, "cpu": cpu_model(), "cores": os.cpu_count(),
            "platform": platform.platform(), "options": vars(a) | {"runs": str(a.runs), "out": str(a.out)},
            "training": training, "teams": table}


def _mean(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.fmean(vals), 4) if vals else None


def summary_md(rep: Mapping[str, Any], items: Mapping[str, Sequence[HeldoutItem]]) -> str:
    lines = ["# Adapters per team, measured (issue 49)", "",
             f"`{rep['command']}` at `{rep['commit']}` on {rep['cpu']} ({rep['cores']} cores).", "",
             "## Training (each team's own cycle)", "",
             "| team | cycle | version | status | sessions | train s | gate |", "|---|---|---|---|---|---|---|"]
    for team, t in rep["training"].items():
        numbers = t.get("numbers") or {}
        gate = (t.get("gate") or {}).get("reason", "")
        lines.append(f"| {team} | {t.get('cycle')} | {t.get('version')} | {t.get('status', 'promoted')} | "
                     f"{numbers.get('new_sessions', '')} | {numbers.get('train_seconds', '')} | {gate} |")
    lines += ["", "## Held-out questions of each team, under each adapter", "",
              "| team | adapter | served by | n | gold recall | citation precision | judge total | median s |",
              "|---|---|---|---|---|---|---|---|"]
    for team, t in rep["teams"].items():
        for ad, c in t["adapters"].items():
            lines.append(f"| {team} | {ad} | {', '.join(c['versions'])} | {c['n']} | {c['gold_recall']} | "
                         f"{c['citation_precision']} | {c['total']} | {c['seconds_median']} |")
    lines += ["", "Paired over the team's questions (mean, 95% bootstrap interval, sign-flip p):", "",
              "| team | difference | gold recall | citation precision | judge total |", "|---|---|---|---|---|"]
    for team, t in rep["teams"].items():
        for ref in ("global", "other"):
            cells = []
            for m in METRICS:
                d = t["paired"][f"own-{ref}/{m}"]
                cells.append(f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] p={d['p']}"
                             if d["mean"] is not None and d["ci95"] else "n/a")
            lines.append(f"| {team} | own − {ref} | " + " | ".join(cells) + " |")
    lines += ["", "Questions (held-out, with gold passages):", ""]
    for team in TEAMS:
        lines.append(f"- {team}: " + "; ".join(f"`{i.id}` {i.question[:60]}" for i in items[team]))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, default=ROOT / ".cache" / "team_adapters")
    ap.add_argument("--out", type=Path, default=None, help="where the results go (default: RUNS)")
    ap.add_argument("--train-sessions", type=int, default=4, help="sessions each team's members ask before its cycle")
    ap.add_argument("--steps", type=int, default=1, help="SS-GRPO steps of each team's cycle")
    ap.add_argument("--rollouts", type=int, default=4)
    ap.add_argument("--tolerance", type=float, default=1.0, help="the team gate's tolerance")
    ap.add_argument("--items", type=int, default=8, help="held-out questions per team")
    ap.add_argument("--only", choices=("train", "eval"), default=None)
    a = ap.parse_args(argv)
    a.out = a.out or a.runs
    settings = make_settings(a.runs, a)
    log = SessionLog(settings.store.sqlite_path)
    set_up_people(log)
    items = {t: heldout_items(t, a.items) for t in TEAMS}
    training_path = a.runs / "training.json"
    training: dict[str, Any] = json.loads(training_path.read_text()) if training_path.is_file() else {}
    if a.only != "eval":
        for team in TEAMS:
            if team not in training:
                training[team] = asyncio.run(train_team(settings, team, a.train_sessions))
                training_path.write_text(json.dumps(training, indent=1, default=str))
    samples = a.runs / "samples.jsonl"
    if a.only != "train":
        asyncio.run(evaluate(settings, items, samples))
    rep = report(read_samples(samples), training, items, a)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "team_adapters.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    (a.out / "summary.md").write_text(summary_md(rep, items))
    if a.out != a.runs:
        (a.out / "samples.jsonl").write_text(samples.read_text() if samples.is_file() else "")
    print((a.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
