"""The verifiable Answer-stage term (issue 45): real offline judge underneath, hand-built trajectories."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from app.training import verifiable_judge
from learning.judge.offline import OfflineJudge
from learning.judge.verifiable import Gold, GoldFileError, VerifiableJudge, load_golds, verifiable_terms
from learning.train_config import TrainConfigError, load_config
from tests.judge.builders import QUESTION, trajectory

RIGHT = 'The books were translated into \\boxed{Latin} <cite id="abcd0001-0">in his era</cite>.'
WRONG = "The books were translated into \\boxed{Greek} in his era."
GOLD = Gold(("Latin", "the Latin language"), ("Haymo of Faversham",))


def test_terms_of_a_right_and_a_wrong_answer() -> None:
    assert verifiable_terms(trajectory("r", answer=RIGHT), GOLD) == {"answer_f1": 1.0, "cited_gold": 1.0}
    assert verifiable_terms(trajectory("w", answer=WRONG), GOLD) == {"answer_f1": 0.0, "cited_gold": 0.0}
    assert verifiable_terms(trajectory("n", answer=None), GOLD) == {"answer_f1": 0.0, "cited_gold": 0.0}
    # a question that names no gold passage is checked on its answer alone
    assert verifiable_terms(trajectory("r", answer=RIGHT), Gold(("Latin",))) == {"answer_f1": 1.0}


def test_the_term_is_mixed_into_the_answer_score_and_recorded_in_every_judgement() -> None:
    group = [trajectory("r", answer=RIGHT), trajectory("w", answer=WRONG)]
    plain = asyncio.run(OfflineJudge().judge_group(QUESTION, group))
    judge = VerifiableJudge(OfflineJudge(), {"in which language were books translated in haymo of faversham's era":
                                             GOLD}, weight=0.5)
    mixed = asyncio.run(judge.judge_group(QUESTION, group))
    for p, m, v in zip(plain, mixed, (1.0, 0.0), strict=True):
        before = p.stage_scores()["answer"]
        assert m.verifiable is not None and m.verifiable["applied"] == "yes" and m.verifiable["v"] == v
        assert m.verifiable["answer_before"] == pytest.approx(before, abs=1e-4)
        assert m.stage_scores()["answer"] == pytest.approx(0.5 * before + 0.5 * v)
        assert {s: m.stage_scores()[s] for s in ("plan", "research", "review")} == \
            {s: p.stage_scores()[s] for s in ("plan", "research", "review")}  # only the Answer stage moves
        assert p.verifiable is None  # a judge without the option records nothing
    assert mixed[0].stage_scores()["answer"] - mixed[1].stage_scores()["answer"] > 0.4

    other = asyncio.run(judge.judge_group("Who founded Rome?", [trajectory("x", question="Who founded Rome?")]))[0]
    assert other.verifiable is not None and other.verifiable["applied"].startswith("no: the question has no gold")
    assert other.stage_scores() == asyncio.run(OfflineJudge().judge_group(
        "Who founded Rome?", [trajectory("x", question="Who founded Rome?")]))[0].stage_scores()


def test_gold_file_and_config(tmp_path: Path) -> None:
    good = tmp_path / "q.jsonl"
    good.write_text("\n".join(json.dumps(r) for r in (
        {"question": QUESTION, "answers": ["Latin"], "gold_titles": ["Haymo of Faversham"]},
        {"question": "Who founded Rome?", "answer": "Romulus"},
        {"question": "A question without a gold answer?"},
    )) + "\n")
    golds = load_golds(good)
    assert len(golds) == 2 and Gold(("Romulus",)) in golds.values()
    assert load_golds(tmp_path / "q.txt") == {}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "Q one?", "answers": ["x"]}) + "\n"
                   + json.dumps({"question": "Q two?", "answers": "Latin"}) + "\n")
    with pytest.raises(GoldFileError, match=r"bad.jsonl:2: 'answers' must be a list"):
        load_golds(bad)
    with pytest.raises(TrainConfigError, match="verifiable_weight"):
        load_config(verifiable_weight=1.5)
    with pytest.raises(ValueError, match="verifiable weight"):
        VerifiableJudge(OfflineJudge(), {}, weight=0.0)

    said: list[str] = []
    cfg = load_config(questions=good, verifiable_weight=0.3)
    judge = verifiable_judge(OfflineJudge(), cfg, [QUESTION, "Who founded Rome?", "A question without a gold answer?"],
                             said.append)
    assert isinstance(judge, VerifiableJudge) and judge.weight == 0.3 and judge.kind == "offline"
    assert said == ["verifiable reward term (weight 0.3): 2 of 3 training questions carry a gold answer; the others "
                    "are judged as before"]


def test_blank_answers_are_no_gold_and_the_option_needs_the_stagewise_reward(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"  # DeepRubric writes "answer": "" for a pair without one
    path.write_text(json.dumps({"question": "Q one?", "answer": ""}) + "\n"
                    + json.dumps({"question": "Q two?", "answer": "Paris"}) + "\n")
    assert list(load_golds(path).values()) == [Gold(("Paris",))]
    path.write_text(json.dumps({"question": "Q one?", "answer": 3}) + "\n")
    with pytest.raises(GoldFileError, match=r"pairs.jsonl:1: 'answer' must be text"):
        load_golds(path)
    with pytest.raises(TrainConfigError, match="reward = 'deeprubric' never reads it"):
        load_config(questions=path, reward="deeprubric", verifiable_weight=0.5)
