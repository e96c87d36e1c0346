"""Session log on both backends (real SQLite files and a real PostgreSQL server): migrations, exact round trips,
status rules, crash safety, concurrency; WAL and file handling on SQLite."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import (
    STAGES,
    DuplicateSession,
    InvalidInput,
    MigrationError,
    PromptRecord,
    SessionLog,
    SessionNotCompleted,
    SessionNotFound,
    SessionNotRunning,
    Snippet,
    Stage,
    StorageError,
    StoreBusy,
    StoreClosed,
    ToolCallRecord,
    Trajectory,
    Turn,
    sha256_text,
)
from store.migrations import applied_migrations, apply_migrations, load_migrations, split_statements
from store.session_log import ReflectionCandidate
from tests.store.conftest import OPEN_FROM_ENV, StoreTarget, columns, count_rows, raw_connect

REPO = Path(__file__).resolve().parents[2]
PROMPT = PromptRecord(
    text="<|im_start|>system\nYou research.<|im_end|>", token_ids=(1, 2, 3), prompt_sha=sha256_text("t")
)
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class Clock:
    """A settable clock, so timestamps in the log are chosen by the test."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kwargs: float) -> None:
        self.now += timedelta(**kwargs)


def sampled(stage: Stage = "plan", text: str = "x", ids: tuple[int, ...] = (10, 11)) -> Turn:
    logprobs = tuple(-0.25 * (i + 1) for i in range(len(ids)))
    return Turn(stage=stage, kind="sampled", text=text, token_ids=ids, logprobs=logprobs, policy_version="policy@3",
                prompt_sha=PROMPT.prompt_sha, finish_reason="stop")


def new_session(log: SessionLog, question: str = "What is X?", session_id: str | None = None) -> str:
    return log.create_session(question, PROMPT, {"max_tool_calls": 10, "format": "long_form"}, "policy@3",
                              session_id=session_id)


def float_bits(values: tuple[float, ...]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def log(store_target: StoreTarget, clock: Clock) -> Iterator[SessionLog]:
    with store_target.open(clock=clock) as opened:
        yield opened


def run_child(code: str, target: StoreTarget, *args: str) -> subprocess.Popen[str]:
    """Start a Python child that imports the project from this checkout; `open_target()` in its code opens `target`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **target.env}
    return subprocess.Popen([sys.executable, "-c", OPEN_FROM_ENV + textwrap.dedent(code), *args], cwd=REPO, env=env,
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# --- migrations ------------------------------------------------------------------------------------------------


def test_open_creates_parent_folder_applies_migrations_once_and_records_version(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "log.sqlite3"
    with SessionLog(path) as first:
        sid = new_session(first)
        assert first.pragmas()["user_version"] == len(load_migrations())
    with SessionLog(path) as second:  # re-opening re-runs nothing and keeps the data
        assert second.get(sid).status == "running"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("SELECT version, name FROM schema_migrations").fetchall() == [
            (m.version, m.name) for m in load_migrations()
        ]
        assert apply_migrations(conn) == ()
        assert conn.execute("SELECT COUNT(*) FROM schema_migrations").fetchone() == (len(load_migrations()),)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")}
        assert {"sessions", "turns", "tool_calls", "snippets", "judgements", "schema_migrations"} <= tables
    finally:
        conn.close()


def test_open_applies_migrations_once_and_records_them(store_target: StoreTarget) -> None:
    with store_target.open() as first:
        sid = new_session(first)
    with store_target.open() as second:  # re-opening re-runs nothing and keeps the data
        assert second.get(sid).status == "running"
        diagnostics = second.pragmas()
    assert diagnostics["user_version" if store_target.backend == "sqlite" else "schema_version"] == len(
        load_migrations())
    with raw_connect(store_target) as conn:
        assert [tuple(r) for r in conn.execute("SELECT version, name FROM schema_migrations ORDER BY version")] == [
            (m.version, m.name) for m in load_migrations()]
        assert applied_migrations(conn) == {m.version: m.checksum for m in load_migrations()}
        assert apply_migrations(conn) == ()
        for table in ("sessions", "turns", "tool_calls", "snippets", "judgements", "feedback", "policy_versions",
                      "retrain_cycles", "chat_threads", "reflection_candidates", "rubric_buffers"):
            assert conn.table_exists(table), table


def _copy_migrations(folder: Path) -> Path:
    folder.mkdir()
    for migration in load_migrations():
        (folder / migration.name).write_text(migration.sql, encoding="utf-8")
    return folder


def test_failed_migration_rolls_back_and_a_fixed_one_applies(store_target: StoreTarget, tmp_path: Path) -> None:
    store_target.open().close()
    folder = _copy_migrations(tmp_path / "migrations")
    n = len(load_migrations())
    nxt = f"{n + 1:04d}_notes.sql"
    (folder / nxt).write_text(
        "CREATE TABLE notes (note TEXT);\n"
        "ALTER TABLE sessions ADD COLUMN note TEXT;\n"
        "INSERT INTO no_such_table VALUES (1);\n"
    )
    sqlite = store_target.backend == "sqlite"
    with raw_connect(store_target) as conn:
        with pytest.raises(MigrationError, match=f"{nxt} failed and was rolled back"):
            apply_migrations(conn, load_migrations(folder))
        assert not conn.in_transaction
        assert not conn.table_exists("notes")
        assert "note" not in columns(conn, "sessions")
        assert tuple(conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()) == (n,)
        if sqlite:
            assert conn.execute("PRAGMA user_version").fetchone() == (n,)

        fixed = "CREATE TABLE notes (note TEXT);\nALTER TABLE sessions ADD COLUMN note TEXT;\n"
        (folder / nxt).write_text(fixed)
        assert apply_migrations(conn, load_migrations(folder)) == (n + 1,)
        assert apply_migrations(conn, load_migrations(folder)) == ()
        assert conn.table_exists("notes") and "note" in columns(conn, "sessions")
        if sqlite:
            assert conn.execute("PRAGMA user_version").fetchone() == (n + 1,)
    # The shipped code knows only versions up to n: it must refuse a database written by newer code, naming both.
    with pytest.raises(MigrationError, match="newer") as refused:
        store_target.open()
    assert f"[{n + 1}]" in str(refused.value) and f"up to {n}" in str(refused.value)


def test_edited_applied_migration_is_refused(store_target: StoreTarget, tmp_path: Path) -> None:
    store_target.open().close()
    folder = _copy_migrations(tmp_path / "migrations")
    (folder / "0001_init.sql").write_text((folder / "0001_init.sql").read_text() + "\n-- edited\n")
    with raw_connect(store_target) as conn, pytest.raises(MigrationError, match="edited after it was applied"):
        apply_migrations(conn, load_migrations(folder))


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"0001_a.sql": "SELECT 1;", "0003_c.sql": "SELECT 1;"}, "without gaps"),
        ({"1_a.sql": "SELECT 1;"}, "must be named"),
        ({"0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 1;"}, "share version 1"),
        ({"0001_a.sql": "-- set up\nPRAGMA foreign_keys = OFF;"}, "PRAGMA statements are not allowed"),
        ({"0001_a.sql": "BEGIN; CREATE TABLE t (x); COMMIT;"}, "BEGIN statements are not allowed"),
    ],
)
def test_inconsistent_migration_files_are_refused(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, sql in files.items():
        (tmp_path / name).write_text(sql)
    with pytest.raises(MigrationError, match=message):
        load_migrations(tmp_path)


def test_split_statements_respects_strings_comments_and_triggers() -> None:
    sql = (
        "-- header; with a semicolon\n"
        "CREATE TABLE t (x TEXT DEFAULT 'a;b');\n"
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 'c;d'; SELECT 1; END;\n"
        "/* trailing; comment */\n"
    )
    statements = split_statements(sql)
    assert len(statements) == 2
    assert statements[1].startswith("CREATE TRIGGER") and statements[1].endswith("END;")
    conn = sqlite3.connect(":memory:")
    for statement in statements:
        conn.execute(statement)
    conn.close()


def test_concurrent_first_opens_apply_each_migration_once(store_target: StoreTarget) -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            barrier.wait()
            store_target.open().close()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with store_target.open() as log:
        assert count_rows(log, "schema_migrations") == len(load_migrations())


# --- connection settings -----------------------------------------------------------------------------------------


def test_wal_mode_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite3"
    with SessionLog(path, busy_timeout_s=2.5) as log:
        pragmas = log.pragmas()
        assert pragmas["journal_mode"] == "wal"
        assert pragmas["foreign_keys"] == 1
        assert pragmas["busy_timeout"] == 2500
        assert pragmas["synchronous"] == 2  # FULL
        new_session(log)
        assert path.with_name(path.name + "-wal").exists()
        other = sqlite3.connect(path)  # WAL is a property of the file: a foreign connection sees it too
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        other.close()


def test_unusable_files_raise_storage_error(tmp_path: Path) -> None:
    (tmp_path / "a_directory").mkdir()
    with pytest.raises(StorageError):
        SessionLog(tmp_path / "a_directory")
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StorageError):
        SessionLog(junk)
    assert junk.read_bytes() == b"this is not a database" * 100


def test_closed_log_raises_and_close_is_idempotent(store_target: StoreTarget) -> None:
    log = store_target.open()
    sid = new_session(log)
    log.close()
    log.close()
    with pytest.raises(StoreClosed):
        log.get(sid)
    with pytest.raises(StoreClosed):
        log.append_turn(sid, sampled())


# --- round trips -------------------------------------------------------------------------------------------------


def test_full_session_round_trip(log: SessionLog, clock: Clock) -> None:
    sid = new_session(log, "Who wrote Λ?", session_id="s-1")
    turns = [
        Turn(stage="plan", kind="forced", text="<structured_plan>", token_ids=(50,), policy_version="policy@3",
             prompt_sha=PROMPT.prompt_sha, token_source="tokenizer"),
        sampled("plan", "look it up</structured_plan>", (51, 52, 53)),
        Turn(stage="research", kind="sampled", text='<call_tool name="local_search">Λ</call_tool>', token_ids=(60, 61),
             logprobs=(), policy_version="policy@3", prompt_sha=PROMPT.prompt_sha, token_source="retokenized",
             finish_reason="length"),
        Turn(stage="research", kind="tool_output", text="<tool_output>…</tool_output>", token_ids=(70, 71, 72),
             policy_version="policy@3", prompt_sha=PROMPT.prompt_sha, token_source="tokenizer"),
        sampled("review", "<review>ok</review>", (80,)),
        sampled("answer", '<answer>Ann <cite id="0-0">x</cite></answer>', (90, 2**31 - 1, 0)),
    ]
    call = ToolCallRecord(
        tool="local_search", query="Λ", attrs={"k": "3", "lang": "el"},
        snippets=(
            Snippet(id="0-0", tool="local_search", title="Λ (letter)", text="Lambda is…", url="file:///c/l.md"),
            Snippet(id="0-1", tool="local_search", title="", text=""),
        ),
        error=None, seconds=0.125,
    )
    failed_call = ToolCallRecord(tool="google_search", query="Λ author", error="SearchError: timed out", seconds=30.0)
    assert [log.append_turn(sid, t) for t in turns[:3]] == [0, 1, 2]
    assert log.append_tool_call(sid, call) == 0
    assert log.append_tool_call(sid, failed_call) == 1
    assert [log.append_turn(sid, t) for t in turns[3:]] == [3, 4, 5]
    log.set_flags(sid, malformed=False, max_consecutive_tool_errors=2, injected_bank_items=["bank-1", "bank-7"])
    clock.advance(seconds=42)
    log.finish(sid, "completed", report="# Report\n\nAnn [1]", metrics={"tool_calls": 2, "seconds": 41.5})

    record = log.get(sid)
    assert record.trajectory == Trajectory(
        session_id=sid, question="Who wrote Λ?", prompt=PROMPT, turns=tuple(turns), tool_calls=(call, failed_call),
        malformed=False, max_consecutive_tool_errors=2, injected_bank_items=("bank-1", "bank-7"),
    )
    assert record.status == "completed"
    assert record.created_at == "2030-01-01T12:00:00.000000+00:00"
    assert record.finished_at == "2030-01-01T12:00:42.000000+00:00"
    assert record.policy_version == "policy@3"
    assert record.options == {"max_tool_calls": 10, "format": "long_form"}
    assert (record.report, record.error) == ("# Report\n\nAnn [1]", None)
    assert record.metrics == {"tool_calls": 2, "seconds": 41.5}
    assert set(record.trajectory.snippets) == {"0-0", "0-1"}


@pytest.fixture(scope="module")
def shared_log(module_store_target: StoreTarget) -> Iterator[SessionLog]:
    with module_store_target.open(synchronous="NORMAL") as opened:
        yield opened


_floats = st.floats(allow_nan=False, width=64) | st.sampled_from([-0.0, 0.0, -math.inf, 5e-324, -1e308])
_turns = st.lists(
    st.integers(min_value=0, max_value=8).flatmap(
        lambda n: st.builds(
            Turn,
            stage=st.sampled_from(STAGES),
            kind=st.sampled_from(("sampled", "forced", "tool_output")),
            text=st.text(max_size=30),
            token_ids=st.tuples(*[st.integers(min_value=0, max_value=2**31 - 1)] * n),
            logprobs=st.just(()) | st.tuples(*[_floats] * n),
            policy_version=st.sampled_from(("base", "policy@1", "policy@22")),
            prompt_sha=st.sampled_from(("", PROMPT.prompt_sha)),
            token_source=st.sampled_from(("server", "tokenizer", "retokenized")),
            finish_reason=st.sampled_from((None, "stop", "length", "abort", "error")),
        )
    ),
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(turns=_turns)
def test_turns_round_trip_exactly(shared_log: SessionLog, turns: list[Turn]) -> None:
    sid = new_session(shared_log)
    for turn in turns:
        shared_log.append_turn(sid, turn)
    back = shared_log.get(sid).trajectory.turns
    assert back == tuple(turns)
    for original, restored in zip(turns, back, strict=True):
        assert float_bits(restored.logprobs) == float_bits(original.logprobs)  # -0.0 vs 0.0 compare equal with ==


def test_nan_payloads_and_infinities_are_bit_exact(log: SessionLog) -> None:
    quiet_nan_with_payload = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]
    negative_nan = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0001))[0]
    values = (quiet_nan_with_payload, negative_nan, -math.inf, math.inf, -0.0, 5e-324, -1.0000000000000002)
    sid = new_session(log)
    log.append_turn(sid, Turn(stage="plan", kind="sampled", text="n", token_ids=tuple(range(7)), logprobs=values))
    assert float_bits(log.get(sid).trajectory.turns[0].logprobs) == float_bits(values)


@pytest.mark.parametrize(
    "text",
    [
        "emoji 🧪🔬 and CJK 研究 and RTL مرحبا and combining e\u0301",
        "nul\x00inside and \r\n line endings and \u2028 separators",
        "lone surrogates \ud800 and \udfff from a broken decoder",
        "\ufdd0" + '"starts with the escape mark"',
        "",
        "x" * 5_000_000,
    ],
    ids=["unicode", "control", "surrogates", "mark", "empty", "huge"],
)
def test_text_round_trips_unchanged(log: SessionLog, text: str) -> None:
    sid = log.create_session(text + "?" * 20_000, PromptRecord(text, (1,), "h"), {"note": text[:100]}, "policy@1")
    log.append_turn(sid, Turn(stage="answer", kind="sampled", text=text, token_ids=(1, 2, 3)))
    snippet = Snippet(id="0-0", tool="browse_webpage", title=text[:50], text=text, url="https://ex.org/" + text[:10])
    log.append_tool_call(sid, ToolCallRecord(tool="browse_webpage", query=text[:200], snippets=(snippet,), error=text))
    log.finish(sid, "failed", report=text, error=text)
    record = log.get(sid)
    assert record.question == text + "?" * 20_000
    assert record.trajectory.prompt.text == text
    assert record.trajectory.turns[0].text == text
    assert record.trajectory.snippets == {"0-0": snippet}
    assert record.trajectory.tool_calls[0].error == text
    assert (record.report, record.error) == (text, text)
    assert record.options == {"note": text[:100]}
    assert log.list_sessions(limit=1)[0].question == record.question


# --- status rules and bad input ----------------------------------------------------------------------------------


def test_unknown_session_id_raises_session_not_found(log: SessionLog) -> None:
    calls: list[Callable[[], object]] = [
        lambda: log.get("nope"),
        lambda: log.append_turn("nope", sampled()),
        lambda: log.append_tool_call("nope", ToolCallRecord(tool="t", query="q")),
        lambda: log.set_flags("nope", malformed=True),
        lambda: log.finish("nope", "completed"),
        lambda: log.record_judgement("nope", "judge", {}),
    ]
    for call in calls:
        with pytest.raises(SessionNotFound, match="nope") as info:
            call()
        assert isinstance(info.value, LookupError) and info.value.session_id == "nope"
    assert log.list_sessions() == []


def test_finished_sessions_are_immutable(log: SessionLog) -> None:
    sid = new_session(log)
    log.append_turn(sid, sampled())
    log.finish(sid, "completed", report="r")
    with pytest.raises(SessionNotRunning, match="is 'completed'") as info:
        log.finish(sid, "completed")
    assert info.value.status == "completed"
    with pytest.raises(SessionNotRunning):
        log.finish(sid, "failed", error="late")
    with pytest.raises(SessionNotRunning):
        log.append_turn(sid, sampled())
    with pytest.raises(SessionNotRunning):
        log.append_tool_call(sid, ToolCallRecord(tool="t", query="q"))
    with pytest.raises(SessionNotRunning):
        log.set_flags(sid, malformed=True)
    record = log.get(sid)
    assert (record.status, record.report, record.error, len(record.trajectory.turns)) == ("completed", "r", None, 1)
    assert record.trajectory.malformed is False


def test_failed_session_keeps_its_turns_and_cannot_be_judged(log: SessionLog) -> None:
    running, failed = new_session(log), new_session(log)
    log.append_turn(failed, sampled())
    log.finish(failed, "failed", error="PolicyUnavailable: 503")
    record = log.get(failed)
    assert (record.status, record.error, len(record.trajectory.turns)) == ("failed", "PolicyUnavailable: 503", 1)
    for sid, status in ((running, "running"), (failed, "failed")):
        with pytest.raises(SessionNotCompleted, match=status):
            log.record_judgement(sid, "judge", {"score": 1})


def test_duplicate_session_id(log: SessionLog) -> None:
    new_session(log, "first", session_id="fixed")
    with pytest.raises(DuplicateSession, match="fixed"):
        new_session(log, "second", session_id="fixed")
    assert log.get("fixed").question == "first"


@pytest.mark.parametrize(
    "bad_turn",
    [
        Turn(stage="plan", kind="sampled", text="x", token_ids=(-1,)),
        Turn(stage="plan", kind="sampled", text="x", token_ids=(2**31,)),
        Turn(stage="plan", kind="sampled", text="x", token_ids=(1.5,)),  # type: ignore[arg-type]
        Turn(stage="plan", kind="sampled", text="x", token_ids=(1,), logprobs=("a",)),  # type: ignore[arg-type]
        Turn(stage="thinking", kind="sampled", text="x", token_ids=(1,)),  # type: ignore[arg-type]
        Turn(stage="plan", kind="guessed", text="x", token_ids=(1,)),  # type: ignore[arg-type]
        Turn(stage="plan", kind="sampled", text=b"x", token_ids=(1,)),  # type: ignore[arg-type]
        Turn(stage="plan", kind="sampled", text="x", token_ids=(1,), finish_reason="eos"),  # type: ignore[arg-type]
        Turn(stage="plan", kind="sampled", text="x", token_ids=(1,), policy_version=""),
        "not a turn",
    ],
)
def test_bad_turn_is_rejected_and_changes_nothing(log: SessionLog, bad_turn: Turn) -> None:
    sid = new_session(log)
    log.append_turn(sid, sampled())
    before = log.get(sid)
    with pytest.raises(InvalidInput):
        log.append_turn(sid, bad_turn)
    assert log.get(sid) == before
    assert log.append_turn(sid, sampled()) == 1  # the index sequence is not disturbed


@pytest.mark.parametrize(
    "bad_call",
    [
        ToolCallRecord(tool="t", query="q", attrs={"k": 1}),  # type: ignore[dict-item]
        ToolCallRecord(tool="t", query="q", seconds=math.nan),
        ToolCallRecord(tool="t", query="q", seconds=-1.0),
        ToolCallRecord(tool="t", query="q", snippets=("0-0",)),  # type: ignore[arg-type]
        ToolCallRecord(tool="t", query=None),  # type: ignore[arg-type]
    ],
)
def test_bad_tool_call_is_rejected_and_changes_nothing(log: SessionLog, bad_call: ToolCallRecord) -> None:
    sid = new_session(log)
    before = log.get(sid)
    with pytest.raises(InvalidInput):
        log.append_tool_call(sid, bad_call)
    assert log.get(sid) == before


def test_bad_session_arguments_are_rejected_and_change_nothing(log: SessionLog) -> None:
    bad_creates: list[Callable[[], object]] = [
        lambda: log.create_session("q", PROMPT, {"key": object()}, "policy@1"),
        lambda: log.create_session("q", PROMPT, {"x": math.nan}, "policy@1"),
        lambda: log.create_session("q", PROMPT, ["not", "a", "mapping"], "policy@1"),  # type: ignore[arg-type]
        lambda: log.create_session("q", PROMPT, {}, ""),
        lambda: log.create_session("q", PROMPT, {}, "policy@1", session_id=""),
        lambda: log.create_session(None, PROMPT, {}, "policy@1"),  # type: ignore[arg-type]
        lambda: log.create_session("q", ("p", (1,), "h"), {}, "policy@1"),  # type: ignore[arg-type]
        lambda: log.create_session("q", PromptRecord("p", (-5,), "h"), {}, "policy@1"),
    ]
    for call in bad_creates:
        with pytest.raises(InvalidInput):
            call()
    assert log.list_sessions() == []

    sid = new_session(log)
    before = log.get(sid)
    bad_updates: list[Callable[[], object]] = [
        lambda: log.set_flags(sid, injected_bank_items="bank-1"),
        lambda: log.set_flags(sid, malformed=True, max_consecutive_tool_errors=-1),
        lambda: log.set_flags(sid, malformed=1),  # type: ignore[arg-type]
        lambda: log.finish(sid, "running"),  # type: ignore[arg-type]
        lambda: log.finish(sid, "completed", metrics={"m": math.inf}),
        lambda: log.finish(sid, "completed", report=42),  # type: ignore[arg-type]
        lambda: log.list_sessions(limit=0),
        lambda: log.list_sessions(status="done"),
        lambda: log.completed_unjudged(limit=0),
        lambda: log.completed_unjudged(since="yesterday"),  # type: ignore[arg-type]
        lambda: log.mark_stale_running_failed(timedelta(seconds=-1)),
    ]
    for call in bad_updates:
        with pytest.raises(InvalidInput):
            call()
    assert log.get(sid) == before


def test_set_flags_updates_only_given_flags(log: SessionLog) -> None:
    sid = new_session(log)
    log.set_flags(sid, malformed=True)
    log.set_flags(sid, max_consecutive_tool_errors=2)
    log.set_flags(sid)
    traj = log.get(sid).trajectory
    assert (traj.malformed, traj.max_consecutive_tool_errors, traj.injected_bank_items) == (True, 2, ())


# --- queries -------------------------------------------------------------------------------------------------------


def test_completed_unjudged_filters_orders_and_limits(log: SessionLog, clock: Clock) -> None:
    def finished(status: str, minutes: int) -> str:
        sid = new_session(log)
        clock.now = T0 + timedelta(minutes=minutes)
        log.finish(sid, status, report="r")  # type: ignore[arg-type]
        return sid

    late = finished("completed", 50)  # created first, finished last: order is by completion
    early = finished("completed", 10)
    finished("failed", 20)
    new_session(log)  # running
    judged = finished("completed", 30)
    log.record_judgement(judged, "gpt-judge", {"scores": {"plan": 2, "answer": 1}})
    middle = finished("completed", 40)

    assert log.completed_unjudged() == [early, middle, late]
    assert log.completed_unjudged(limit=2) == [early, middle]
    assert log.completed_unjudged(since=T0 + timedelta(minutes=40)) == [middle, late]
    assert log.completed_unjudged(since=(T0 + timedelta(minutes=40)).replace(tzinfo=None)) == [middle, late]
    assert log.completed_unjudged(since=T0 + timedelta(minutes=41), limit=5) == [late]
    assert log.completed_unjudged(since=T0 + timedelta(hours=2)) == []
    log.record_judgement(early, "gpt-judge", {})
    log.record_judgement(early, "other-judge", {})  # several judges may judge one session
    assert log.completed_unjudged() == [middle, late]


def test_list_sessions_newest_first_with_status_filter_and_counts(log: SessionLog, clock: Clock) -> None:
    ids = []
    for i in range(4):
        ids.append(new_session(log, f"question {i}"))
        if i < 2:
            clock.advance(seconds=1)  # the last two share a timestamp: creation order breaks the tie
    log.append_turn(ids[1], sampled())
    log.append_turn(ids[1], sampled())
    log.append_tool_call(ids[1], ToolCallRecord(tool="t", query="q"))
    log.set_flags(ids[1], malformed=True)
    log.finish(ids[1], "failed", error="boom")
    log.finish(ids[2], "completed")

    rows = log.list_sessions()
    assert [r.session_id for r in rows] == ids[::-1]
    assert [r.session_id for r in log.list_sessions(limit=2)] == [ids[3], ids[2]]
    (failed,) = log.list_sessions(status="failed")
    assert (failed.session_id, failed.question, failed.n_turns, failed.n_tool_calls) == (ids[1], "question 1", 2, 1)
    assert (failed.malformed, failed.error, failed.policy_version) == (True, "boom", "policy@3")
    assert failed.finished_at is not None and failed.created_at == "2030-01-01T12:00:01.000000+00:00"
    assert [r.session_id for r in log.list_sessions(status="running")] == [ids[3], ids[0]]


def test_mark_stale_running_failed_uses_last_write(log: SessionLog, clock: Clock) -> None:
    abandoned, active, done = new_session(log), new_session(log), new_session(log)
    log.append_turn(abandoned, sampled())
    log.finish(done, "completed")
    clock.advance(hours=2)
    log.append_turn(active, sampled())  # still writing: not stale
    clock.advance(hours=1)
    assert log.mark_stale_running_failed(timedelta(minutes=90)) == 1
    record = log.get(abandoned)
    assert record.status == "failed" and "crash recovery" in (record.error or "")
    assert record.finished_at == "2030-01-01T15:00:00.000000+00:00"
    assert len(record.trajectory.turns) == 1
    assert log.get(active).status == "running" and log.get(done).status == "completed"
    assert log.mark_stale_running_failed(timedelta(minutes=90)) == 0
    assert log.mark_stale_running_failed(timedelta(0)) == 1


def test_a_lease_is_renewed_by_its_holder_only_and_lapses_into_interrupted_or_failed(
        log: SessionLog, clock: Clock) -> None:
    """Issue 34: the process running a session holds its lease; another owner cannot renew or take it while it is
    live; once it lapses a checkpointed session shows as interrupted (resumable), and the sweep fails any other."""
    from store.session_log import DEFAULT_LEASE_S, process_lease_owner
    from store.session_log.checkpoints import SessionRuns

    plain, durable, paused = new_session(log), new_session(log), new_session(log)
    runs = SessionRuns(log)
    runs.start(durable, durable)
    runs.start(paused, paused)
    runs.set_state(paused, "awaiting_approval", pause={"kind": "plan"}, expires_at="2031-01-01T00:00:00+00:00")
    lease = log.lease(plain)
    assert lease.owner == process_lease_owner() and lease.live(clock())
    assert lease.expires_in_s(clock()) == DEFAULT_LEASE_S
    assert not log.renew_lease(plain, 30, owner="other-host:1:x")  # live and someone else's
    assert log.renew_lease(plain, 30) and log.lease(plain).expires_in_s(clock()) == 30
    clock.advance(seconds=20)
    assert log.renew_lease(plain, 30)  # the heartbeat
    clock.advance(seconds=29)
    assert not runs.claim(runs.get(durable))  # type: ignore[arg-type]  # live: a resume cannot take it
    assert log.sweep_expired_leases().failed == () and not any(s.interrupted for s in log.list_sessions())
    log.release_lease(paused)  # a paused session waits for its answer, held by no process
    clock.advance(seconds=DEFAULT_LEASE_S)
    shown = {s.session_id: s.shown_status for s in log.list_sessions()}
    # Interrupted means resumable: the plain session (no checkpointed run) is not offered, and the sweep fails it.
    assert shown == {plain: "running", durable: "interrupted", paused: "running"}
    assert log.interrupted(durable) and not log.interrupted(plain) and not log.interrupted(paused)
    swept = log.sweep_expired_leases()
    assert swept.failed == (plain,) and swept.interrupted == (durable,)
    gone = log.get(plain)
    assert gone.status == "failed" and "was not checkpointed, so it cannot be resumed" in (gone.error or "")
    assert gone.metrics == {"interrupted": "lease_expired"}
    assert log.get(durable).status == "running" and log.get(paused).status == "running"
    assert runs.claim(runs.get(durable), lease_s=60, owner="resumer:2:y")  # type: ignore[arg-type]
    assert log.lease(durable).owner == "resumer:2:y" and not log.interrupted(durable)
    assert not log.renew_lease(durable, 30)  # the old holder's heartbeat no longer renews it


# --- crash safety and concurrency ------------------------------------------------------------------------------------

_CRASHING_WRITER = """
    import os, sys
    from store import PromptRecord, Turn
    log = open_target()
    sid = log.create_session("crash?", PromptRecord("p", (1,), "h"), {}, "policy@9", session_id="crashy")
    for i in range(3):
        turn = Turn(stage="plan", kind="sampled", text=f"t{i}", token_ids=(i, i + 1), logprobs=(-0.1 * i, -1.5))
        log.append_turn(sid, turn)
    print("written", flush=True)
    sys.stdin.readline()  # the parent inspects the log from another process meanwhile
    os._exit(3)  # die without finish() or close(): no atexit, no checkpoint, connections dropped mid-session
"""


@pytest.mark.timeout(60)
def test_turns_survive_a_killed_writer_and_recovery_fails_the_session(store_target: StoreTarget) -> None:
    child = run_child(_CRASHING_WRITER, store_target)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "written", child.stderr.read() if child.stderr else ""

    with store_target.open() as reader:  # visible from a second process before the session finishes
        record = reader.get("crashy")
        assert record.status == "running"
        assert [t.text for t in record.trajectory.turns] == ["t0", "t1", "t2"]
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.wait(timeout=30) == 3
    child.stdin.close()
    child.stdout.close()
    if child.stderr:
        child.stderr.close()
    if store_target.sqlite_path is not None:
        wal = store_target.sqlite_path.with_name(store_target.sqlite_path.name + "-wal")
        assert wal.exists() and wal.stat().st_size > 0  # the dead writer's WAL was never checkpointed

    with store_target.open() as reopened:
        record = reopened.get("crashy")
        assert record.status == "running"
        assert record.trajectory.turns[2] == Turn(stage="plan", kind="sampled", text="t2", token_ids=(2, 3),
                                                  logprobs=(-0.2, -1.5))
        assert reopened.mark_stale_running_failed(timedelta(0)) == 1
        record = reopened.get("crashy")
        assert record.status == "failed" and len(record.trajectory.turns) == 3


_PROCESS_WRITER = """
    import sys
    from store import Turn
    sid, tag = sys.argv[1], int(sys.argv[2])
    with open_target(synchronous="NORMAL") as log:
        for i in range(40):
            log.append_turn(sid, Turn(stage="research", kind="sampled", text=f"{tag}:{i}", token_ids=(tag, i)))
    print("done", flush=True)
"""


@pytest.mark.timeout(60)
def test_concurrent_writer_processes_get_contiguous_indices(store_target: StoreTarget) -> None:
    with store_target.open() as log:
        sid = new_session(log)
        children = [run_child(_PROCESS_WRITER, store_target, sid, str(tag)) for tag in (1, 2)]
        for child in children:
            out, err = child.communicate(timeout=45)
            assert (child.returncode, out.strip()) == (0, "done"), err
        turns = log.get(sid).trajectory.turns
    assert len(turns) == 80
    for tag in (1, 2):
        assert [t.token_ids[1] for t in turns if t.token_ids[0] == tag] == list(range(40))  # each writer's order kept


def test_concurrent_writer_threads_shared_and_separate_connections(store_target: StoreTarget) -> None:
    shared = store_target.open(synchronous="NORMAL")
    target = new_session(shared)
    own_logs = [store_target.open(synchronous="NORMAL") for _ in range(3)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def write(log: SessionLog, tag: int) -> None:
        try:
            barrier.wait()
            mine = new_session(log, f"thread {tag}")
            for i in range(25):
                log.append_turn(target, Turn(stage="plan", kind="sampled", text=f"{tag}:{i}", token_ids=(tag, i)))
                log.append_turn(mine, Turn(stage="plan", kind="sampled", text="m", token_ids=(i,)))
            log.finish(mine, "completed")
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    writers = [(shared, tag) for tag in range(3)] + [(own, 3 + n) for n, own in enumerate(own_logs)]
    threads = [threading.Thread(target=write, args=args) for args in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for own in own_logs:
        own.close()
    assert errors == []
    turns = shared.get(target).trajectory.turns
    assert len(turns) == 150
    for tag in range(6):
        assert [t.token_ids[1] for t in turns if t.token_ids[0] == tag] == list(range(25))
    assert len(shared.completed_unjudged()) == 6
    assert all(len(shared.get(s).trajectory.turns) == 25 for s in shared.completed_unjudged())
    shared.close()


def test_lock_held_past_busy_timeout_raises_store_busy_and_loses_nothing(store_target: StoreTarget) -> None:
    with store_target.open(busy_timeout_s=0.2) as log, store_target.open() as blocker:
        sid = new_session(log)
        with blocker.transaction(write=True):  # another writer holds the write lock
            with pytest.raises(StoreBusy):
                log.append_turn(sid, sampled())
            assert log.get(sid).trajectory.turns == ()  # readers are not blocked
        assert log.append_turn(sid, sampled()) == 0


def test_usable_from_asyncio_worker_threads(log: SessionLog) -> None:
    async def session() -> str:
        sid = await asyncio.to_thread(new_session, log)
        indices = await asyncio.gather(*(asyncio.to_thread(log.append_turn, sid, sampled()) for _ in range(10)))
        assert sorted(indices) == list(range(10))
        await asyncio.to_thread(log.finish, sid, "completed")
        return sid

    sid = asyncio.run(session())
    assert len(log.get(sid).trajectory.turns) == 10


def test_store_package_imports_without_torch() -> None:
    code = "import sys, store, store.session_log, store.migrations; " \
           "bad = {'torch', 'transformers', 'peft', 'sentence_transformers'} & set(sys.modules); assert not bad, bad"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_copying_the_database_file_while_open_keeps_committed_turns(tmp_path: Path) -> None:
    """A backup copy of the main file plus its WAL is a consistent database (what `cp -a data/` gives you)."""
    path = tmp_path / "log.sqlite3"
    with SessionLog(path) as log:
        sid = new_session(log)
        log.append_turn(sid, sampled())
        backup = tmp_path / "backup"
        backup.mkdir()
        for suffix in ("", "-wal"):
            shutil.copy(path.with_name(path.name + suffix), backup / (path.name + suffix))
    with SessionLog(backup / path.name) as restored:
        assert len(restored.get(sid).trajectory.turns) == 1


def test_judgement_outcomes_and_rubric_buffers_round_trip(log: SessionLog) -> None:
    sid = log.create_session("q?", PromptRecord("p", (1, 2), "h"), {}, "base")
    log.finish(sid, "completed", report="r")
    assert log.completed_unjudged() == [sid]
    log.record_judgement(sid, "judge-x", {"attempt": 1}, status="failed", error="judge timed out", judge_kind="llm")
    assert log.completed_unjudged() == [sid]  # a failed attempt is recorded, and the session is offered again
    log.record_judgement(sid, "offline-minilm", {"stages": {"answer": 0.5}}, judge_kind="offline", rubric_version="3")
    assert log.completed_unjudged() == []
    recs = log.judgements(sid)
    assert [(r.status, r.judge_kind, r.error) for r in recs] == [
        ("failed", "llm", "judge timed out"), ("ok", "offline", None)]
    assert recs[1].payload == {"stages": {"answer": 0.5}} and recs[1].rubric_version == "3"
    with pytest.raises(InvalidInput):
        log.record_judgement(sid, "judge-x", {}, status="failed")  # a failure needs its error
    assert log.load_rubric_buffer("abc") is None
    assert log.save_rubric_buffer("abc", "q?", {"active": []}) == 1
    assert log.save_rubric_buffer("abc", "q?", {"active": [1]}) == 2
    assert log.load_rubric_buffer("abc") == ({"active": [1]}, 2)


def test_doubles_and_64_bit_integers_round_trip_exactly(log: SessionLog) -> None:
    """Doubles stay 64-bit and integers 64-bit on both backends (PostgreSQL's REAL and INTEGER are 32-bit)."""
    sid = new_session(log)
    log.append_tool_call(sid, ToolCallRecord(tool="t", query="q", seconds=0.1 + 0.2))
    log.finish(sid, "completed", report="r")
    log.record_judgement(sid, "judge", {})
    candidate = ReflectionCandidate(index=0, text="r\x00\ud800", token_ids=(1, 2**31 - 1), policy_version="policy@3",
                                    logprobs=(-0.1, -2.5), seed=2**62 + 1, valid=True, u=0.1 + 0.2, u_cross=5e-324)
    batch = log.record_reflection_batch(sid, [candidate], prompt=PROMPT, judge_model="judge", temperature=0.7,
                                        max_tokens=2**40)
    (stored,) = log.reflection_candidates(batch_id=batch)
    assert stored.candidate == candidate
    assert (stored.temperature, stored.max_tokens) == (0.7, 2**40)
    assert log.get(sid).trajectory.tool_calls[0].seconds == 0.1 + 0.2
