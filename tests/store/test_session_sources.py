"""Where each session came from (store.records.SessionSource), on both backends: recorded, filtered, validated, and
the sources the product never learns from (benchmark runs, gate probes) opted out of training at creation."""

from __future__ import annotations

from typing import get_args

import pytest

from store import InvalidInput, PromptRecord, SessionLog
from store.migrations import apply_migrations, load_migrations
from store.records import HISTORY_SOURCES, UNLEARNED_SOURCES, SessionSource
from store.registry import Registry
from tests.store.conftest import StoreTarget, raw_connect

PROMPT = PromptRecord(text="<|im_start|>system\nYou research.<|im_end|>", token_ids=(1, 2), prompt_sha="sha")


def completed(log: SessionLog, source: str) -> str:
    sid = log.create_session(f"a {source} question?", PROMPT, {}, "base", source=source)  # type: ignore[arg-type]
    log.finish(sid, "completed", report="r")
    return sid


def test_every_source_round_trips_and_only_eval_and_probe_are_opted_out(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        ids = {source: completed(log, source) for source in get_args(SessionSource)}
        default = log.create_session("no source given?", PROMPT, {}, "base")
        log.finish(default, "completed", report="r")
        for source, sid in ids.items():
            rec = log.get(sid)
            assert rec.source == source and rec.training_opt_out == (source in {"eval", "probe"})
        assert log.get(default).source == "api" and not log.get(default).training_opt_out
        learned = [ids[s] for s in get_args(SessionSource) if s not in UNLEARNED_SOURCES] + [default]
        assert log.completed_unjudged() == learned
        assert Registry(log).sessions_in_window(None, log.now()) == learned
        listed = {s.session_id: s.source for s in log.list_sessions(sources=HISTORY_SOURCES)}
        assert listed == {ids["chat"]: "chat", ids["cli"]: "cli", ids["batch"]: "batch", ids["api"]: "api",
                          default: "api"}
        assert [s.session_id for s in log.list_sessions(status="completed", sources=["probe", "eval"])] == [
            ids["probe"], ids["eval"]]  # newest first


def test_a_bad_source_is_refused_and_nothing_is_written(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        with pytest.raises(InvalidInput, match="source"):
            log.create_session("q?", PROMPT, {}, "base", source="benchmark")  # type: ignore[arg-type]
        assert log.list_sessions() == []
        completed(log, "chat")
        for bad in ([], "chat", ["chat", "nope"]):
            with pytest.raises(InvalidInput, match="source"):
                log.list_sessions(sources=bad)


def test_sessions_written_before_the_migration_become_api_and_stay_learnable(store_target: StoreTarget) -> None:
    if store_target.sqlite_path is not None:
        store_target.sqlite_path.parent.mkdir(parents=True)
    before = tuple(m for m in load_migrations() if not m.name.startswith("0007_"))
    with raw_connect(store_target) as conn:
        apply_migrations(conn, before)
        conn.execute(
            "INSERT INTO sessions (session_id, question, policy_version, options_json, prompt_text, prompt_token_ids, "
            "prompt_sha, status, created_at, updated_at, finished_at) VALUES ('old', 'q?', 'base', '{}', 'p', ?, "
            "'s', 'completed', '2030-01-01T00:00:00.000000+00:00', '2030-01-01T00:00:00.000000+00:00', "
            "'2030-01-01T00:00:01.000000+00:00')", (b"\x01\x00\x00\x00",))
    with store_target.open() as log:
        rec = log.get("old")
        assert rec.source == "api" and not rec.training_opt_out
        assert log.completed_unjudged() == ["old"]
