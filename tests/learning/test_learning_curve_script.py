"""The learning-curve script (issue 38): its order of work, what counts as done, the refusal to mix protocols, the
report over hand-made evaluation files, and (slow) a real run killed mid-step that resumes without repeating or losing
a step.

The full curve takes many hours on 2 cores (docs/learning_curve/); the slow test runs the same code at one step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import worker_threads
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "benchmarks" / "learning_curve.py"


@pytest.fixture(scope="module")
def lc() -> ModuleType:
    return load_script(SCRIPT)


def test_the_plan_starts_with_the_shared_init_point_then_goes_step_by_step_over_seeds_and_arms(lc: ModuleType) -> None:
    units = lc.plan(lc.CurveOptions())
    assert len(units) == 1 + 4 * 3 * 2 and units[0].run == "init"
    assert [(u.step, u.seed, u.arm) for u in units[1:3]] == [(5, 0, "ss-grpo"), (5, 0, "answer-only")]
    assert [u.step for u in units[1:]] == sorted(u.step for u in units[1:])
    opts = lc.CurveOptions()
    mine = [[u for u in units if lc.worker_of(opts, u, 2) == k] for k in (0, 1)]
    assert mine[0][0].run == "init" and {u.arm for u in mine[0][1:]} == {"ss-grpo"}
    assert {u.arm for u in mine[1]} == {"answer-only"} and len(mine[1]) == 12  # each run stays in one process
    assert all(lc.worker_of(opts, u, 1) == 0 for u in units)


def test_an_append_after_a_torn_line_keeps_every_new_record_and_duplicates_count_once(lc: ModuleType,
                                                                                    tmp_path: Path) -> None:
    path = tmp_path / "step-5.jsonl"
    path.write_text('{"item": "a", "sample": 0}\n{"item": "b", "sam')
    lc.append_records(path, [{"item": "b", "sample": 0}, {"item": "b", "sample": 1}])
    lc.append_records(path, [{"item": "a", "sample": 0, "again": True}])
    assert [(r["item"], r["sample"]) for r in lc.read_records(path)] == [("a", 0), ("b", 0), ("b", 1)]
    assert "again" not in lc.read_records(path)[0]  # the first record of a sample wins


def test_a_torn_line_is_ignored_and_a_question_counts_only_with_all_its_samples(lc: ModuleType, tmp_path: Path) -> None:
    from learning.eval.heldout import load_heldout

    items = load_heldout()[:2]
    path = tmp_path / "step-5.jsonl"
    rows = [{"item": items[0].id, "sample": 0}, {"item": items[0].id, "sample": 1}, {"item": items[1].id, "sample": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"item": "torn')
    assert len(lc.read_records(path)) == 3
    assert not lc.complete(path, items, 2) and lc.complete(path, items[:1], 2)


def test_a_state_folder_made_with_other_options_is_refused_naming_the_difference(lc: ModuleType,
                                                                                  tmp_path: Path) -> None:
    opts = lc.CurveOptions()
    lc.check_options(tmp_path, opts)
    lc.check_options(tmp_path, opts)  # the same options resume
    with pytest.raises(SystemExit, match="'lr': \\(5e-05, 0.001\\)"):
        lc.check_options(tmp_path, replace(opts, lr=1e-3))


def _records(run: str, arm: str, seed: int | None, step: int, items: list, total: float, precision: float) -> list:
    return [{"run": run, "arm": arm, "seed": seed, "step": step, "item": i.id, "sample": s,
             "scores": {"plan": total, "research": total, "review": total, "answer": total, "total": total},
             "figures": {"gold_recall": 0.5, "citation_precision": precision if i.gold_titles else None,
                         "citation_recall": 0.5, "cover_em": 0.0, "boxed": 0.0, "cited": 1.0},
             "answer": f"{run} answers {i.id}"} for i in items for s in range(2)]


def test_the_report_pools_complete_seeds_and_tests_the_last_common_step(lc: ModuleType, tmp_path: Path) -> None:
    from learning.eval.heldout import load_heldout

    items = load_heldout()[:12]
    opts = replace(lc.CurveOptions(), seeds=(0, 1), steps=10, items=12)

    def write(unit: object, records: list) -> None:
        path = lc.eval_path(tmp_path, unit)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))

    write(lc.Unit("init", 0, 0), _records("init", "init", None, 0, items, 0.40, 0.30))
    for seed in (0, 1):
        for step, gain in ((5, 0.05), (10, 0.10)):
            write(lc.Unit("ss-grpo", seed, step), _records(f"ss-grpo-s{seed}", "ss-grpo", seed, step, items,
                                                           0.40 + gain + 0.001 * seed, 0.30))
    write(lc.Unit("answer-only", 0, 5), _records("answer-only-s0", "answer-only", 0, 5, items, 0.41, 0.30))
    report = lc.build_report(opts, tmp_path, items, "cmd")
    assert report["curves"]["ss-grpo"]["steps"] == [0, 5, 10] and report["curves"]["answer-only"]["steps"] == [0, 5]
    assert report["curves"]["ss-grpo"]["seeds"][10] == [0, 1]
    final = report["final"]
    assert final["step"] == 5  # the last step both arms have
    d = final["minus_init"]["ss-grpo"]["total"]
    assert d["mean"] == pytest.approx(0.0505) and d["n"] == 12 and d["p"] < 0.01
    # arm against arm only over the seeds both have at that step (answer-only has seed 0 alone): 0.45 − 0.41
    assert final["seeds_compared"] == [0] and final["ss-grpo_minus_answer-only"]["total"]["mean"] == pytest.approx(0.04)
    # the reward rose on every question while citation precision stayed: the verdict says so, with an example
    assert final["co_movement"]["ss-grpo"]["reward_hacking"] is True
    assert final["hacking_example"]["ss-grpo"]["after"]["answer"].startswith("ss-grpo-s")
    assert report["progress"]["units_done"] == 1 + 2 + 1  # init, ss-grpo@5 ×2 seeds, answer-only-s0@5 (no bank yet)
    md = lc.summary_md(report)
    assert "| ss-grpo − init |" in md and "reward hacking of the offline judge: **yes**" in md


def test_protocol_v2_plans_whole_runs_with_the_floor_and_only_finished_units_reach_out(lc: ModuleType,
                                                                                       tmp_path: Path) -> None:
    """Issue 45: one unit per run (trained, then evaluated once), the start with more samples, the RAG floor; OUT
    holds finished units only, and a new machine's empty state folder takes them from OUT (never redone)."""
    from learning.eval.heldout import load_heldout

    opts, args = lc.parse_args(["--out", str(tmp_path / "out"), "--protocol", "v2"])
    assert args.runs.name == "learning_curve_v2"  # never the first protocol's state folder
    units = lc.plan(opts)
    assert [u.run for u in units] == ["init", "init", "rag", "ss-grpo-s0", "answer-only-s0", "ss-grpo-s1",
                                      "answer-only-s1", "ss-grpo-s2", "answer-only-s2"]
    assert all(u.step == opts.steps == 3 for u in units[3:])
    assert [lc.worker_of(opts, u, 2) for u in units] == [0, 1, 1, 0, 1, 0, 1, 0, 1]
    assert [lc.samples_of(opts, u) for u in units[:4]] == [range(0, 1), range(1, 2), range(2), range(1)]
    assert lc.eval_path(tmp_path, units[0]) != lc.eval_path(tmp_path, units[1])  # each start unit its own file
    units = units[:2] + units[3:]  # the start's two units, then the runs'
    (tmp_path / "runs").mkdir()
    cfg = lc.make_config(opts, units[2], tmp_path / "runs")
    assert cfg.verifiable_weight == 0.5 and (cfg.batch_questions, cfg.rollouts, cfg.steps) == (2, 4, 3)
    golds = [json.loads(line) for line in cfg.questions.read_text().splitlines()]  # type: ignore[union-attr]
    assert len(golds) == 128 and all(g["answers"] and g["gold_titles"] for g in golds)

    items = load_heldout()[:3]
    opts = replace(opts, items=3)
    runs, out = tmp_path / "runs", tmp_path / "out"
    init = units[0]
    path = lc.eval_path(runs, init)
    path.parent.mkdir(parents=True)
    recs = [r for r in _records("init", "init", None, 0, items, 0.4, 0.3) if r["sample"] == 0]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    half = lc.eval_path(runs, units[2])  # ss-grpo-s0 in progress: one question of three
    half.parent.mkdir(parents=True)
    half.write_text(json.dumps(_records("ss-grpo-s0", "ss-grpo", 0, 3, items, 0.5, 0.3)[0]) + "\n")
    lc.write_outputs(opts, runs, items, out, "cmd")
    assert (out / "samples" / "init" / "step-0-sample-0.jsonl").is_file()
    assert lc.build_report(opts, runs, items, "cmd")["curves"]["ss-grpo"]["steps"] == []  # the start needs both
    assert not (out / "samples" / "ss-grpo-s0").exists()  # a unit in progress never reaches OUT

    rows = runs / "train" / "ss-grpo-s0" / "metrics.jsonl"  # a run still training: its rows stay out of the report
    rows.parent.mkdir(parents=True)
    rows.write_text(json.dumps({"step": 0, "groups": 2}) + "\n")
    assert lc.build_report(opts, runs, items, "cmd")["train"] == {}
    lc.write_outputs(opts, runs, items, out, "cmd")
    assert not (out / "train").exists()

    fresh = tmp_path / "new-machine"
    assert lc.seed_state(fresh, out) == 1
    assert lc.unit_done(opts, fresh, items, init) and not lc.unit_done(opts, fresh, items, units[2])
    assert lc.seed_state(fresh, out) == 0  # what the state folder has is left alone


def test_a_state_folder_from_before_a_new_option_still_matches_its_defaults(lc: ModuleType, tmp_path: Path) -> None:
    opts = lc.CurveOptions()
    old = json.loads(json.dumps(lc.asdict(opts)))
    for added in ("init_samples", "verifiable_weight", "rag"):
        del old[added]
    (tmp_path / "options.json").write_text(json.dumps(old))
    lc.check_options(tmp_path, opts)  # the fields it lacks compare as their defaults
    with pytest.raises(SystemExit, match="other options"):
        lc.check_options(tmp_path, lc.PROTOCOL_V2)


def test_commit_outputs_commits_the_report_folder_and_nothing_else(lc: ModuleType, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    out = repo / "docs" / "curve"
    out.mkdir(parents=True)
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    (repo / "code.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "code.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (repo / "code.py").write_text("x = 2  # work in progress\n")
    subprocess.run([*git, "add", "code.py"], check=True)  # even a staged change elsewhere stays out
    (out / "summary.md").write_text("results\n")
    said: list[str] = []
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org"}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        lc.commit_outputs(out, "unit done", said.append)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert said and said[0].startswith("committed"), said
    shown = subprocess.run([*git, "show", "--name-only", "--format=%s", "HEAD"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert shown[:2] == ["unit", "done"] and "docs/curve/summary.md" in shown and "code.py" not in shown
    lc.commit_outputs(tmp_path / "not-a-repo", "x", said.append)  # a failure is said, never raised
    assert "failed" in said[-1]


@pytest.mark.slow
def test_a_run_killed_mid_step_resumes_without_repeating_or_losing_a_step(smollm2_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    out, runs = tmp_path / "out", tmp_path / "runs"
    # --threads: this worker's share of the CPUs (tests/conftest.py, worker_threads). The script's default is every
    # CPU, for torch and as a fixed llama.cpp count (fixed: no back-off); beside a second xdist worker that is more
    # spinning threads than cores, and this test ran past its timeout (issue 61). In one process: every CPU, as before.
    cmd = [sys.executable, str(SCRIPT), "--quick", "--arms", "ss-grpo", "--steps", "2", "--eval-every", "2",
           "--items", "1", "--bank-reflections", "0", "--model-dir", str(smollm2_dir), "--runs", str(runs),
           "--out", str(out), "--threads", str(worker_threads())]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = tmp_path / "first.log"
    with log.open("w") as fh:
        first = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    metrics = runs / "train" / "ss-grpo-s0" / "metrics.jsonl"
    checkpoint = runs / "train" / "ss-grpo-s0" / "checkpoints" / "step-000000"
    deadline = time.monotonic() + 900
    try:  # kill it once step 1 is checkpointed, while step 2 is under way
        while not checkpoint.is_dir() and first.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        assert first.poll() is None, log.read_text()[-3000:]
    finally:  # never leave it running: a leaked run would hold both cores for the rest of the suite
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # at once: step 2 (two rollouts and an update) is seconds away
        first.wait()
    assert not (out / "curve.json").is_file() or json.loads((out / "curve.json").read_text())["progress"][
        "units_done"] < 2
    second = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    said = f"first run:\n{log.read_text()[-2500:]}\nsecond run:\n{second.stderr[-2500:]}"
    assert second.returncode == 0, said
    assert "resumed from checkpoint step 0" in second.stderr, said  # not from scratch: step 1's work was kept
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1], (rows, said)  # each step logged exactly once
    report = json.loads((out / "curve.json").read_text())
    assert report["progress"]["units_done"] == report["progress"]["units_total"] == 2, (report["progress"], said)
    assert report["curves"]["ss-grpo"]["steps"] == [0, 2], (report["curves"]["ss-grpo"]["steps"], said)
    samples = (out / "samples" / "ss-grpo-s0" / "step-2.jsonl").read_text().splitlines()
    assert len(samples) == 1 and json.loads(samples[0])["policy_version"] == "ss-grpo-s0@2", (samples, said)
