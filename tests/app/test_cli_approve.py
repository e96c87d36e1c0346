"""`rubricem ask --approve-plan` and `rubricem resume` through the real CLI with the embedded SmolLM2 (issue 21):
an interactive edit (a bad one first, refused with the plan still waiting), then the report; bad resumes exit 2
and change nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def rubricem(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture
def run_env(tmp_path: Path, smollm2_dir: Path) -> dict[str, str]:
    """The embedded default with the smallest caps that finish a run (as tests/app/test_batch.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")}
    return env | {
        "RUBRICEM_STORE__DATA_DIR": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1",
        "RUBRICEM_AGENT__EMBEDDED_MODEL_PATH": str(smollm2_dir),
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__PLAN": "16",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__RESEARCH": "24",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__REVIEW": "16",
        "RUBRICEM_AGENT__DEFAULTS__TOKEN_CAPS__ANSWER": "16",
        "RUBRICEM_AGENT__DEFAULTS__MAX_TOOL_CALLS": "1",
        "RUBRICEM_AGENT__LOCAL_SEARCH_K": "2",
        "RUBRICEM_AGENT__SNIPPET_CHARS": "200",
    }


@pytest.mark.slow
@pytest.mark.timeout(1800)  # model load, corpus indexing, one session and four short commands; long on busy cores
def test_ask_approve_plan_edit_then_report_and_bad_resumes(run_env: dict[str, str], tmp_path: Path) -> None:
    # e → an empty rubric (refused, asked again) → e → one item, a note → the run goes on to its report.
    answers = "e\n\n\ne\nSays who Haymo of Faversham was\n\nLook for his order.\n"
    done = rubricem(["ask", "--approve-plan", "--seed", "3", "Who was Haymo of Faversham?"], run_env, answers)
    assert done.returncode == 0, done.stderr
    assert "the plan waits for your approval" in done.stderr
    assert "not applied: an edit must keep at least one rubric item" in done.stderr
    assert "the plan still waits" in done.stderr
    assert done.stdout.startswith("# Who was Haymo of Faversham?")
    db_path = tmp_path / "data" / "rubricem.sqlite3"
    with sqlite3.connect(db_path) as db:
        (sid, status), = db.execute("SELECT session_id, status FROM sessions").fetchall()
        row = db.execute("SELECT action, owner, approved_json FROM plan_approvals").fetchone()
        forced = [r[0] for r in db.execute("SELECT text FROM turns WHERE stage = 'plan' AND kind = 'forced'")]
        state = db.execute("SELECT state FROM session_runs").fetchone()
    assert status == "completed" and state == ("finished",)
    assert row[:2] == ("edit", "local")
    assert json.loads(row[2]) == {"rubric": ["Says who Haymo of Faversham was"], "note": "Look for his order."}
    assert any("<approved_plan>" in t and "- Says who Haymo of Faversham was" in t for t in forced)

    exported = rubricem(["sessions", "export", "--edited-plans"], run_env)
    (pair,) = [json.loads(line) for line in exported.stdout.splitlines()]
    assert pair["session_id"] == sid and pair["approved_plan"]["rubric"] == ["Says who Haymo of Faversham was"]

    def snapshot() -> list[object]:
        with sqlite3.connect(db_path) as db:
            return [db.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall()
                    for t in ("sessions", "turns", "tool_calls", "session_runs", "plan_approvals")]

    before = snapshot()
    finished = rubricem(["resume", sid], run_env)
    unknown = rubricem(["resume", "no-such-session"], run_env)
    assert finished.returncode == 2 and "is completed: only an unfinished session can be resumed" in finished.stderr
    assert unknown.returncode == 2 and "no-such-session" in unknown.stderr
    assert snapshot() == before  # nothing changed
