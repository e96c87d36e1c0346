"""The `rubricem` command end to end, as a user runs it (subprocess, embedded default, bundled demo corpus)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import env_example

ROOT = Path(__file__).resolve().parents[2]


def rubricem(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def env(tmp_path: Path, smollm2_dir: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    e.update({
        "RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"),
        "RUBRICEM_AGENT__EMBEDDED_MODEL_PATH": str(smollm2_dir),  # skip a second conversion
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__PLAN": "32",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__RESEARCH": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__REVIEW": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__ANSWER": "32",
        "HF_HUB_OFFLINE": "1",
    })
    return e


@pytest.mark.slow
def test_ask_with_the_embedded_default_writes_report_json_and_session(env: dict[str, str], tmp_path: Path) -> None:
    out_md, out_json = tmp_path / "r.md", tmp_path / "r.json"
    p = rubricem(["ask", "Who was Haymo of Faversham?", "--max-tool-calls", "1", "--seed", "3",
                  "--out", str(out_md), "--json", str(out_json)], env)
    assert p.returncode == 0, p.stderr[-3000:]
    for stage in ("plan", "research: turn 1", "review", "answer"):
        assert f"] {stage}" in p.stderr  # stage-by-stage progress
    assert "Indexing the bundled Wikipedia demo corpus" in p.stderr
    payload = json.loads(out_json.read_text())
    assert set(payload) == {"session_id", "report", "citations", "support", "invented_citations", "stages",
                            "policy_version"}
    assert payload["invented_citations"] == 0 or "Invented citation ids" in payload["report"]
    support = payload["support"]  # each cited sentence checked against its passage (issue 48)
    assert support["verified"] and all(c["status"] in ("supported", "reattributed", "unsupported") and
                                       set(c["kept"]) <= {s["id"] for s in payload["citations"]}
                                       for c in support["claims"])
    assert sum(support[k] for k in ("supported", "reattributed", "unsupported")) == len(support["claims"])
    assert payload["report"] == out_md.read_text() and p.stdout.strip() == payload["report"].strip()
    assert [s["stage"] for s in payload["stages"]] == ["plan", "research", "review", "answer"]
    assert payload["policy_version"] == "base"
    shown = rubricem(["sessions", "show", payload["session_id"]], env)
    assert shown.returncode == 0 and "status    completed" in shown.stdout and "source    cli\n" in shown.stdout
    assert f"citations {support['supported']} supported, {support['reattributed']} re-attributed" in shown.stdout
    listed = rubricem(["sessions", "list", "--source", "cli"], env)
    assert payload["session_id"] in listed.stdout and "  cli  " in listed.stdout
    assert rubricem(["sessions", "list", "--source", "eval"], env).stdout.strip() == "no sessions"


@pytest.mark.parametrize("question", ["", "q" * 20_000])
def test_ask_refuses_bad_questions_without_writing_anything(question: str, env: dict[str, str], tmp_path: Path) -> None:
    p = rubricem(["ask", question], env, timeout=120)
    assert p.returncode == 2 and p.stderr.startswith("error: the question")
    assert not (tmp_path / "data").exists()  # nothing created, nothing loaded


def test_ingest_refuses_unreadable_files_and_sessions_show_unknown_id(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.4 not really a pdf")
    p = rubricem(["ingest", str(bad)], env, timeout=120)
    assert p.returncode == 2 and "broken.pdf" in p.stderr
    p = rubricem(["ingest", str(tmp_path / "missing.txt")], env, timeout=120)
    assert p.returncode == 2 and "missing.txt" in p.stderr
    p = rubricem(["sessions", "show", "nope"], env, timeout=120)
    assert p.returncode == 2 and "nope" in p.stderr


def test_env_example_documents_every_setting() -> None:
    assert (ROOT / ".env.example").read_text(encoding="utf-8") == env_example() + "\n"


def test_ingest_indexes_a_folder_and_reingest_replaces(env: dict[str, str], tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Nebula notes\n\nThe Crab Nebula is a supernova remnant in Taurus.", encoding="utf-8")
    (docs / "b.jsonl").write_text('{"title": "Orion", "text": "The Orion Nebula is visible to the naked eye."}\n',
                                  encoding="utf-8")
    first = rubricem(["ingest", str(docs)], env, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "from 2 file(s); index holds 2" in first.stderr
    again = rubricem(["ingest", str(docs)], env, timeout=300)
    assert again.returncode == 0 and "index holds 2" in again.stderr  # replaced, not duplicated
