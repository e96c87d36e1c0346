"""Record types: turn validation, masks, stage spans and trajectory properties (hand examples and properties)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.records import (
    STAGES,
    PromptRecord,
    Snippet,
    ToolCallRecord,
    Trajectory,
    Turn,
    loss_mask,
    sha256_text,
    stage_spans,
    token_stages,
)


def _turn(stage: str, kind: str, n: int, start: int = 0) -> Turn:
    ids = tuple(range(start, start + n))
    logprobs = tuple(-0.1 * (i + 1) for i in range(n)) if kind == "sampled" else ()
    text = f"{stage}:{kind}:{n}"
    return Turn(stage=stage, kind=kind, text=text, token_ids=ids, logprobs=logprobs)  # type: ignore[arg-type]


def _trajectory(turns: tuple[Turn, ...], calls: tuple[ToolCallRecord, ...] = ()) -> Trajectory:
    return Trajectory(session_id="s", question="q", prompt=PromptRecord("p", (1,), "h"), turns=turns, tool_calls=calls)


# --- Turn ---


def test_turn_rejects_misaligned_logprobs() -> None:
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        Turn(stage="plan", kind="sampled", text="ab", token_ids=(1, 2), logprobs=(-0.5,))


def test_turn_accepts_aligned_or_absent_logprobs() -> None:
    aligned = Turn(stage="plan", kind="sampled", text="ab", token_ids=(1, 2), logprobs=(-0.5, -1.0))
    assert aligned.logprobs == (-0.5, -1.0)
    # llama.cpp without logprobs, and inserted text, carry no logprobs at all
    assert Turn(stage="plan", kind="sampled", text="ab", token_ids=(1, 2)).logprobs == ()
    assert Turn(stage="plan", kind="forced", text="<plan>", token_ids=(7,)).logprobs == ()


def test_turn_defaults() -> None:
    turn = Turn(stage="answer", kind="sampled", text="x", token_ids=(1,))
    assert (turn.policy_version, turn.prompt_sha, turn.token_source, turn.finish_reason) == ("base", "", "server", None)


@pytest.mark.parametrize(("kind", "trainable"), [("sampled", True), ("forced", False), ("tool_output", False)])
def test_only_sampled_turns_are_trainable(kind: str, trainable: bool) -> None:
    turn = _turn("research", kind, 3)
    assert turn.trainable is trainable
    assert turn.mask == ((1,) * 3 if trainable else (0,) * 3)


def test_records_are_frozen() -> None:
    turn = _turn("plan", "sampled", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        turn.text = "changed"  # type: ignore[misc]


def test_sha256_text_is_utf8_sha256() -> None:
    assert sha256_text("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256_text("é") == sha256_text("\u00e9") != sha256_text("e\u0301")


# --- stage spans, masks, per-token stages ---


def test_stage_spans_merge_adjacent_turns_of_one_stage() -> None:
    turns = (
        _turn("plan", "forced", 1),  # <structured_plan> inserted by the graph
        _turn("plan", "sampled", 3),
        _turn("research", "sampled", 2),
        _turn("research", "tool_output", 3),
        _turn("research", "sampled", 1),
        _turn("review", "forced", 1),
        _turn("review", "sampled", 2),
        _turn("answer", "sampled", 2),
    )
    spans = stage_spans(turns)
    assert list(spans) == list(STAGES)
    assert spans == {
        "plan": (range(0, 4),),
        "research": (range(4, 10),),
        "review": (range(10, 13),),
        "answer": (range(13, 15),),
    }
    assert loss_mask(turns) == (0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 0, 1, 1, 1, 1)
    assert token_stages(turns) == (-1, 0, 0, 0, 1, 1, -1, -1, -1, 1, -1, 2, 2, 3, 3)


def test_stage_spans_keep_separate_ranges_when_a_stage_recurs() -> None:
    turns = (_turn("plan", "sampled", 2), _turn("research", "sampled", 2), _turn("plan", "sampled", 2))
    spans = stage_spans(turns)
    assert spans["plan"] == (range(0, 2), range(4, 6))
    assert spans["research"] == (range(2, 4),)
    assert spans["review"] == () and spans["answer"] == ()


def test_empty_turns_take_no_tokens_and_do_not_split_a_span() -> None:
    turns = [_turn("plan", "sampled", 2), _turn("research", "sampled", 0), _turn("plan", "sampled", 1)]
    assert stage_spans(turns)["plan"] == (range(0, 3),)
    assert stage_spans(turns)["research"] == ()
    assert loss_mask(turns) == (1, 1, 1)


def test_no_turns() -> None:
    assert stage_spans(()) == {s: () for s in STAGES}
    assert loss_mask(()) == () and token_stages(()) == ()


_turns_strategy = st.lists(
    st.builds(
        _turn,
        stage=st.sampled_from(STAGES),
        kind=st.sampled_from(("sampled", "forced", "tool_output")),
        n=st.integers(min_value=0, max_value=6),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(_turns_strategy)
def test_spans_masks_and_stages_agree_with_the_turns(turns: list[Turn]) -> None:
    owner_stage = [t.stage for t in turns for _ in t.token_ids]  # stage of each token, from the turns themselves
    owner_kind = [t.kind for t in turns for _ in t.token_ids]
    total = len(owner_stage)
    spans = stage_spans(turns)
    assert spans == stage_spans(tuple(turns))

    covered: list[int] = []
    for stage, ranges in spans.items():
        for r in ranges:
            assert len(r) > 0
            assert all(owner_stage[i] == stage for i in r)
            covered.extend(r)
        # sorted, disjoint and never touching: touching ranges would have been merged
        assert all(a.stop < b.start for a, b in zip(ranges, ranges[1:], strict=False))
    assert sorted(covered) == list(range(total))  # every token in exactly one stage span

    mask, stages = loss_mask(turns), token_stages(turns)
    assert len(mask) == len(stages) == total == len(_trajectory(tuple(turns)).token_ids)
    for i in range(total):
        trainable = owner_kind[i] == "sampled"
        assert mask[i] == int(trainable)
        assert stages[i] == (STAGES.index(owner_stage[i]) if trainable else -1)


# --- Trajectory ---


def test_trajectory_properties() -> None:
    turns = (
        Turn(stage="plan", kind="forced", text="<structured_plan>", token_ids=(1,)),
        Turn(stage="plan", kind="sampled", text="do it</structured_plan>", token_ids=(2, 3), logprobs=(-1.0, -2.0)),
        Turn(stage="research", kind="tool_output", text="<tool_output>…</tool_output>", token_ids=(4,)),
        Turn(stage="answer", kind="forced", text="<answer>", token_ids=(5,)),
    )
    first = Snippet(id="0-0", tool="local_search", title="A", text="alpha")
    later = Snippet(id="0-0", tool="local_search", title="A2", text="alpha again")
    other = Snippet(id="1-0", tool="google_search", title="B", text="beta", url="https://example.org")
    calls = (
        ToolCallRecord(tool="local_search", query="a", snippets=(first,)),
        ToolCallRecord(tool="google_search", query="b", snippets=(other, later), error=None),
    )
    traj = _trajectory(turns, calls)
    assert traj.assistant_text == "<structured_plan>do it</structured_plan><tool_output>…</tool_output><answer>"
    assert traj.token_ids == (1, 2, 3, 4, 5)
    assert traj.snippets == {"0-0": later, "1-0": other}  # a repeated id keeps the most recent snippet
    # forced <answer> without a sampled answer does not make the stage present (METHOD D7: R = 0 for it)
    assert traj.stages_present == frozenset({"plan"})
    assert (traj.malformed, traj.max_consecutive_tool_errors, traj.injected_bank_items) == (False, 0, ())


def test_empty_trajectory() -> None:
    traj = _trajectory(())
    assert (traj.assistant_text, traj.token_ids, traj.snippets, traj.stages_present) == ("", (), {}, frozenset())
