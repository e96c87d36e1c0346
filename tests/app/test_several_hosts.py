"""Several hosts on one PostgreSQL store (issue 17): two app processes and a scheduler process share nothing but the
database server and a Chroma server. Sessions from both apps are judged, one cycle runs while a second scheduler's
job is refused by the cross-host cycle lock (and recorded as skipped), and both apps answer with the promoted version.

Each process stands for a host: its own data folder, its own Python process and model, no shared file but the
adapters the trainer writes (a shared volume in the compose deployment). The gate runs at tolerance 1.0 because one
training step cannot make a candidate measurably better; the gate's real decision is tested in test_retrain_loop.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from store.config import StoreConfig
from store.registry import Registry
from store.session_log import SessionLog
from tests.gate import assert_gate_decided

ROOT = Path(__file__).resolve().parents[2]
PROGRESS = re.compile(r"^\[\s*\d+\.\ds\] ")  # a progress line of the CLI: said inside the cycle lock


def _env(url: str, data_dir: Path, smollm2_dir: Path, chroma: tuple[str, int], probes: Path) -> dict[str, str]:
    """One host's environment: the shared PostgreSQL and Chroma servers, its own data folder, tiny budgets."""
    host, port = chroma
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    env.update({
        "RUBRICEM_STORE__DATABASE_URL": url,
        "RUBRICEM_STORE__DATA_DIR": str(data_dir),
        "RUBRICEM_STORE__CHROMA_MODE": "server",
        "RUBRICEM_STORE__CHROMA_HOST": host,
        "RUBRICEM_STORE__CHROMA_PORT": str(port),
        # Collections of this test only: the Chroma server is shared with the rest of the run.
        "RUBRICEM_STORE__DOCS_COLLECTION": "hosts_documents",
        "RUBRICEM_STORE__BANK__COLLECTION": "hosts_bank",
        "RUBRICEM_AGENT__EMBEDDED_MODEL_PATH": str(smollm2_dir),
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__PLAN": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__RESEARCH": "16",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__REVIEW": "16",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__ANSWER": "24",
        "RUBRICEM_AGENT__DEFAULTS__WALL_CLOCK_S": "900",
        "RUBRICEM_AGENT__LOCAL_SEARCH_K": "2",
        "RUBRICEM_AGENT__SNIPPET_CHARS": "300",
        "RUBRICEM_LEARNING__RETRAIN__STEPS": "1",
        "RUBRICEM_LEARNING__RETRAIN__ROLLOUTS": "2",
        "RUBRICEM_LEARNING__RETRAIN__BATCH_QUESTIONS": "1",
        "RUBRICEM_LEARNING__RETRAIN__MAX_TOKEN_CAPS": "16",
        "RUBRICEM_LEARNING__RETRAIN__PROBE_QUESTIONS": str(probes),
        "RUBRICEM_LEARNING__RETRAIN__PROBE_SAMPLES": "1",
        "RUBRICEM_LEARNING__RETRAIN__TOLERANCE": "1.0",
        "RUBRICEM_LEARNING__RETRAIN__MIN_NEW_SESSIONS": "2",
        "RUBRICEM_LEARNING__RETRAIN__UNLOAD_GRACE_S": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",  # four processes on two cores
    })
    return env


def _ask(env: dict[str, str], question: str, out: Path) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "app.cli", "ask", question, "--max-tool-calls", "1", "--seed", "1", "--quiet",
           "--json", str(out)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _answers(procs: list[tuple[subprocess.Popen[str], Path]]) -> list[dict[str, object]]:
    out = []
    for proc, path in procs:
        _, err = proc.communicate(timeout=1500)
        assert proc.returncode == 0, err[-3000:]
        out.append(json.loads(path.read_text()))
    return out


@pytest.mark.slow
@pytest.mark.timeout(3000)  # about 6 minutes on an idle 2-core machine: four processes share it
def test_two_apps_and_a_scheduler_on_one_postgresql_store(
    postgres_url: str, chroma_server: tuple[str, int], smollm2_dir: Path, tmp_path: Path
) -> None:
    probes = tmp_path / "probes.txt"
    probes.write_text("Who was Haymo of Faversham?\n")
    host_a, host_b, host_s, host_s2 = (
        _env(postgres_url, tmp_path / name, smollm2_dir, chroma_server, probes) for name in ("a", "b", "s", "s2"))
    # A few passages in the shared documents collection, so no host indexes the demo corpus into it (two at once)
    # and no process builds a BM25 over its 9,000 chunks: the subject is the shared store, not retrieval.
    from app.settings import Settings
    from tests.indexes import seed_passages

    seed_passages(Settings(store=StoreConfig(data_dir=tmp_path / "seed", chroma_mode="server",
                                             chroma_host=chroma_server[0], chroma_port=chroma_server[1],
                                             docs_collection="hosts_documents")))

    # Both apps answer at the same time, each writing its session to the shared database.
    first = _answers([(_ask(host_a, "Who was Haymo of Faversham?", tmp_path / "a1.json"), tmp_path / "a1.json"),
                      (_ask(host_b, "What is the Franciscan order?", tmp_path / "b1.json"), tmp_path / "b1.json")])
    served = {a["policy_version"] for a in first}
    assert len(served) == 1 and served != {"policy@1"}

    # The scheduler host runs a cycle; once it has said anything it holds the lock, and the second scheduler's job
    # (the one `rubricem scheduler` runs on its trigger) is refused and recorded as skipped.
    cycle = subprocess.Popen([sys.executable, "-m", "app.cli", "retrain", "--now"], cwd=ROOT, env=host_s,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    holding = threading.Event()

    def drain() -> None:  # read stderr to the end (a full pipe would stall the cycle); note its first progress line
        assert cycle.stderr is not None
        for line in cycle.stderr:
            lines.append(line)
            if PROGRESS.match(line):
                holding.set()
        holding.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    holding.wait(timeout=1200)
    assert cycle.poll() is None, "the cycle ended before the second scheduler ran: " + "".join(lines)[-3000:]
    second = subprocess.run(
        [sys.executable, "-c", "from app.scheduler import scheduled_job\nfrom app.settings import Settings\n"
         "scheduled_job(Settings())"], cwd=ROOT, env=host_s2, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    out, _ = cycle.communicate(timeout=2400)
    reader.join(timeout=60)
    assert cycle.returncode == 0, "".join(lines)[-3000:]
    assert ": promoted" in out, out

    reg = Registry(SessionLog.from_config(StoreConfig(data_dir=tmp_path / "check", database_url=postgres_url)))
    cycles = reg.cycles(limit=10)
    done = [c for c in cycles if c.status == "promoted"]
    skipped = [c for c in cycles if c.status == "skipped"]
    assert len(done) == 1 and done[0].numbers["judged"] == 2 and done[0].numbers["new_sessions"] == 2
    assert_gate_decided(reg, done[0], tolerance=1.0)  # one step is not measurably better: see the docstring
    assert len(skipped) == 1 and skipped[0].trigger == "scheduler"
    assert "another retraining cycle or promotion is running" in (skipped[0].error or "")
    assert reg.live().name == "policy@1"
    log = SessionLog.from_config(StoreConfig(data_dir=tmp_path / "check", database_url=postgres_url))
    judged = {s for s in (first[0]["session_id"], first[1]["session_id"]) if log.judgements(str(s))}
    assert len(judged) == 2, "both apps' sessions were judged"

    # Both apps now answer with the promoted version (each reads `live` from the shared registry).
    after = _answers([(_ask(host_a, "Who founded the Franciscan order?", tmp_path / "a2.json"), tmp_path / "a2.json"),
                      (_ask(host_b, "Where is Faversham?", tmp_path / "b2.json"), tmp_path / "b2.json")])
    assert {a["policy_version"] for a in after} == {"policy@1"}
