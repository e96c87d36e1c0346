"""The evaluation runner end to end: real ResearchService, SessionLog and local_search; the embedded SmolLM2 for
one small HotpotQA run, a scripted policy (exact answers) for the scoring, failure, resume, tokens-and-cost and
runs-over-seeds paths.

The two HotpotQA tests ask the first two shipped held-out questions (learning/sft/data/heldout, paired with the bundled
demo corpus); every other test writes its own data. None needs ../shared, so all run on a fresh clone."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.accounting import ModelPrice
from agent.config import AgentConfig, RunOptions, StageTokenCaps
from agent.tools.local_search import LocalSearch
from app.service import ResearchService
from learning.eval.datasets import DatasetError
from learning.eval.runner import EvalOutputConflict, EvalSummary, JudgeRequiredError, run_eval, run_eval_seeds
from learning.eval.usage import TOKEN_KEYS, policy_tokens
from learning.judge.client import JudgeClient
from store.records import HISTORY_SOURCES
from store.registry import Registry
from store.session_log import SessionLog
from tests.agent.scripts import stage_of
from tests.eval.support import HELDOUT, SCRIPTED_OPTIONS, answering, user_prompt
from tests.fakes import ScriptedPolicy
from tests.judge.openai_standin import OpenAIStandIn, Reply

TINY = RunOptions(
    max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=300,
    token_caps=StageTokenCaps(plan=32, research=24, review=24, answer=32),
)  # fmt: skip
# The first two held-out questions: "If Gallu is a demon Lilu is what?" (gold "a spirit") and "What language were books
# being translated into during the era of Haymo of Faversham?" (gold "Latin"; the script answers it wrongly).
HOTPOT_ANSWERS = {"If Gallu is a demon": "a spirit", "era of Haymo of Faversham": "Greek"}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


def evaluate(
    bench: str,
    data: Path,
    service: ResearchService,
    out: Path,
    *,
    standin: OpenAIStandIn | None = None,
    options: RunOptions = SCRIPTED_OPTIONS,
    **kw: Any,
) -> EvalSummary:
    """run_eval on a fresh event loop, with a JudgeClient on the stand-in when one is given."""

    async def go() -> EvalSummary:
        if standin is None:
            return await run_eval(bench, data, service=service, options=options, out_dir=out, **kw)
        async with JudgeClient(standin.root, "standin-judge", max_retries=0, backoff_s=0.01) as judge:
            return await run_eval(bench, data, service=service, options=options, out_dir=out, judge=judge, **kw)

    return asyncio.run(go())


@pytest.mark.slow
def test_embedded_policy_hotpotqa_end_to_end_and_resume(
    embedded_policy: object,
    hotpot_tools: dict,  # type: ignore[type-arg]
    tmp_path: Path,
) -> None:
    log = SessionLog(tmp_path / "sessions.sqlite3")
    service = ResearchService(embedded_policy, hotpot_tools, log, AgentConfig())  # type: ignore[arg-type]
    seen: list[tuple[int, int, str]] = []
    out = tmp_path / "out"
    summary = evaluate(
        "hotpotqa", HELDOUT, service, out, options=TINY, limit=2, progress=lambda d, t, i: seen.append((d, t, i))
    )
    records = lines(out / "items.jsonl")
    assert len(records) == 2 and [d for d, _, _ in seen] == [1, 2]
    for rec in records:
        assert rec["status"] == "ok", rec.get("error")
        assert {"em", "f1", "cover_em"} <= rec["metrics"].keys() and rec["injection"] == "off"
        assert log.get(rec["session_id"]).status == "completed"
    assert summary.n == 2 and summary.n_scored == 2 and summary.n_failed == 0
    assert {"em", "f1", "cover_em"} <= summary.metrics.keys() and summary.injection == "off"
    assert summary.policy_version == embedded_policy.policy_version  # type: ignore[attr-defined]
    assert "| em |" in summary.summary_md.read_text() and summary.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(summary.summary_json.read_text())["n_scored"] == 2

    before = (out / "items.jsonl").read_bytes()
    again = evaluate("hotpotqa", HELDOUT, service, out, options=TINY, limit=2)
    assert (out / "items.jsonl").read_bytes() == before  # nothing was run again
    assert len(log.list_sessions()) == 2
    assert again.metrics == summary.metrics


def test_exact_answers_score_em_and_the_llm_grade(
    scripted_service: Callable[..., ResearchService], tmp_path: Path, standin: OpenAIStandIn
) -> None:
    standin.responder = lambda req: json.dumps({
        "explanation": "x", "grade": "correct" if "Predicted answer: a spirit" in user_prompt(req) else "incorrect"
    })  # fmt: skip
    service = scripted_service(HOTPOT_ANSWERS)
    summary = evaluate("hotpotqa", HELDOUT, service, tmp_path / "out", standin=standin, limit=2)
    first, second = lines(tmp_path / "out" / "items.jsonl")
    assert [first["id"], second["id"]] == ["5a77ec115542992a6e59dff7", "5a7decc75542995f4f40230f"]
    assert [first["answers"], second["answers"]] == [["a spirit"], ["Latin"]]
    assert first["prediction"] == "a spirit" and first["metrics"]["em"] == 1.0
    assert second["prediction"] == "Greek" and second["metrics"]["em"] == 0.0  # gold is "Latin"
    assert first["judge"]["grade"] == "correct" and second["judge"]["grade"] == "incorrect"
    assert summary.metrics["em"] == 0.5 and summary.metrics["llm_accuracy"] == 0.5
    assert summary.judge_model == "standin-judge" and summary.judge_usage["calls"] == 2
    # D10: the run itself had injection off and the benchmark's answer format
    opts = service.log.get(first["session_id"]).options
    assert opts["inject_bank"] is False and opts["format"] == "exact_answer"


def test_failed_runs_are_recorded_then_retried_on_request(
    scripted_service: Callable[..., ResearchService], tmp_path: Path
) -> None:
    data = tmp_path / "qa.jsonl"
    rows = [
        {"id": "long", "question": "Who? " * 40, "answer": "x"},
        {"id": "ok", "question": "Who won?", "answer": "x"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "out"
    strict = scripted_service({"Who": "x"}, max_question_chars=100)
    summary = evaluate("shortform", data, strict, out)
    failed, ok = lines(out / "items.jsonl")
    assert failed["status"] == "failed" and failed["error"].startswith("InputError") and "metrics" not in failed
    assert ok["status"] == "ok" and ok["metrics"]["em"] == 1.0
    assert summary.n_failed == 1 and summary.n_scored == 1 and summary.metrics["em"] == 1.0
    assert "InputError" in summary.summary_md.read_text()

    relaxed = scripted_service({"Who": "x"})
    assert evaluate("shortform", data, relaxed, out).n_failed == 1  # a plain rerun keeps the recorded failure
    retried = evaluate("shortform", data, relaxed, out, retry_failed=True)
    assert retried.n_failed == 0 and retried.n_scored == 2
    assert [r["id"] for r in lines(out / "items.jsonl")] == ["long", "ok", "long"]


def _healthbench_folder(root: Path) -> Path:
    folder = root / "hb"
    folder.mkdir()
    recs = [
        {"prompt_id": "knee", "prompt": [{"role": "user", "content": "my knee hurts"}],
         "rubrics": [{"criterion": "Advises rest", "points": 5, "tags": []},
                     {"criterion": "Recommends opioids", "points": -4, "tags": []}]},
        {"prompt_id": "head", "prompt": [{"role": "user", "content": "my head aches"}],
         "rubrics": [{"criterion": "Asks about onset", "points": 4, "tags": []}]},
    ]  # fmt: skip
    (folder / "sample.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return folder


def test_healthbench_judge_failure_is_recorded_never_zero(
    scripted_service: Callable[..., ResearchService], tmp_path: Path, standin: OpenAIStandIn
) -> None:
    def respond(req: dict[str, Any]) -> Reply:
        prompt = user_prompt(req)
        if "my head aches" in prompt:
            return Reply(status=500, error_message="judge overloaded")
        return Reply(content=json.dumps({"explanation": "x", "criteria_met": "Advises rest" in prompt}))

    standin.responder = respond
    out = tmp_path / "out"
    summary = evaluate("healthbench", _healthbench_folder(tmp_path), scripted_service({}), out, standin=standin)
    knee, head = lines(out / "items.jsonl")
    assert knee["metrics"]["score"] == 1.0 and knee["format"] == "short_form"
    assert head["status"] == "ok" and "score" not in head["metrics"]
    assert head["judge_error"].startswith("JudgeUnavailable")
    assert summary.n_scored == 1 and summary.n_judge_failed == 1
    assert summary.metrics == {"score": 1.0, "score_unclipped": 1.0, "score_item_clipped": 1.0}


def test_rubric_benchmark_without_a_judge_fails_before_anything_runs(
    scripted_service: Callable[..., ResearchService], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(JudgeRequiredError, match="RUBRICEM_LEARNING__JUDGE__BASE_URL"):
        evaluate("healthbench", _healthbench_folder(tmp_path), scripted_service({}), out)
    with pytest.raises(DatasetError):
        evaluate("healthbench", tmp_path / "missing", scripted_service({}), out)
    assert not out.exists()


def test_an_output_folder_never_mixes_evaluations(
    scripted_service: Callable[..., ResearchService], tmp_path: Path
) -> None:
    data = tmp_path / "qa.csv"
    data.write_text("question,answer\nWho won?,x\n", encoding="utf-8")
    service = scripted_service({"Who": "x"})
    evaluate("shortform", data, service, tmp_path / "out")
    with pytest.raises(EvalOutputConflict, match="injection"):
        evaluate("shortform", data, service, tmp_path / "out", inject_bank=True)
    on = evaluate("shortform", data, service, tmp_path / "on", inject_bank=True)
    assert on.injection == "on" and lines(tmp_path / "on" / "items.jsonl")[0]["injection"] == "on"


def test_eval_sessions_never_reach_training_reflection_or_the_chat_history(
    scripted_service: Callable[..., ResearchService], tmp_path: Path
) -> None:
    """A benchmark run logs its sessions as `eval`: the next retraining window, the judge's and the reflection
    writer's queues and the chat sidebar's history all leave them out, while a user's session beside them is kept."""
    data = tmp_path / "qa.csv"
    data.write_text("question,answer\nWho won?,x\nWho lost?,y\n", encoding="utf-8")
    service = scripted_service({"Who": "x"})
    registry = Registry(service.log)
    summary = evaluate("shortform", data, service, tmp_path / "out")
    assert summary.n_scored == 2
    users = asyncio.run(service.run("Who won the cup?", SCRIPTED_OPTIONS, source="chat")).session_id

    eval_ids = [r["session_id"] for r in lines(tmp_path / "out" / "items.jsonl")]
    for sid in eval_ids:
        rec = service.log.get(sid)
        assert rec.status == "completed" and rec.source == "eval" and rec.training_opt_out
    log = service.log
    assert registry.sessions_in_window(None, log.now()) == [users]
    assert log.completed_unjudged() == [users]
    assert [s.session_id for s in log.list_sessions(sources=HISTORY_SOURCES)] == [users]
    assert {s.session_id for s in log.list_sessions(sources=["eval"])} == set(eval_ids)
    # Even a judgement recorded for an eval session (by hand here) does not offer it to the reflection writer.
    for sid in (*eval_ids, users):
        log.record_judgement(sid, "offline", {"stages": {}})
    assert log.sessions_without_reflection() == [users]


def test_tokens_and_cost_per_item_and_in_total(
    scripted_service: Callable[..., ResearchService], tmp_path: Path, standin: OpenAIStandIn
) -> None:
    """Per item: what the policy read and sampled (the sums over the trajectory's turns, and what the policy was
    actually sent), what the judge used (a failed grading's billed answer and repair included), and the cost under a
    price table that knows the judge but not the policy's model: unknown, never 0, and unknown in every total it is
    part of."""
    valid = json.dumps({"explanation": "x", "grade": "correct"})
    standin.responder = lambda req: Reply(content=valid if "Predicted answer: a spirit" in user_prompt(req) else "no",
                                          usage={"prompt_tokens": 300, "completion_tokens": 20})
    service = scripted_service(HOTPOT_ANSWERS)
    service.policy.model = "scripted-model"  # type: ignore[attr-defined]  # named as an endpoint policy is
    prices = {"standin-judge": ModelPrice(input_per_mtok=1.0, output_per_mtok=4.0)}
    out = tmp_path / "out"
    summary = evaluate("hotpotqa", HELDOUT, service, out, standin=standin, limit=2, prices=prices)
    records = lines(out / "items.jsonl")
    sent = service.policy.calls  # type: ignore[attr-defined]  # every generation call, in order
    start = 0
    for rec in records:
        traj = service.log.get(rec["session_id"]).trajectory
        sampled = [t for t in traj.turns if t.kind == "sampled"]
        tokens = rec["tokens"]
        assert tokens["policy_calls"] == len(sampled) == 3  # plan, review, answer (the graph made the search)
        assert tokens["policy_sampled"] == sum(len(t.token_ids) for t in sampled)
        read = sum(c["context_len"] for c in sent[start : start + len(sampled)])
        start += len(sampled)
        assert tokens["policy_prompt"] == read == sum(t.prompt_tokens or 0 for t in sampled)
        # Rebuilt from the turns alone (a trajectory logged without per-turn counts) it is the same number.
        bare = replace(traj, turns=tuple(replace(t, prompt_tokens=None) for t in traj.turns))
        assert policy_tokens(bare)["policy_prompt"] == read
        assert rec["policy_model"] == "scripted-model"
    graded, failed = records
    assert (graded["tokens"]["judge_prompt"], graded["tokens"]["judge_completion"]) == (300, 20)
    assert graded["cost_usd"] == {"policy": None, "judge": pytest.approx((300 + 20 * 4) / 1e6), "total": None}
    assert failed["judge_error"].startswith("JudgeOutputInvalid")  # the answer and its repair: two billed calls
    assert (failed["tokens"]["judge_prompt"], failed["tokens"]["judge_completion"]) == (600, 40)
    assert failed["cost_usd"] == {"policy": None, "judge": pytest.approx(2 * 380 / 1e6), "total": None}
    assert start == len(sent)  # the scaffold was followed: no dropped sample went uncounted
    assert summary.tokens == {**{k: sum(r["tokens"][k] for r in records) for k in TOKEN_KEYS}, "items": 2}
    assert summary.cost_usd == {"policy": None, "judge": pytest.approx(3 * 380 / 1e6), "total": None}
    assert summary.judge_usage["prompt_tokens"] == 900
    assert json.loads(summary.summary_json.read_text())["cost_usd"]["total"] is None
    md = summary.summary_md.read_text()
    assert "| Cost | unknown (policy `scripted-model` unknown, judge $0.0011) |" in md
    assert f"| {records[0]['id']} | ok | 1.0000 | {read_of(records[0])} | 300 / 20 | unknown |" in md


def read_of(record: dict[str, Any]) -> str:
    return f"{record['tokens']['policy_prompt']} / {record['tokens']['policy_sampled']}"


def test_runs_over_seeds_keep_each_run_and_report_mean_and_std(
    hotpot_tools: dict[str, LocalSearch], tmp_path: Path
) -> None:
    """`--runs 2 --seed 5`: runs with seeds 5 and 6 in run-1/ and run-2/, each metric's mean and sample standard
    deviation over the runs in the top-level summary; a rerun resumes, and no folder mixes seeds or layouts. The
    scripted model answers the second question right in the first run and wrongly in the second."""
    right = answering({"If Gallu is a demon": "a spirit", "era of Haymo of Faversham": "Latin"})
    wrong = answering(HOTPOT_ANSWERS)
    answered = 0

    def script(context: str, stop: Sequence[str]) -> str:
        nonlocal answered
        if stage_of(stop) == "answer":
            answered += 1
            return (right if answered <= 2 else wrong)(context, stop)
        return right(context, stop)

    policy = ScriptedPolicy(script)
    log = SessionLog(tmp_path / "s.sqlite3")
    service = ResearchService(policy, hotpot_tools, log, AgentConfig())  # type: ignore[arg-type]
    options = SCRIPTED_OPTIONS.model_copy(update={"seed": 5})
    out, seen = tmp_path / "out", []

    def seeds(seed: int = 5, runs: int = 2, folder: Path = out) -> Any:
        return asyncio.run(run_eval_seeds("hotpotqa", HELDOUT, runs=runs, service=service, out_dir=folder, limit=2,
                                          options=options.model_copy(update={"seed": seed}),
                                          progress=lambda *a: seen.append(a[:2])))

    spread = seeds()
    per_run = [json.loads((out / f"run-{k}" / "summary.json").read_text()) for k in (1, 2)]
    assert [r["metrics"]["em"] for r in per_run] == [1.0, 0.5]
    assert spread.metrics.keys() == per_run[0]["metrics"].keys()
    for name, mean in spread.metrics.items():
        values = [r["metrics"][name] for r in per_run]
        assert mean == pytest.approx(statistics.mean(values))
        assert spread.metrics_std[name] == pytest.approx(statistics.stdev(values))
    assert spread.metrics["em"] == 0.75 and spread.seeds == [5, 6] and seen == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for k, seed in ((1, 5), (2, 6)):
        assert json.loads((out / f"run-{k}" / "run.json").read_text())["options"]["seed"] == seed
        for rec in lines(out / f"run-{k}" / "items.jsonl"):
            assert service.log.get(rec["session_id"]).options["seed"] == seed
    top = json.loads((out / "summary.json").read_text())
    assert top["metrics_std"] == spread.metrics_std and [r["seed"] for r in top["runs"]] == [5, 6]
    assert top["tokens"]["policy_prompt"] == sum(r["tokens"]["policy_prompt"] for r in per_run)
    assert "| em | 0.7500 ± 0.3536 | 2 |" in (out / "summary.md").read_text()

    calls = len(policy.calls)
    assert seeds().metrics == spread.metrics and len(policy.calls) == calls  # resumed: nothing ran again
    with pytest.raises(EvalOutputConflict, match="seed 5"):
        seeds(seed=9)
    with pytest.raises(EvalOutputConflict, match="--runs"):
        asyncio.run(run_eval("hotpotqa", HELDOUT, service=service, options=options, out_dir=out, limit=1))
    evaluate("hotpotqa", HELDOUT, service, tmp_path / "single", limit=1)
    with pytest.raises(EvalOutputConflict, match="single"):
        seeds(folder=tmp_path / "single")
    assert len(policy.calls) == calls + 3  # only the single run's item ran (3 calls)
