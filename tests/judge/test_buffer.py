"""The rubric buffer: caps, pruning, zero-variance retirement, persistence through the real SessionLog."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learning.judge.buffer import (
    CAPS,
    BufferPayloadError,
    RubricBuffer,
    load_buffer,
    question_sha,
    rubric_id,
    save_buffer,
)
from learning.judge.types import Rubric
from store.records import STAGES, normalise_question, sha256_text
from store.session_log import SessionLog

Q = "What is  the Capital\nof France?"


def rub(stage: str, title: str, weight: int = 2, polarity: str = "positive") -> Rubric:
    return Rubric(id=rubric_id(stage, title), stage=stage, title=title, description=f"check {title}",  # type: ignore[arg-type]
                  weight=weight, polarity=polarity)  # type: ignore[arg-type]  # fmt: skip


def test_question_key_is_sha_of_normalised_question() -> None:
    assert normalise_question(Q) == "what is the capital of france?"
    assert question_sha(Q) == sha256_text("what is the capital of france?")
    assert question_sha("what is the capital   of FRANCE?") == question_sha(Q)


def test_add_dedupes_by_normalised_title_within_a_stage() -> None:
    buf = RubricBuffer.empty(Q)
    buf2, added = buf.add(
        [rub("plan", "Hidden constraints"), rub("plan", "hidden  CONSTRAINTS!"), rub("review", "Hidden constraints")]
    )
    assert [r.stage for r in added] == ["plan", "review"]
    assert buf2.size("plan") == 1 and buf2.size("review") == 1
    assert buf.size("plan") == 0  # the original is untouched
    buf3, added3 = buf2.add([rub("plan", "Hidden constraints.")])
    assert added3 == () and buf3 is buf2


def test_persistent_rubrics_are_answer_only_and_deduped() -> None:
    given_ = [rub("plan", "Names Paris"), rub("answer", "names paris"), rub("answer", "Mentions the Seine")]
    buf = RubricBuffer.empty(Q).with_persistent(given_)
    assert [r.title for r in buf.persistent] == ["Names Paris", "Mentions the Seine"]
    assert all(r.stage == "answer" and r.persistent for r in buf.persistent)
    # a generated rubric with a persistent title is a duplicate
    _, added = buf.add([rub("answer", "Names Paris")])
    assert added == ()
    assert buf.stage_rubrics("answer")[:2] == buf.persistent
    assert buf.stage_rubrics("plan") == ()


def test_zero_variance_rubrics_are_retired_and_persistent_never_pruned() -> None:
    p = rub("answer", "Names Paris")
    buf = RubricBuffer.empty(Q).with_persistent([p])
    buf, _ = buf.add([rub("answer", "flat"), rub("answer", "varied")])
    flat, varied = buf.active["answer"]
    pers = buf.persistent[0]
    pruned, result = buf.prune({flat.id: [1, 1, 1], varied.id: [0, 2, 1], pers.id: [2, 2, 2]})
    assert result.zero_variance == (flat.id,)
    assert pruned.active["answer"] == (varied,)
    assert pruned.persistent == buf.persistent
    assert flat in pruned.retired


def test_single_score_or_failed_scores_do_not_retire() -> None:
    buf, _ = RubricBuffer.empty(Q).add([rub("plan", "a")])
    a = buf.active["plan"][0]
    for scores in ([1], [1, None, None], []):
        kept, result = buf.prune({a.id: scores})
        assert result.zero_variance == () and kept.active["plan"] == (a,)


def test_over_cap_keeps_highest_variance() -> None:
    rs = [rub("research", t) for t in ("low", "high", "mid")]
    buf, _ = RubricBuffer.empty(Q).add(rs)
    scores = {rs[0].id: [0, 1, 1, 1], rs[1].id: [0, 2, 0, 2], rs[2].id: [0, 1, 2, 1]}
    pruned, result = buf.prune(scores)
    assert CAPS["research"] == 2
    assert [r.title for r in pruned.active["research"]] == ["high", "mid"]
    assert result.over_cap == (rs[0].id,)


def test_unknown_variance_ranks_last_and_ties_keep_newer() -> None:
    rs = [rub("review", t) for t in ("old", "new", "unscored")]
    buf, _ = RubricBuffer.empty(Q).add(rs)
    pruned, _ = buf.prune({rs[0].id: [0, 2], rs[1].id: [2, 0]})  # equal variance; third has no scores
    assert [r.title for r in pruned.active["review"]] == ["old", "new"]
    rs2 = [rub("review", t) for t in ("a", "b", "c")]
    buf2, _ = RubricBuffer.empty(Q).add(rs2)
    pruned2, _ = buf2.prune({r.id: [0, 2] for r in rs2})  # all tie: the two newest stay
    assert [r.title for r in pruned2.active["review"]] == ["b", "c"]


def test_payload_round_trip_and_store_persistence(tmp_path: Path) -> None:
    buf = RubricBuffer.empty(Q).with_persistent([rub("answer", "Names Paris", 3)])
    buf, _ = buf.add([rub("plan", "Scope", 1), rub("answer", "Flaw", 2, "negative")])
    buf, _ = buf.prune({buf.active["plan"][0].id: [1, 1]})
    assert RubricBuffer.from_payload(buf.to_payload(), version="x") == RubricBuffer(
        buf.question, buf.persistent, buf.active, buf.retired, "x"
    )
    with SessionLog(tmp_path / "log.sqlite") as log:
        assert load_buffer(log, Q) == RubricBuffer.empty(Q)
        saved = save_buffer(log, buf)
        assert saved.version == "1"
        again = load_buffer(log, "what is the capital of france?")  # same normalised question
        assert again == saved
        assert save_buffer(log, again).version == "2"


def test_feedback_rubrics_saved_in_a_buffer_before_issue_34_no_longer_judge_everyone(tmp_path: Path) -> None:
    """A note judges only its giver's sessions now; an old buffer holding one must not go on applying it to all."""
    from learning.judge.feedback import feedback_rubrics
    from store.session_log import FeedbackRecord

    (note,) = feedback_rubrics([FeedbackRecord(1, "s1", Q, "down", "It never names the river.", "2025-01-01")])
    old = RubricBuffer.empty(Q).with_persistent([rub("answer", "Names Paris", 3), note])
    old, _ = old.add([rub("plan", "Scope", 1)])
    with SessionLog(tmp_path / "log.sqlite") as log:
        save_buffer(log, old)  # as the judge saved it before
        loaded = load_buffer(log, Q)
        assert [r.title for r in loaded.persistent] == ["Names Paris"]  # the ground truth stays, the note goes
        assert loaded.active == old.active and loaded.version == "1"
        save_buffer(log, loaded)
        assert "never names the river" not in str(log.load_rubric_buffer(question_sha(Q)))


@pytest.mark.parametrize(
    "payload",
    [{}, {"format": 99}, {"format": 1}, {"format": 1, "question": "q", "active": {"nope": []}},
     {"format": 1, "question": "q", "active": {"plan": [{"id": "x"}]}},
     {"format": 1, "question": "q", "active": {"plan": [rub("review", "t").model_dump()]}}],
)  # fmt: skip
def test_malformed_payload_is_a_typed_error(payload: dict) -> None:
    with pytest.raises(BufferPayloadError):
        RubricBuffer.from_payload(payload)


# --- properties ----------------------------------------------------------------------------------------------------

titles = st.text(alphabet="abcdefgh ", min_size=1, max_size=6).filter(lambda t: t.strip())
rubric_specs = st.lists(st.tuples(st.sampled_from(STAGES), titles, st.integers(1, 3)), max_size=20)
score_lists = st.lists(st.one_of(st.none(), st.integers(0, 2)), max_size=6)


@settings(max_examples=150, deadline=None)
@given(specs=rubric_specs, persistent_titles=st.lists(titles, max_size=4), data=st.data())
def test_prune_properties(specs: list, persistent_titles: list[str], data: st.DataObject) -> None:
    buf = RubricBuffer.empty(Q).with_persistent([rub("answer", "P " + t) for t in persistent_titles])
    buf, _ = buf.add([rub(s, t, w) for s, t, w in specs])
    all_ids = [r.id for r in buf.all_rubrics()]
    scores = {rid: data.draw(score_lists) for rid in all_ids}
    before = buf.to_payload()
    pruned, result = buf.prune(scores)

    assert buf.to_payload() == before  # never mutates its input
    assert pruned.persistent == buf.persistent  # persistent rubrics never pruned
    for stage in STAGES:
        kept = pruned.active[stage]
        assert len(kept) <= CAPS[stage]
        assert set(kept) <= set(buf.active[stage])
        original_order = [r for r in buf.active[stage] if r in kept]
        assert list(kept) == original_order
        for r in kept:  # no survivor has zero variance over >= 2 valid scores
            valid = [s for s in scores[r.id] if s is not None]
            assert not (len(valid) >= 2 and len(set(valid)) == 1)
    removed = set(result.zero_variance) | set(result.over_cap)
    survivors = {r.id for s in STAGES for r in pruned.active[s]}
    assert removed.isdisjoint(survivors)
    assert removed | survivors == {r.id for s in STAGES for r in buf.active[s]}

    def var(rid: str) -> float | None:
        v = [s for s in scores[rid] if s is not None]
        if len(v) < 2:
            return None
        m = sum(v) / len(v)
        return sum((x - m) ** 2 for x in v) / len(v)

    for rid in result.over_cap:  # every rubric cut for the cap discriminated no better than every survivor
        stage = next(r.stage for r in buf.all_rubrics() if r.id == rid)
        for r in pruned.active[stage]:
            cut, kept_v = var(rid), var(r.id)
            assert cut is None or (kept_v is not None and kept_v >= cut)
    assert RubricBuffer.from_payload(pruned.to_payload()).active == pruned.active


@settings(max_examples=60, deadline=None)
@given(specs=rubric_specs)
def test_add_never_duplicates_a_title_in_a_stage(specs: list) -> None:
    buf, _ = RubricBuffer.empty(Q).add([rub(s, t, w) for s, t, w in specs])
    buf, _ = buf.add([rub(s, t.upper() + "!", w) for s, t, w in specs])
    for stage in STAGES:
        norm = [" ".join(r.title.lower().replace("!", " ").split()) for r in buf.stage_rubrics(stage)]
        assert len(norm) == len(set(norm))
