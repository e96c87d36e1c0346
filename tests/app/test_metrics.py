"""The Prometheus endpoints (issue 36): scraped over HTTP after a real session and a real retrain cycle, the counters
have moved.

One research session runs through the real MCP HTTP server (the SDK's Starlette app under uvicorn, in this process)
on the embedded SmolLM2 with one tool call and small token caps; that server's GET /metrics is then scraped, with and
without its token. The scheduler's endpoint (`serve_metrics`, what `rubricem scheduler` starts) is scraped around the
scheduler's own job, which records a skipped cycle (one new session < min_new_sessions), and around a promotion.
The store-backed gauges are also checked on both store backends against what `rubricem sessions list` shows.
"""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import AgentConfig, RunOptions, StageTokenCaps
from app.container import Services
from app.mcp_server import build_server, mount_metrics, transport_security
from app.metrics import METRICS_PATH, StoreCollector, metrics_registry
from app.scheduler import scheduled_job, serve_metrics
from app.service import ResearchService
from app.settings import Settings, TelemetryConfig
from learning.config import LearningConfig, RetrainConfig
from store.config import StoreConfig
from store.records import PromptRecord
from store.registry import Registry
from store.session_log import SessionLog
from store.session_log.checkpoints import SessionRuns
from tests.servers import free_port

TOKEN = "metrics-token-0b9d6c1e-7f3a-4e25-a1c8"  # at least 32 characters, as `rubricem mcp` requires
SMALL = RunOptions(format="short_form", max_tool_calls=1, temperature=0.7, seed=1, wall_clock_s=600,
                   token_caps=StageTokenCaps(plan=24, research=16, review=16, answer=24), context_tokens=4096,
                   inject_bank=False)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
        return parse(response.read().decode())


@pytest.mark.slow
@pytest.mark.timeout(600)  # model load and one tiny session, then one skipped cycle: well under a minute when idle
def test_the_endpoints_show_the_session_and_the_cycle_moving_the_counters(
    tmp_path: Path, embedded_policy: Any, local_tools: dict[str, Any]
) -> None:
    settings = Settings(agent=AgentConfig(defaults=SMALL), store=StoreConfig(data_dir=tmp_path / "data"),
                        learning=LearningConfig(retrain=RetrainConfig(min_new_sessions=2)),
                        telemetry=TelemetryConfig(metrics_port=free_port()))
    log = SessionLog.from_config(settings.store)
    research = ResearchService(embedded_policy, local_tools, log, settings.agent)
    services = Services(settings, log, None, local_tools, embedded_policy, research, None,  # type: ignore[arg-type]
                        Registry(log))
    port = free_port()
    root = f"http://127.0.0.1:{port}"

    # ---- the MCP HTTP server: one research session, then its /metrics -------------------------------------------
    security = transport_security("127.0.0.1", port)
    server = build_server(services, token=TOKEN, base_url=f"{root}/mcp", owner="mcp")
    mount_metrics(server, metrics_registry(log), token=TOKEN, security=security)  # as `rubricem mcp` does
    app = server.streamable_http_app(streamable_http_path="/mcp", transport_security=security, host="127.0.0.1")

    async def drive() -> tuple[Samples, Samples, dict[str, int], Any]:
        import uvicorn
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        serving = asyncio.create_task(uv.serve())
        while not uv.started:
            assert not serving.done(), "uvicorn stopped before it served"
            await asyncio.sleep(0.05)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        try:
            async with httpx2.AsyncClient(timeout=60) as http:
                refused = {
                    "no token": (await http.get(f"{root}{METRICS_PATH}")).status_code,
                    "wrong token": (await http.get(f"{root}{METRICS_PATH}",
                                                   headers={"Authorization": "Bearer " + "x" * 40})).status_code,
                    "foreign host": (await http.get(f"{root}{METRICS_PATH}",
                                                    headers={**auth, "Host": f"rebound.example:{port}"})).status_code,
                }
                before = parse((await http.get(f"{root}{METRICS_PATH}", headers=auth)).text)
            async with (httpx2.AsyncClient(headers=auth, timeout=600) as http,
                        streamable_http_client(f"{root}/mcp", http_client=http) as (read, write),
                        ClientSession(read, write) as session):
                await session.initialize()
                result = await session.call_tool("research", {"question": "Who was Haymo of Faversham?"})
            async with httpx2.AsyncClient(timeout=60) as http:
                response = await http.get(f"{root}{METRICS_PATH}", headers=auth)
                assert response.status_code == 200, response.text
                after = parse(response.text)
        finally:
            uv.should_exit = True
            await serving
        return before, after, refused, result

    before, after, refused, result = asyncio.run(drive())
    assert not result.is_error, result.content
    assert refused == {"no token": 401, "wrong token": 401, "foreign host": 421}

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # the store's view: one completed session, base live
    assert value(before, "rubricem_store_sessions", status="completed") == 0
    assert value(after, "rubricem_store_sessions", status="completed") == 1
    assert value(after, "rubricem_store_sessions", status="running") == 0
    assert value(after, "rubricem_live_policy_info", version="base") == 1
    assert value(after, "rubricem_store_up") == 1
    # this process's instruments: the session, its stages, its policy calls and its one tool call
    assert moved("rubricem_sessions_finished_total", status="completed") == 1
    for stage in ("plan", "research", "review", "answer"):
        assert moved("rubricem_stage_seconds_count", stage=stage) >= 1, stage
    assert moved("rubricem_tool_calls_total", tool="local_search") == 1
    assert moved("rubricem_tool_seconds_count", tool="local_search") == 1
    assert moved("rubricem_tool_errors_total", tool="local_search") == 0
    assert moved("rubricem_policy_tokens_total", kind="sampled") > 0
    assert moved("rubricem_policy_call_seconds_count") >= 4

    # ---- the scheduler's endpoint: its job records a skipped cycle; a promotion moves the live version ------------
    # A document of the operator's own in the data folder's index: the cycle then does not index the bundled demo
    # corpus first (app.container.ensure_corpus), which would be most of this test's time.
    from app.container import open_index
    from store.doc_index import Document

    open_index(settings).add_documents([Document(source="notes.md", chunk=0, title="notes",
                                                 text="Haymo of Faversham was an English Franciscan.")])
    metrics = serve_metrics(settings)
    assert metrics is not None and metrics.port == settings.telemetry.metrics_port
    try:
        url = f"http://127.0.0.1:{metrics.port}{METRICS_PATH}"
        before = scrape(url)
        scheduled_job(settings)  # 1 new session < min_new_sessions 2: recorded as skipped, nothing trained
        after = scrape(url)
        assert value(before, "rubricem_store_retrain_cycles_total", outcome="skipped") == 0
        assert value(after, "rubricem_store_retrain_cycles_total", outcome="skipped") == 1
        assert value(after, "rubricem_store_retrain_cycles_total") == 1
        assert value(after, "rubricem_store_retrain_cycle_running") == 0
        assert moved("rubricem_retrain_cycles_total", outcome="skipped") == 1
        assert value(after, "rubricem_store_sessions", status="completed") == 1  # the same store, seen from here

        from agent.config import SHIPPED_SFT_ADAPTER

        registry = Registry(log)
        registry.promote(registry.register(SHIPPED_SFT_ADAPTER, parent="base").name, "test")
        promoted = scrape(url)
        assert value(promoted, "rubricem_live_policy_info", version="policy@1") == 1
        assert value(promoted, "rubricem_live_policy_info", version="base") == 0
        assert value(promoted, "rubricem_live_policy_number") == 1
    finally:
        metrics.close()
        log.close()


def test_the_scheduler_stops_with_the_setting_to_change_when_the_metrics_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    from app.cli import main

    for name in [n for n in os.environ if n.startswith("RUBRICEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env
    monkeypatch.setenv("RUBRICEM_STORE__DATA_DIR", str(tmp_path / "data"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("RUBRICEM_TELEMETRY__METRICS_PORT", str(taken.getsockname()[1]))
        assert main(["scheduler"]) == 2  # before any job: the scheduler never starts
    err = capsys.readouterr().err
    assert "is in use" in err and "RUBRICEM_TELEMETRY__METRICS_PORT" in err and "Traceback" not in err


def test_a_scheduler_run_locked_out_by_another_cycle_counts_as_skipped_in_both_views(tmp_path: Path) -> None:
    from app.scheduler import cycle_lock

    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"),
                        telemetry=TelemetryConfig(metrics_port=free_port()))
    metrics = serve_metrics(settings)
    assert metrics is not None
    try:
        before = scrape(metrics.url)
        with cycle_lock(settings.store):  # another process's cycle, or a promotion, holds the lock
            scheduled_job(settings)
        after = scrape(metrics.url)
    finally:
        metrics.close()
    assert value(after, "rubricem_store_retrain_cycles_total", outcome="skipped") == 1
    assert (value(after, "rubricem_retrain_cycles_total", outcome="skipped")
            - value(before, "rubricem_retrain_cycles_total", outcome="skipped")) == 1


def test_the_scheduler_endpoint_answers_only_its_own_host_names_like_the_mcp_server(tmp_path: Path) -> None:
    """Issue 46: a web page whose DNS name an attacker rebinds to 127.0.0.1 reads /metrics with its own name as Host
    (and, from script, its own Origin); the scheduler's endpoint refuses both, as the MCP server's does."""
    settings = Settings(store=StoreConfig(data_dir=tmp_path / "data"),
                        telemetry=TelemetryConfig(metrics_port=free_port()))
    metrics = serve_metrics(settings)
    assert metrics is not None
    url = f"http://127.0.0.1:{metrics.port}{METRICS_PATH}"
    try:
        with httpx2.Client(timeout=30) as http:
            rebound = http.get(url, headers={"Host": f"rebound.example:{metrics.port}"})
            from_page = http.get(url, headers={"Origin": "http://rebound.example"})
            own = [http.get(url, headers={"Host": f"{name}:{metrics.port}"}) for name in ("127.0.0.1", "localhost")]
    finally:
        metrics.close()
    assert (rebound.status_code, from_page.status_code) == (421, 403)
    assert "rubricem_" not in rebound.text + from_page.text
    assert [r.status_code for r in own] == [200, 200] and "rubricem_store_up" in own[0].text


def test_a_wildcard_metrics_bind_needs_the_host_names_its_scrapers_use(tmp_path: Path) -> None:
    wildcard = TelemetryConfig(metrics_host="0.0.0.0", metrics_port=free_port())
    try:
        server = serve_metrics(Settings(store=StoreConfig(data_dir=tmp_path / "data"), telemetry=wildcard))
    except ValueError as exc:
        assert "RUBRICEM_TELEMETRY__METRICS_ALLOWED_HOSTS" in str(exc)
    else:
        assert server is not None
        server.close()
        pytest.fail("the scheduler served /metrics on every interface without knowing its Host names")
    named = wildcard.model_copy(update={"metrics_allowed_hosts": ["scheduler"]})
    server = serve_metrics(Settings(store=StoreConfig(data_dir=tmp_path / "data"), telemetry=named))
    assert server is not None
    try:
        with httpx2.Client(timeout=30) as http:
            url = f"http://127.0.0.1:{server.port}{METRICS_PATH}"
            assert http.get(url, headers={"Host": f"scheduler:{server.port}"}).status_code == 200
            assert http.get(url, headers={"Host": f"rebound.example:{server.port}"}).status_code == 421
    finally:
        server.close()


def test_port_zero_serves_nothing(tmp_path: Path) -> None:
    settings = Settings(store=StoreConfig(data_dir=tmp_path), telemetry=TelemetryConfig(metrics_port=0))
    assert serve_metrics(settings) is None


# ---- the store's gauges on both backends, as `rubricem sessions list` shows them ------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def clocked_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[SessionLog, list[datetime]]]:
    now = [datetime(2026, 5, 1, 12, tzinfo=UTC)]
    if request.param == "sqlite":
        log = SessionLog(tmp_path / "s.db", clock=lambda: now[0])
    else:
        log = SessionLog(database_url=request.getfixturevalue("postgres_url"), clock=lambda: now[0])
    with log:
        yield log, now


def test_sessions_by_status_match_the_sessions_list_on_both_backends(
    clocked_log: tuple[SessionLog, list[datetime]]
) -> None:
    log, now = clocked_log
    prompt = PromptRecord("User: q", (1, 2), "p")

    def session(question: str) -> str:
        return log.create_session(question, prompt, {}, "base")

    log.finish(session("done?"), "completed", report="yes")
    log.finish(session("broken?"), "failed", error="boom")
    session("running, not checkpointed?")  # its lease lapses below, but with no checkpoint it cannot be resumed
    runs = SessionRuns(log)
    runs.start(interrupted := session("cut off?"), "thread-1")
    runs.start(paused := session("waiting for approval?"), "thread-2")
    runs.set_state(paused, "awaiting_approval")
    now[0] += timedelta(hours=1)  # every lease has lapsed: the checkpointed active run shows as interrupted
    registry = Registry(log)
    registry.record_skip("scheduler", "too few", {})
    registry.start_cycle("cli", log.now())

    samples: Samples = {}
    for family in StoreCollector(log).collect():
        samples.update({(s.name, frozenset(s.labels.items())): s.value for s in family.samples})
    shown = [s.shown_status for s in log.list_sessions(limit=100)]
    assert log.interrupted(interrupted) and shown.count("interrupted") == 1
    assert {status: value(samples, "rubricem_store_sessions", status=status) for status in
            ("completed", "failed", "interrupted", "awaiting_approval", "running")} == {
        "completed": 1, "failed": 1, "interrupted": 1, "awaiting_approval": 1, "running": 1}
    # the list shows a paused session as running; the metric tells the two apart
    assert shown.count("running") == value(samples, "rubricem_store_sessions", status="running") + 1
    assert value(samples, "rubricem_store_retrain_cycles_total", outcome="skipped") == 1
    assert value(samples, "rubricem_store_retrain_cycle_running") == 1
    assert value(samples, "rubricem_live_policy_info", version="base") == 1
    assert value(samples, "rubricem_store_up") == 1


def test_a_store_that_does_not_answer_is_reported_and_the_rest_is_still_served(tmp_path: Path) -> None:
    from app.hostcheck import host_rule
    from app.metrics import start_metrics_server

    log = SessionLog(tmp_path / "s.db")
    port = free_port()
    rule = host_rule("127.0.0.1", port, who="the test's endpoint", setting="-")
    server = start_metrics_server(metrics_registry(log), "127.0.0.1", port, rule)
    try:
        log.close()  # the store is gone from under the endpoint
        samples = scrape(server.url)
        assert value(samples, "rubricem_store_up") == 0
        assert not [n for n, _ in samples if n.startswith("rubricem_store_sessions")]
        assert [n for n, _ in samples if n.startswith("process_") or n.startswith("python_")]
    finally:
        server.close()
    with pytest.raises(urllib.error.URLError):  # closed: the port is free again
        urllib.request.urlopen(server.url, timeout=5)
