"""What only the PostgreSQL backend has, on the real test server: choosing it by setting, bad or unreachable URLs
refused at open with typed errors and nothing written, the password kept out of errors, logs and reprs, and the
named advisory lock (the retraining cycle lock) released when its holder dies."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
import traceback
from pathlib import Path

import psycopg
import pytest
from pydantic import SecretStr

from store import InvalidInput, LockHeld, PromptRecord, SessionLog, StorageError, StoreConfig, StoreUnreachable
from store.db import advisory_lock
from store.migrations import load_migrations
from tests.postgres import PostgresServer
from tests.servers import free_port

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55"


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")}


def _shows_no_secret(exc: BaseException, secret: str) -> None:
    shown = "".join(traceback.format_exception(exc)) + repr(exc)
    assert secret not in shown, shown


def test_the_setting_chooses_the_backend(postgres_url: str, tmp_path: Path) -> None:
    with SessionLog.from_config(StoreConfig(data_dir=tmp_path, database_url=SecretStr(postgres_url))) as log:
        sid = log.create_session("q?", PromptRecord("p", (1,), "h"), {}, "base")
        assert (log.backend, log.path) == ("postgresql", None)
        assert log.location.startswith("postgresql://rubricem@127.0.0.1:") and "@" in log.location
    assert not (tmp_path / "rubricem.sqlite3").exists()
    with SessionLog(database_url=postgres_url) as again:
        assert again.get(sid).question == "q?"
    # Unset, or empty as compose passes an unset variable: SQLite in data_dir.
    for config in (StoreConfig(data_dir=tmp_path), StoreConfig(data_dir=tmp_path, database_url="  ")):
        with SessionLog.from_config(config) as local:
            assert (local.backend, local.path) == ("sqlite", tmp_path / "rubricem.sqlite3")


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://rubricem:{SECRET}@127.0.0.1/db",
        f"rubricem:{SECRET}@127.0.0.1/db",
        f"host=127.0.0.1 password={SECRET}",
        f"postgresql://rubricem:{SECRET}@127.0.0.1:5432/db?no_such_option=1",
        f"postgresql://rubricem:{SECRET}@[::1/db",
    ],
    ids=["other-scheme", "no-scheme", "keyword-form", "unknown-option", "unclosed-ipv6"],
)
def test_a_malformed_url_is_invalid_input_without_the_password(url: str) -> None:
    with pytest.raises(InvalidInput, match="postgresql://") as refused:
        SessionLog(database_url=url)
    _shows_no_secret(refused.value, SECRET)


def test_unreachable_or_refusing_servers_give_store_unreachable_and_write_nothing(
    postgres_server: PostgresServer, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    dbname = postgres_url.rsplit("/", 1)[1]
    cases = {
        "refused": (f"postgresql://rubricem:{SECRET}@127.0.0.1:{free_port()}/{dbname}", "refused"),
        "wrong password": (postgres_server.url(dbname, password=SECRET), "password authentication failed"),
        "no such database": (postgres_server.url("no_such_db"), "does not exist"),
    }
    caplog.set_level(logging.DEBUG)
    for name, (url, reason) in cases.items():
        with pytest.raises(StoreUnreachable, match=reason) as refused:
            SessionLog(database_url=url)
        assert isinstance(refused.value, StorageError), name
        assert "rubricem@127.0.0.1" in str(refused.value)  # says where it tried, without the password
        _shows_no_secret(refused.value, SECRET)
        _shows_no_secret(refused.value, postgres_server.password)
    assert SECRET not in caplog.text and postgres_server.password not in caplog.text
    assert _tables(postgres_url) == set()  # the failed opens wrote nothing


def test_the_password_never_shows_in_reprs_diagnostics_or_errors(postgres_url: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    password = postgres_url.split(":")[2].split("@")[0]
    caplog.set_level(logging.DEBUG)
    config = StoreConfig(database_url=postgres_url)
    with SessionLog(database_url=SecretStr(postgres_url)) as log:
        shown = [repr(config), str(config.model_dump()), repr(log), log.location, str(log.pragmas())]
        with pytest.raises(StorageError) as failed, log.transaction(write=False) as conn:
            conn.execute("SELECT no_such_column FROM sessions")
        shown.append("".join(traceback.format_exception(failed.value)))
    assert all(password not in text for text in shown), shown
    assert password not in caplog.text


def test_diagnostics_name_the_server_schema_and_lock_timeout(postgres_url: str) -> None:
    with SessionLog(database_url=postgres_url, busy_timeout_s=2.5) as log:
        info = log.pragmas()
    assert info["backend"] == "postgresql" and info["schema_version"] == len(load_migrations())
    assert info["lock_timeout"] == "2500ms" and str(info["server_version"])[:2].isdigit()


def test_close_ends_the_logs_server_sessions(postgres_server: PostgresServer, postgres_url: str) -> None:
    dbname = postgres_url.rsplit("/", 1)[1]

    def sessions() -> int:
        with psycopg.connect(postgres_server.url("postgres")) as admin:
            row = admin.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = %s AND application_name = "
                                "'rubricem'", (dbname,)).fetchone()
        return int(row[0]) if row else 0

    log = SessionLog(database_url=postgres_url)
    log.create_session("q?", PromptRecord("p", (1,), "h"), {}, "base")
    assert sessions() >= 1
    log.close()
    log.close()
    assert sessions() == 0


def test_a_turn_whose_connection_breaks_is_retried_once_and_stored_once(postgres_url: str) -> None:
    """The server ends the log's connection in the middle of a turn's transaction (a trigger on `turns` terminates
    its own backend on the first insert only, as a restart or a network cut would): that transaction rolls back,
    the turn is retried once on a fresh connection and stored exactly once, right after the turns before it. A
    connection that dies again on the retry fails the write with `ConnectionLost`, nothing half-written."""
    from store.errors import ConnectionLost
    from store.records import Turn

    log = SessionLog(database_url=postgres_url)
    sid = log.create_session("q?", PromptRecord("p", (1,), "h"), {}, "base")
    log.append_turn(sid, Turn(stage="plan", kind="sampled", text="<think>plan</think>", token_ids=(3, 4)))
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("CREATE SEQUENCE fault_seq")
        admin.execute("CREATE TABLE fault_plan (kill_at BIGINT[])")
        admin.execute("INSERT INTO fault_plan VALUES (ARRAY[1])")
        admin.execute(
            "CREATE FUNCTION die_on_plan() RETURNS trigger AS $$ BEGIN "
            "IF nextval('fault_seq') = ANY ((SELECT kill_at FROM fault_plan LIMIT 1)::BIGINT[]) THEN "
            "PERFORM pg_terminate_backend(pg_backend_pid()); END IF; RETURN NEW; END $$ LANGUAGE plpgsql")
        admin.execute("CREATE TRIGGER die_on_plan BEFORE INSERT ON turns FOR EACH ROW EXECUTE FUNCTION die_on_plan()")
    idx = log.append_turn(sid, Turn(stage="research", kind="sampled", text="<call_tool>q</call_tool>",
                                    token_ids=(5, 6, 7)))
    assert idx == 1
    assert [t.text for t in log.get(sid).trajectory.turns] == ["<think>plan</think>", "<call_tool>q</call_tool>"]

    with psycopg.connect(postgres_url, autocommit=True) as admin:  # the next turn: both attempts break
        admin.execute("UPDATE fault_plan SET kill_at = ARRAY[3, 4]")
    with pytest.raises(ConnectionLost):
        log.append_turn(sid, Turn(stage="research", kind="sampled", text="lost", token_ids=(8,)))
    assert [t.text for t in log.get(sid).trajectory.turns] == ["<think>plan</think>", "<call_tool>q</call_tool>"]
    log.close()


_HOLDER = """
    import os, sys, time
    from store.db import advisory_lock
    with advisory_lock(os.environ["STORE_TARGET"], "rubricem.test_lock"):
        print("held", flush=True)
        time.sleep(120)
"""


@pytest.mark.timeout(120)
def test_a_named_lock_is_exclusive_and_released_when_its_holder_dies(postgres_url: str) -> None:
    with advisory_lock(postgres_url, "rubricem.test_lock"):
        with pytest.raises(LockHeld, match="rubricem.test_lock"), advisory_lock(postgres_url, "rubricem.test_lock"):
            pass
        with advisory_lock(postgres_url, "rubricem.other_lock"), SessionLog(database_url=postgres_url) as log:
            log.create_session("q?", PromptRecord("p", (1,), "h"), {}, "base")  # other locks and writes go on
    with advisory_lock(postgres_url, "rubricem.test_lock"):  # released at the end of the block
        pass

    env = {**os.environ, "PYTHONPATH": str(REPO), "STORE_TARGET": postgres_url}
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_HOLDER)], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld), advisory_lock(postgres_url, "rubricem.test_lock"):
            pass
    finally:
        holder.kill()  # SIGKILL: no cleanup runs in the holder
        holder.communicate(timeout=30)
    # The server ends the dead client's session as soon as it sees the closed socket; poll until it has.
    for _ in range(300):
        try:
            with advisory_lock(postgres_url, "rubricem.test_lock"):
                break
        except LockHeld:
            time.sleep(0.1)
    else:
        pytest.fail("the lock of a killed holder was never released")
