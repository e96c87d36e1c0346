"""DeepRubric's use of its pairs (issue 15 item 6): the §11.6 reward maths worked by hand, the features read off a
trajectory, pairs → the stagewise judge's persistent rubrics, and malformed pairs files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from learning.deeprubric import reward as rw
from learning.deeprubric.pairs import (
    PairsFileError,
    is_pairs_file,
    judge_weight,
    load_pairs,
    persistent_by_question,
    persistent_rubrics,
)
from learning.judge.buffer import RubricBuffer
from learning.train_config import TrainConfigError, load_config
from tests.judge.builders import trajectory

FULL = rw.Features(has_answer=True, has_cite=True, queries=3, clean_thinks=2, answer_tokens=1500, cited=4,
                   valid_cited=3)


def test_rubric_term_is_the_signed_weighted_mean_over_scored_criteria() -> None:
    # 1·(4/4) + 0.5·(2/4) − 0.5·(4/4) = 0.75 over Σ|w| = 2.0 (the unscored criterion leaves both sums) → 0.375
    criteria = [rw.Criterion(1.0, 4), rw.Criterion(0.5, 2), rw.Criterion(-0.5, 4), rw.Criterion(0.8, None)]
    assert rw.rubric_term(criteria) == pytest.approx(0.375)
    assert rw.rubric_term([rw.Criterion(1.0, 0), rw.Criterion(0.25, 1)]) == pytest.approx(0.0625 / 1.25)  # 0.05
    assert rw.rubric_term([rw.Criterion(-1.0, 4)]) == -1.0  # all undesirable, all done
    assert rw.rubric_term([rw.Criterion(1.0, None)]) is None and rw.rubric_term([]) is None
    assert rw.rubric_term([rw.Criterion(0.0, 3)]) is None  # Σ|w| = 0: unscorable
    with pytest.raises(ValueError):
        rw.rubric_term([rw.Criterion(1.0, 5)])


def test_the_reward_combines_the_terms_with_the_paper_weights() -> None:
    # format 0.5+0.2+0.1+0.2 = 1; search 3/6 = 0.5; citation 3/4; length 1500/3000 = 0.5
    b = rw.combine(FULL, 0.375)
    assert (b.format, b.search, b.citation, b.length) == (1.0, 0.5, 0.75, 0.5)
    # 0.5·0.375 + 0.15·1 + 0.1·0.5 + 0.2·0.75 + 0.05·0.5 = 0.1875 + 0.15 + 0.05 + 0.15 + 0.025
    assert b.reward == pytest.approx(0.5625)
    assert b.as_metrics("dr/") == {"dr/reward": pytest.approx(0.5625), "dr/rubric": 0.375, "dr/format": 1.0,
                                   "dr/search": 0.5, "dr/citation": 0.75, "dr/length": 0.5}
    # Saturation: 9 queries → search 1; 4500 answer tokens → length 1; nothing cited → citation 0, format 0.8
    big = rw.Features(True, False, 9, 0, 4500, 0, 0)
    b = rw.combine(big, 1.0)
    assert (b.format, b.search, b.citation, b.length) == (pytest.approx(0.6), 1.0, 0.0, 1.0)
    assert b.reward == pytest.approx(0.5 + 0.15 * 0.6 + 0.1 + 0.0 + 0.05)  # 0.74


def test_without_an_answer_only_fifteen_percent_of_format_counts() -> None:
    # no answer, no cite, one query (0.1), one clean think (not "more than one"): format 0.1 → reward 0.015
    b = rw.combine(rw.Features(False, False, 1, 1, 0, 0, 0), rubric=0.9)
    assert b.reward == pytest.approx(0.015) and b.rubric is None and b.citation is None and not b.has_answer
    assert rw.combine(rw.Features(False, False, 0, 0, 0, 0, 0), None).reward == 0.0
    # an answer whose criteria could not be scored is unscorable, never 0
    assert rw.combine(FULL, None).reward is None


def test_offline_similarity_bands_onto_zero_to_four() -> None:
    assert [rw.score_from_similarity(x) for x in (0.1, 0.3, 0.4, 0.5, 0.55, 0.9)] == [0, 1, 2, 3, 4, 4]


def test_features_are_read_off_the_trajectory() -> None:
    t = trajectory(queries=("Haymo of Faversham", "Haymo translation"))
    f = rw.features(t)
    answer_tokens = sum(len(x.token_ids) for x in t.turns if x.stage == "answer")
    assert f == rw.Features(has_answer=True, has_cite=True, queries=2, clean_thinks=2, answer_tokens=answer_tokens,
                            cited=1, valid_cited=1)
    wrong = rw.features(trajectory(answer='Latin <cite id="ffff0000-9">x</cite> and <cite id="abcd0001-0">y</cite>'))
    assert (wrong.cited, wrong.valid_cited) == (2, 1)
    none = rw.features(trajectory(answer=None))
    assert not none.has_answer and none.answer_tokens == 0 and not none.has_cite
    empty = rw.features(trajectory(answer=""))  # a forced <answer> with nothing after it is no answer
    assert not empty.has_answer


def _pair(pid: str, question: str, rubrics: list[dict[str, object]]) -> dict[str, object]:
    return {"id": pid, "question": question, "answer": "ref", "format": "long_form", "rubrics": rubrics}


RUBRICS = [
    {"id": "R1", "type": "factual", "description": "States that Haymo was an English Franciscan.", "weight": 0.8,
     "source_leaf_ids": ["n1"], "evidence": ["Haymo of Faversham was an English Franciscan."]},
    {"id": "R2", "type": "logical", "description": "Explains the translation language.", "weight": 0.5},
    {"id": "R3", "type": "logical", "description": "Invents dates the sources do not give.", "weight": -0.3},
    {"id": "R4", "type": "logical", "description": "Mentions the weather.", "weight": 0},
]


def _write(path: Path, records: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_pairs_become_persistent_answer_rubrics_with_signs_and_weights(tmp_path: Path) -> None:
    path = _write(tmp_path / "pairs.jsonl", [_pair("dr-1", "Who was Haymo?", RUBRICS),
                                             _pair("dr-2", "What did Haymo translate?", RUBRICS[:2])])
    assert is_pairs_file(path) and not is_pairs_file(_write(tmp_path / "q.jsonl", [{"question": "x"}]))
    pairs = load_pairs(path)
    assert [p.question for p in pairs] == ["Who was Haymo?", "What did Haymo translate?"]
    rubrics = persistent_rubrics(pairs[0])
    assert [(r.weight, r.polarity) for r in rubrics] == [(3, "positive"), (2, "positive"), (1, "negative")]  # R4 (0) out
    assert all(r.stage == "answer" and r.persistent for r in rubrics)
    assert rubrics[0].title == "States that Haymo was an English Franciscan."
    assert rubrics[0].description.endswith('Evidence: "Haymo of Faversham was an English Franciscan."')
    assert [judge_weight(w) for w in (0.1, 1 / 3, 0.34, 2 / 3, 0.7, 1.0, -1.0)] == [1, 1, 2, 2, 3, 3, 3]
    # stable ids: the same pair gives the same rubrics, and the buffer keeps one copy of each
    by_q = persistent_by_question(load_pairs(path))
    assert by_q["Who was Haymo?"] == rubrics
    buffer = RubricBuffer.empty("Who was Haymo?").with_persistent(rubrics).with_persistent(rubrics)
    assert buffer.stage_rubrics("answer") == rubrics and buffer.stage_rubrics("plan") == ()


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "not valid JSON"),
    (json.dumps({"question": "Q?", "rubrics": []}), "'rubrics' must be a non-empty list"),
    (json.dumps(_pair("dr-x", "Q?", [{"type": "factual", "description": "d", "weight": 1.5}])), "weight"),
    (json.dumps(_pair("dr-x", "Q?", [{"type": "other", "description": "d", "weight": 1}])), "'type'"),
    (json.dumps(_pair("dr-x", "Q?", [{"type": "logical", "description": "d", "weight": -1}])), "positive weight"),
    (json.dumps(_pair("dr-x", "", RUBRICS)), "'question'"),
])
def test_a_malformed_pairs_file_names_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = _write(tmp_path / "pairs.jsonl", [_pair("dr-1", "Who was Haymo?", RUBRICS), "", line])
    with pytest.raises(PairsFileError, match=rf"pairs.jsonl:3: .*{message}"):
        load_pairs(path)


def test_training_config_and_question_pool_check_the_pairs_before_anything_trains(tmp_path: Path) -> None:
    from app.training import question_pool

    with pytest.raises(TrainConfigError, match="pairs.jsonl"):
        load_config(None, None, reward="deeprubric")  # no question file at all
    bad = _write(tmp_path / "pairs.jsonl", [_pair("dr-1", "Q one?", RUBRICS), _pair("dr-1", "Q two?", RUBRICS)])
    with pytest.raises(PairsFileError, match=r"pairs.jsonl:2: pair id 'dr-1' appears twice"):
        question_pool(load_config(None, None, questions=bad, reward="deeprubric"))
    plain = _write(tmp_path / "plain.jsonl", [{"question": "Q one?"}, {"question": "Q two?"}])
    with pytest.raises(PairsFileError, match="needs a pairs.jsonl"):
        question_pool(load_config(None, None, questions=plain, reward="deeprubric"))
    good = _write(tmp_path / "good.jsonl", [_pair("dr-1", "Q one?", RUBRICS), _pair("dr-2", "Q two?", RUBRICS)])
    assert question_pool(load_config(None, None, questions=good)) == (["Q one?", "Q two?"], [])


def test_the_offline_scorer_gives_a_stated_fact_the_top_score() -> None:
    from learning.deeprubric.pairs import PairCriterion, QueryPair
    from learning.deeprubric.scorer import OfflineCriterionScorer, score_pair

    pair = QueryPair("dr-1", "Who was Haymo?", (
        PairCriterion("R1", "factual", "States that Haymo was an English Franciscan.", 1.0,
                      ("Haymo of Faversham was an English Franciscan.",)),
        PairCriterion("R2", "logical", "Describes the history of Antarctic whaling fleets.", 0.5),
    ))
    good = trajectory("a", answer='Haymo of Faversham was an English Franciscan <cite id="abcd0001-0">friar</cite>.')
    breakdowns, group = asyncio.run(score_pair(OfflineCriterionScorer(), pair, [good, trajectory("b", answer=None)]))
    assert group.approximate and group.scores[0][0] == 4.0 and group.scores[0][1] <= 1.0
    assert group.scores[1] == [0.0, 0.0]  # no answer: nothing covered
    assert breakdowns[0].rubric is not None and breakdowns[0].rubric > 0.6
    assert breakdowns[1].reward == pytest.approx(0.15 * rw.format_term(rw.features(trajectory(answer=None))))
