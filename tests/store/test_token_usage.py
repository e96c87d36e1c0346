"""Token counts in the session log (migration 0012, issue 36), on both backends: the prompt tokens a sampled turn's
call read and the session's policy model round-trip, old rows (NULL) get their prompt counts rebuilt from the context
they read, and the judge's per-judgement usage is read out of the stored payloads."""

from __future__ import annotations

import pytest

from agent.accounting import ModelPrice, format_cost, usage_of
from store import InvalidInput, PromptRecord
from store.migrations import apply_migrations, load_migrations
from store.records import Turn
from store.session_log import JudgeTokens, SessionTokens, StageTokens
from tests.store.conftest import StoreTarget, columns, raw_connect

PROMPT = PromptRecord(text="<|im_start|>user\nq?<|im_end|>", token_ids=(1, 2, 3, 4), prompt_sha="sha")
OLD_TS = "2030-01-01T00:00:00.000000+00:00"


def _old_turn(conn: object, idx: int, stage: str, kind: str, ids: tuple[int, ...]) -> None:
    blob = b"".join(i.to_bytes(4, "little") for i in ids)
    conn.execute(  # type: ignore[attr-defined]
        "INSERT INTO turns (session_id, idx, stage, kind, text, token_ids, logprobs, policy_version, prompt_sha, "
        "token_source, finish_reason, created_at) VALUES ('old', ?, ?, ?, 'x', ?, ?, 'base', 'sha', 'server', NULL, ?)",
        (idx, stage, kind, blob, b"", OLD_TS))


def test_migration_0012_adds_nullable_columns_and_old_rows_are_rebuilt(store_target: StoreTarget) -> None:
    if store_target.sqlite_path is not None:
        store_target.sqlite_path.parent.mkdir(parents=True)
    before = tuple(m for m in load_migrations() if m.version < 12)
    assert [m.name for m in load_migrations()][11] == "0012_token_usage.sql"
    with raw_connect(store_target) as conn:
        apply_migrations(conn, before)
        assert "prompt_tokens" not in columns(conn, "turns")
        conn.execute(
            "INSERT INTO sessions (session_id, question, policy_version, options_json, prompt_text, prompt_token_ids, "
            "prompt_sha, status, created_at, updated_at, finished_at) VALUES ('old', 'q?', 'base', '{}', 'p', ?, "
            "'sha', 'completed', ?, ?, ?)", (b"".join(i.to_bytes(4, "little") for i in PROMPT.token_ids), OLD_TS,
                                               OLD_TS, OLD_TS))
        _old_turn(conn, 0, "plan", "sampled", (10, 11))  # read the prompt: 4 tokens
        _old_turn(conn, 1, "plan", "forced", (12,))
        _old_turn(conn, 2, "research", "sampled", (13, 14, 15))  # read 4 + 2 + 1 = 7
        _old_turn(conn, 3, "research", "tool_output", (16, 17))
        _old_turn(conn, 4, "research", "sampled", (18,))  # read 7 + 3 + 2 = 12
        assert apply_migrations(conn, tuple(m for m in load_migrations() if m.version <= 12)) == (12,)
        assert {"prompt_tokens"} <= columns(conn, "turns") and {"policy_model"} <= columns(conn, "sessions")
    with store_target.open() as log:
        rec = log.get("old")
        assert rec.policy_model is None and all(t.prompt_tokens is None for t in rec.trajectory.turns)
        counts = log.token_counts(["old", "missing"])
        assert list(counts) == ["old"]
        assert counts["old"].stages == (
            StageTokens("plan", calls=1, prompt_tokens=4, reconstructed=1, sampled_tokens=2),
            StageTokens("research", calls=2, prompt_tokens=19, reconstructed=2, sampled_tokens=4),
            StageTokens("review"), StageTokens("answer"))
        # No model was recorded: free under an empty table, unknown (never $0) under a non-empty one.
        assert format_cost(usage_of(log, "old", {}).total_cost) == "$0"  # type: ignore[union-attr]
        priced = usage_of(log, "old", {"gpt-4o-mini": ModelPrice(input_per_mtok=0.15, output_per_mtok=0.6)})
        assert priced is not None and priced.policy_cost is None and format_cost(priced.total_cost) == "unknown"


def test_prompt_tokens_and_policy_model_round_trip_and_are_checked(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        sid = log.create_session("q?", PROMPT, {}, "policy@2", policy_model="Qwen/Qwen3-8B")
        log.append_turn(sid, Turn("plan", "sampled", "a", (5, 6), prompt_tokens=4))
        log.append_turn(sid, Turn("plan", "forced", "<b>", (7,)))
        log.append_turn(sid, Turn("answer", "sampled", "c", (8,), prompt_tokens=7))
        with pytest.raises(InvalidInput, match="prompt_tokens"):
            bad = Turn("plan", "sampled", "a", (5,), prompt_tokens=1)
            object.__setattr__(bad, "prompt_tokens", -1)  # a caller that bypassed Turn's own check
            log.append_turn(sid, bad)
        with pytest.raises(ValueError, match="sampled turn"):
            Turn("research", "tool_output", "x", (1,), prompt_tokens=3)
        rec = log.get(sid)
        assert rec.policy_model == "Qwen/Qwen3-8B"
        assert [t.prompt_tokens for t in rec.trajectory.turns] == [4, None, 7]
        log.finish(sid, "completed")
        log.record_judgement(sid, "gpt-judge", {"usage": {"calls": 3, "cached_calls": 1, "prompt_tokens": 900,
                                                          "completion_tokens": 120, "cost_usd": 0.25}})
        log.record_judgement(sid, "gpt-judge", {"error": "judge down"}, status="failed", error="judge down")
        log.record_judgement(sid, "minilm", {"usage": {"calls": 0}}, judge_kind="offline")
        counts = log.token_counts([sid])[sid]
    assert counts == SessionTokens(
        sid, "Qwen/Qwen3-8B",
        (StageTokens("plan", 1, 4, 0, 2), StageTokens("research"), StageTokens("review"),
         StageTokens("answer", 1, 7, 0, 1)),
        (JudgeTokens(1, "gpt-judge", "llm", "ok", 3, 1, 900, 120, 0.25),
         JudgeTokens(2, "gpt-judge", "llm", "failed"),
         JudgeTokens(3, "minilm", "offline", "ok")))
