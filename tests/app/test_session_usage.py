"""Tokens and cost of a real session (issue 36): one batch item researched by the embedded SmolLM2 on a real index
into a real SQLite log, then every view of it — `rubricem sessions show` and `list`, the chat's session view, the
batch record and index, the learning page's cycle — shows totals equal to the sums over the log's own turns (read
with plain SQL and from the decoded token ids), and a model the price table does not list shows "unknown", not $0."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from agent.accounting import ModelPrice, usage_of
from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app import cli
from app.batch import BatchItem, run_batch
from app.container import Services
from app.service import ResearchService
from app.settings import Settings
from app.ui import state
from app.ui.view import usage_table
from store.config import StoreConfig
from store.records import STAGES
from store.registry import Registry
from store.session_log import SessionLog

MAIN = str(Path(__file__).resolve().parents[2] / "app" / "ui" / "main.py")
SMALL = RunOptions(format="short_form", max_tool_calls=1, temperature=0.0, seed=0, wall_clock_s=300,
                   token_caps=StageTokenCaps(plan=40, research=24, review=24, answer=40), context_tokens=8192)
QUESTION = "What language were books being translated into during the era of Haymo of Faversham?"
# A non-empty table that lists neither the session's policy (embedded: 0 whatever the table says) nor its judge.
PRICES = {"gpt-4o-mini": ModelPrice(input_per_mtok=0.15, output_per_mtok=0.6)}
JUDGE_USAGE = {"calls": 2, "cached_calls": 0, "prompt_tokens": 1_234, "completion_tokens": 56, "cost_usd": 0.0}


@dataclass(frozen=True)
class Researched:
    data_dir: Path
    out_dir: Path
    session_id: str
    summary: object


@pytest.fixture(scope="module")
def researched(embedded_policy: object, small_index: object,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Researched]:
    from agent.tools.local_search import LocalSearch

    root = tmp_path_factory.mktemp("usage")
    store = StoreConfig(data_dir=root / "data")
    store.data_dir.mkdir(parents=True)
    tools = {"local_search": LocalSearch(small_index, k=3, snippet_chars=300)}  # type: ignore[arg-type]
    with SessionLog(store.sqlite_path) as log:
        svc = ResearchService(embedded_policy, tools, log, AgentConfig())  # type: ignore[arg-type]
        summary = asyncio.run(run_batch(svc, [BatchItem("q1", QUESTION)], root / "out", options=SMALL,
                                        prices=PRICES))
        (item,) = summary.items
        assert item.status == "done" and item.session_id is not None
        log.record_judgement(item.session_id, "judge-x", {"usage": JUDGE_USAGE})  # an LLM judge the table omits
    yield Researched(store.data_dir, root / "out", item.session_id, summary)


def log_sums(data_dir: Path, sid: str) -> dict[str, tuple[int, int, int]]:
    """Per stage, straight from the log: (sampled turns, SUM(turns.prompt_tokens) in SQL, sampled token ids)."""
    with SessionLog(StoreConfig(data_dir=data_dir).sqlite_path) as log:
        with log.transaction(write=False) as conn:
            rows = conn.execute("SELECT stage, COUNT(*), SUM(prompt_tokens), COUNT(prompt_tokens) FROM turns "
                                "WHERE session_id = ? AND kind = 'sampled' GROUP BY stage", (sid,)).fetchall()
        turns = log.get(sid).trajectory.turns
    sql = {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in rows}
    assert all(n == recorded for n, _, recorded in sql.values()), "every sampled turn records its prompt tokens"
    sampled = {s: sum(len(t.token_ids) for t in turns if t.kind == "sampled" and t.stage == s) for s in STAGES}
    return {s: (sql.get(s, (0, 0, 0))[0], sql.get(s, (0, 0, 0))[1], sampled[s]) for s in STAGES}


def test_each_sampled_turn_records_the_context_its_call_read(researched: Researched) -> None:
    with SessionLog(StoreConfig(data_dir=researched.data_dir).sqlite_path) as log:
        rec = log.get(researched.session_id)
    assert rec.policy_model == "embedded"
    context = len(rec.trajectory.prompt.token_ids)
    sampled = 0
    for turn in rec.trajectory.turns:
        if turn.kind == "sampled":
            assert turn.prompt_tokens == context  # the prompt plus every earlier turn, exactly
            sampled += 1
        else:
            assert turn.prompt_tokens is None
        context += len(turn.token_ids)
    assert sampled >= 4  # at least one per stage


def _row(text: str, label: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if re.match(rf"^  {label}\s", ln)]
    return line.split()


def test_sessions_show_and_list_totals_equal_the_logs_sums(researched: Researched, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    sums = log_sums(researched.data_dir, researched.session_id)
    monkeypatch.setenv("RUBRICEM_STORE__DATA_DIR", str(researched.data_dir))
    monkeypatch.setenv("RUBRICEM_PRICES", json.dumps({k: v.model_dump() for k, v in PRICES.items()}))
    assert cli.main(["sessions", "show", researched.session_id]) == 0
    shown = capsys.readouterr().out
    for stage, (calls, prompt, sampled) in sums.items():
        assert _row(shown, stage)[:5] == [stage, str(calls), f"{prompt:,}", f"{sampled:,}", "$0"]  # embedded: free
    calls, prompt, sampled = (sum(v[i] for v in sums.values()) for i in range(3))
    assert _row(shown, "policy")[:5] == ["policy", str(calls), f"{prompt:,}", f"{sampled:,}", "$0"]
    assert _row(shown, "judge")[:5] == ["judge", "2", "1,234", "56", "unknown"]  # not $0: judge-x is not priced
    assert _row(shown, "total")[:5] == ["total", str(calls + 2), f"{prompt + 1_234:,}", f"{sampled + 56:,}", "unknown"]
    assert "does not list judge-x" in shown
    assert cli.main(["sessions", "list"]) == 0
    (listed,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(researched.session_id)]
    assert "  unknown  " in listed

    monkeypatch.setenv("RUBRICEM_PRICES", "{}")  # the default: every model costs 0
    assert cli.main(["sessions", "show", researched.session_id]) == 0
    assert _row(capsys.readouterr().out, "total")[4] == "$0"


def test_the_chat_session_view_shows_the_same_totals(researched: Researched, embedded_policy: object) -> None:
    sums = log_sums(researched.data_dir, researched.session_id)
    settings = Settings(store=StoreConfig(data_dir=researched.data_dir), prices=PRICES)
    log = SessionLog(settings.store.sqlite_path)
    usage = usage_of(log, researched.session_id, settings.prices)
    assert usage is not None
    table = {r[""]: r for r in usage_table(usage)}
    for stage, (calls, prompt, sampled) in sums.items():
        assert (table[stage]["calls"], table[stage]["prompt tokens"], table[stage]["output tokens"]) == (
            calls, prompt, sampled)
    assert table["total"]["prompt tokens"] == sum(v[1] for v in sums.values()) + 1_234
    assert table["total"]["cost"] == "unknown" and table["policy"]["cost"] == "$0"

    with page_services(settings, log, embedded_policy):
        at = AppTest.from_file(MAIN, default_timeout=120)
        at.query_params["session"] = researched.session_id
        at.run()
    assert not at.exception, at.exception
    (box,) = [e for e in at.expander if "Tokens and cost" in e.label]
    read = sum(v[1] for v in sums.values()) + 1_234
    assert f"{read:,} tokens read" in box.label.replace("\\", "") and "cost unknown" in box.label
    frame = box.dataframe[0].value
    assert list(frame[""]) == [*STAGES, "policy", "judge", "total"]
    assert list(frame["prompt tokens"])[:4] == [sums[s][1] for s in STAGES]
    assert list(frame["cost"])[-2:] == ["unknown", "unknown"]
    log.close()


@contextmanager
def page_services(settings: Settings, log: SessionLog, policy: object) -> Iterator[None]:
    """The page's services, as `rubricem ui` puts them (tests/ui/conftest.py): the open loopback UI, the local admin;
    no document index or bank (the pages show "?" and "unavailable")."""
    research = ResearchService(policy, {}, log, settings.agent)  # type: ignore[arg-type]
    st_config.set_option("server.address", settings.ui.host)
    state.use(Services(settings, log, None, {}, policy, research, None, Registry(log)))  # type: ignore[arg-type]
    try:
        yield
    finally:
        state.use(None)
        st_config.set_option("server.address", None)


def _learning_script() -> None:
    from app.ui import learning_page

    learning_page.page()


def test_the_learning_page_shows_the_cost_of_the_cycle_that_judged_the_session(researched: Researched,
                                                                               embedded_policy: object) -> None:
    sums = log_sums(researched.data_dir, researched.session_id)
    settings = Settings(store=StoreConfig(data_dir=researched.data_dir), prices=PRICES)
    with SessionLog(settings.store.sqlite_path) as log:
        registry = Registry(log)
        cycle = registry.start_cycle("cli", log.now())  # its window holds the session
        registry.advance_cycle(cycle.cycle_id, "judged", numbers={"new_sessions": 1, "judged": 1})
        with page_services(settings, log, embedded_policy):
            at = AppTest.from_function(_learning_script, default_timeout=120)
            at.session_state["role"] = "user"
            at.run()
        registry.finish_cycle(cycle.cycle_id, "failed", error="the test's cycle")
    assert not at.exception, at.exception
    cycles = next(d.value for d in at.dataframe if "cost" in d.value.columns)
    row = cycles.iloc[0]
    assert row["policy tokens"] == sum(v[1] + v[2] for v in sums.values())
    assert (row["judge tokens"], row["cost"]) == (1_234 + 56, "unknown")  # judge-x is not in the table


def test_the_batch_record_and_index_carry_the_policys_tokens(researched: Researched) -> None:
    sums = log_sums(researched.data_dir, researched.session_id)
    calls, prompt, sampled = (sum(v[i] for v in sums.values()) for i in range(3))
    record = json.loads((researched.out_dir / "q1.json").read_text())
    assert record["usage"] == {"policy_model": "embedded", "policy_calls": calls, "prompt_tokens": prompt,
                               "sampled_tokens": sampled, "cost_usd": 0.0}
    index = json.loads((researched.out_dir / "index.json").read_text())
    assert index["usage"] == {"items": 1, "policy_calls": calls, "prompt_tokens": prompt, "sampled_tokens": sampled,
                              "cost_usd": 0.0, "cost": "$0"}
    assert (index["items"][0]["prompt_tokens"], index["items"][0]["cost"]) == (prompt, "$0")
    assert f"| {prompt:,} / {sampled:,} | $0 |" in (researched.out_dir / "index.md").read_text()
    usage = researched.summary.usage  # type: ignore[attr-defined]
    assert (usage.prompt_tokens, usage.sampled_tokens, usage.cost_usd) == (prompt, sampled, 0.0)
