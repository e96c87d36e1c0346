"""Traces (issue 36) against a real trace server: `rubricem ask` and `rubricem judge` export their spans by OTLP to
arize-phoenix (`make phoenix`), and the span tree is read back from phoenix's REST API. Without an endpoint nothing
is exported or started; with a backend that is down or hangs, the session still completes and says what it dropped.

One phoenix and one data folder (its demo-corpus index built once) serve the whole module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.telemetry import owner_hash
from tests.phoenix import Phoenix, running_phoenix, why_missing
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Who was Haymo of Faversham?"
EXIT_TIMEOUT_S = 2.0  # agent.telemetry.TracingOptions.exit_timeout_s


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """A real phoenix for the module (a skip where .phoenix is missing: under `make test` that is a failure)."""
    reason = why_missing()
    if reason is not None:
        pytest.skip(reason)
    with running_phoenix(tmp_path_factory.mktemp("phoenix")) as server:
        yield server


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data folder for the module's sessions, holding a few passages of its own (not the demo corpus: indexing it
    and building its BM25 in every `ask` process would be most of this module's time, and retrieval is not its
    subject)."""
    from app.settings import Settings
    from store.config import StoreConfig
    from tests.indexes import seed_passages

    folder = tmp_path_factory.mktemp("tracing-data")
    seed_passages(Settings(store=StoreConfig(data_dir=folder)))
    return folder


def cli_env(data_dir: Path, model_dir: Path, **extra: str) -> dict[str, str]:
    """The embedded default with tiny stage caps (as tests/app/test_cli.py), no OTLP variable unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUBRICEM_", "OTEL_"))}
    env.update({
        "RUBRICEM_STORE__DATA_DIR": str(data_dir),
        "RUBRICEM_AGENT__EMBEDDED_MODEL_PATH": str(model_dir),
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__PLAN": "32",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__RESEARCH": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__REVIEW": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__ANSWER": "32",
        "RUBRICEM_AGENT__LOCAL_SEARCH_K": "2",
        "RUBRICEM_AGENT__SNIPPET_CHARS": "300",
        "HF_HUB_OFFLINE": "1",
        **extra,
    })
    return env


def rubricem(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def ask(env: dict[str, str], out: Path) -> subprocess.CompletedProcess[str]:
    return rubricem(["ask", QUESTION, "--max-tool-calls", "1", "--seed", "3", "--quiet", "--json", str(out)], env)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


@pytest.mark.slow
def test_a_session_and_its_judging_export_the_span_tree_with_token_counts(
    phoenix: Phoenix, data_dir: Path, smollm2_dir: Path, llamacpp_server: str, tmp_path: Path
) -> None:
    env = cli_env(data_dir, smollm2_dir, OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.endpoint)
    out = tmp_path / "r.json"
    p = ask(env, out)
    assert p.returncode == 0, p.stderr[-3000:]
    payload = json.loads(out.read_text())
    sid = payload["session_id"]
    # The cheapest real LLM judge: SmolLM2 on the llama.cpp test server, 64-token answers, no cache, no retries.
    judged = rubricem(["judge", "--limit", "1"], {
        **env, "RUBRICEM_LEARNING__JUDGE__BASE_URL": llamacpp_server, "RUBRICEM_LEARNING__JUDGE__MODEL": "smollm2",
        "RUBRICEM_LEARNING__JUDGE__JSON_MODE": "json_object", "RUBRICEM_LEARNING__JUDGE__MAX_TOKENS": "64",
        "RUBRICEM_LEARNING__JUDGE__MAX_RETRIES": "0", "RUBRICEM_LEARNING__JUDGE__CACHE": "false",
        "RUBRICEM_LEARNING__JUDGE__TRAJECTORY_CHARS": "1000",
        # The price table prices the judge's model ($1 per prompt token, $2 per completion token: easy to check).
        "RUBRICEM_PRICES": '{"smollm2": {"input_per_mtok": 1000000, "output_per_mtok": 2000000}}'})
    assert judged.returncode in (0, 1) and "judge smollm2 (llm)" in judged.stdout, judged.stderr[-3000:]
    billed = re.search(r"tokens (\d+)\+(\d+), cost (\S+)", judged.stdout)
    assert billed, judged.stdout
    assert billed[3] == f"${int(billed[1]) + 2 * int(billed[2]):.4f}"  # the table's price, not the legacy fields' 0

    spans = phoenix.wait_until(lambda got: any(s["attributes"].get("rubricem.session.id") == sid for s in got) and any(
        s["name"] == "judge_group" and s["attributes"].get("rubricem.judge.kind") == "llm" for s in got))
    by_id = {s["context"]["span_id"]: s for s in spans}

    # The session's root span: its id, the owner as a hash (the CLI runs as `local`), the policy version.
    (root,) = [s for s in spans if s["name"] == "research_session" and s["attributes"]["rubricem.session.id"] == sid]
    attrs = root["attributes"]
    assert root["parent_id"] is None
    assert attrs["rubricem.owner.hash"] == owner_hash("local") and "local" not in attrs.values()
    assert attrs["rubricem.policy.version"] == payload["policy_version"]
    assert attrs["rubricem.session.source"] == "cli" and attrs["rubricem.session.status"] == "completed"
    assert attrs["rubricem.question.chars"] == len(QUESTION) and "rubricem.question.text" not in attrs
    session = [s for s in spans if s["context"]["trace_id"] == root["context"]["trace_id"]]

    # One stage span per graph node call, children of the root.
    stages = [s for s in session if s["name"].startswith("stage ")]
    assert {s["name"] for s in stages} >= {"stage plan", "stage research", "stage tools", "stage answer"}
    assert all(s["parent_id"] == root["context"]["span_id"] for s in stages)

    # Each policy call under its stage, with the GenAI token counts and finish reason.
    calls = [s for s in session if s["name"].startswith("text_completion ")]
    assert len(calls) >= 3
    for c in calls:
        a = c["attributes"]
        assert by_id[c["parent_id"]]["name"].startswith("stage ")
        assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == "embedded"
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] >= 0
        assert a["gen_ai.response.finish_reasons"] and a["gen_ai.request.max_tokens"] > 0
    assert sum(c["attributes"]["gen_ai.usage.output_tokens"] for c in calls) > 0

    # The tool call, under the tools stage.
    (tool,) = [s for s in session if s["name"].startswith("execute_tool ")]
    a = tool["attributes"]
    assert tool["name"] == "execute_tool local_search" and by_id[tool["parent_id"]]["name"] == "stage tools"
    assert a["gen_ai.tool.name"] == "local_search" and a["rubricem.tool.source"] == "builtin"
    assert a["gen_ai.tool.call.id"] and a["rubricem.tool.results"] >= 1

    # The judge's pass over the session, and its chat requests with the tokens they cost.
    (group,) = [s for s in spans if s["name"] == "judge_group" and s["attributes"]["rubricem.judge.kind"] == "llm"]
    assert group["attributes"]["rubricem.session.ids"] == [sid]
    chats = [s for s in spans if s["name"] == "chat smollm2"]
    assert chats and all(c["parent_id"] == group["context"]["span_id"] for c in chats)
    for c in chats:
        a = c["attributes"]
        assert a["gen_ai.operation.name"] == "chat" and a["rubricem.judge.call"] in {"rubric_generation",
                                                                                     "stage_scoring"}
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["rubricem.judge.cached"] is False and a["gen_ai.response.finish_reasons"]

    # Nothing personal: the question's text is in no span (the setting that allows it is off by default).
    for s in spans:
        for value in s["attributes"].values():
            assert all("Haymo" not in text for text in _strings(value)), s


def test_an_mcp_tool_call_is_a_tool_span_marked_mcp(phoenix: Phoenix, tmp_path: Path) -> None:
    # A scripted model (tests/fakes.py) calls `lookup` on the real stdio MCP test server (tests/tools/mcp_servers.py).
    code = """
import asyncio
from agent.config import AgentConfig
from app.container import enable_tracing
from app.service import ResearchService
from app.settings import Settings
from store.session_log import SessionLog
from tests.agent.scripts import well_formed
from tests.fakes import ScriptedPolicy
from tests.tools.test_mcp_tools import OPTS, stdio, tools_of

assert enable_tracing(Settings())
service = ResearchService(ScriptedPolicy(well_formed(n_calls=1, tool="lookup", bogus_cite=False)),
                          dict(tools_of(stdio(["lookup"]))), SessionLog(Settings().store.data_dir / "s.sqlite3"),
                          AgentConfig())
print(asyncio.run(service.run("Who was Haymo of Faversham?", OPTS)).session_id)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUBRICEM_", "OTEL_"))}
    env.update({"RUBRICEM_STORE__DATA_DIR": str(tmp_path), "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.endpoint})
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    sid = p.stdout.strip().splitlines()[-1]
    spans = phoenix.wait_until(lambda got: any(s["attributes"].get("rubricem.session.id") == sid for s in got))
    (root,) = [s for s in spans if s["attributes"].get("rubricem.session.id") == sid]
    (tool,) = [s for s in spans if s["name"] == "execute_tool lookup"]
    assert tool["context"]["trace_id"] == root["context"]["trace_id"]
    assert tool["attributes"]["rubricem.tool.source"] == "mcp" and tool["attributes"]["rubricem.tool.results"] == 2


@pytest.mark.slow
def test_a_retrain_cycle_exports_its_span_with_its_phases(phoenix: Phoenix, data_dir: Path, smollm2_dir: Path) -> None:
    # With the offline judge and at most one question in the log the cycle judges, then stops before training.
    p = rubricem(["retrain", "--now"], cli_env(data_dir, smollm2_dir, OTEL_EXPORTER_OTLP_ENDPOINT=phoenix.endpoint))
    assert p.returncode == 0 and ": skipped — only" in p.stdout, p.stderr[-3000:]
    cycle_id = p.stdout.split(":")[0]
    spans = phoenix.wait_for("retrain_cycle")
    (cycle,) = [s for s in spans if s["name"] == "retrain_cycle"]
    attrs = cycle["attributes"]
    assert cycle["parent_id"] is None
    assert attrs["rubricem.cycle.id"] == cycle_id and attrs["rubricem.cycle.trigger"] == "cli"
    assert attrs["rubricem.cycle.outcome"] == "skipped" and attrs["rubricem.policy.version"] == "base"
    phases = [s for s in spans if s["parent_id"] == cycle["context"]["span_id"]]
    assert [s["name"] for s in phases] == ["retrain judge"]  # train, gate and promote did not run
    assert phases[0]["attributes"]["rubricem.cycle.phase"] == "judge"


def test_without_an_endpoint_no_exporter_provider_or_thread_exists(tmp_path: Path) -> None:
    code = """
import gc, sys, threading
from opentelemetry import trace
from agent import telemetry
from app.container import enable_tracing
from app.settings import Settings

settings = Settings()
assert settings.tracing_options() is None
assert enable_tracing(settings) is False and not telemetry.tracing_enabled()
with telemetry.session_span("s", owner="o", policy_version="v", question="q") as root:
    with telemetry.stage_span("plan") as stage, telemetry.tool_call("local_search") as tool:
        tool.results(1)
assert not root.span.is_recording() and not stage.is_recording() and not tool.span.is_recording()
assert type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider", trace.get_tracer_provider()
assert not [t.name for t in threading.enumerate() if t.name.startswith(("Otel", "rubricem-trace"))]
exporters = [o for o in gc.get_objects() if type(o).__name__ in ("OTLPSpanExporter", "_DroppingExporter")]
assert not exporters, exporters
print("off")
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUBRICEM_", "OTEL_"))}
    env["RUBRICEM_STORE__DATA_DIR"] = str(tmp_path)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "off", p.stderr[-3000:]


class _Hanging(BaseHTTPRequestHandler):
    """A trace backend that takes the request and never answers (until the test ends)."""

    release = threading.Event()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.release.wait(300)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hanging_backend() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hanging)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Hanging.release.set()
        server.shutdown()
        server.server_close()
        _Hanging.release.clear()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["down", "hanging"])
def test_a_trace_backend_that_is_down_or_hangs_never_fails_or_holds_up_a_session(
    backend: str, request: pytest.FixtureRequest, data_dir: Path, smollm2_dir: Path, tmp_path: Path
) -> None:
    # Down: nothing listens (each batch fails after its retries, 5 s). Hanging: every export waits its full 60 s.
    if backend == "down":
        extra = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    else:
        extra = {"OTEL_EXPORTER_OTLP_ENDPOINT": request.getfixturevalue("hanging_backend"),
                 "RUBRICEM_TELEMETRY__EXPORT_TIMEOUT_S": "60"}
    out = tmp_path / "r.json"
    began = time.monotonic()
    p = ask(cli_env(data_dir, smollm2_dir, **extra), out)
    ended, elapsed = time.time(), time.monotonic() - began
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(out.read_text())["report"]  # the session completed and its report was written
    # Spans are dropped with a warning: a failed export during the run, or the last ones at exit.
    assert "could not be exported to" in p.stderr or "did not take the last" in p.stderr, p.stderr[-3000:]
    if backend == "hanging":
        # The first export hangs for its full 60 s: a session that waited on an export at any span's end would take
        # 60 s per span (a session has about 20), far beyond this bound (generous: a loaded 2-core machine).
        assert elapsed < 450, elapsed
        assert f"within {EXIT_TIMEOUT_S:.1f} s; they are dropped" in p.stderr, p.stderr[-3000:]
    # The report file is the command's last act: from there to the process's end is the exit, bounded by its
    # budget (plus the interpreter's own teardown), never by the backend's 5 or 60 s.
    assert ended - out.stat().st_mtime < EXIT_TIMEOUT_S + 8.0
    assert p.stderr.count("Failed to export") <= 1 + elapsed // 60  # the exporter's own error: once a minute at most
