"""Issue 46, item 6: a deletion that commits while `rubricem judge` is running wins over the judge's rubric buffers.

The judge reads the sessions it will judge at the start, loads a question's rubric buffer, waits minutes on the judge
endpoint, then saves the buffer. Before the fix, a deletion in that time was undone by the save: the buffer row came
back with the deleted person's question text and the rubrics drawn from their sessions.

Real parts: `rubricem judge` as a subprocess over a real SQLite store, the deletion through the store API the chat's
"Delete my data" and `rubricem users delete-data` call. The judge endpoint is the OpenAI-format stand-in (a paid API
in production); it holds its first answer until the test has deleted, so the order is certain whatever the load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from store.deletion import delete_user_data
from store.owner import acting_as
from store.records import question_sha
from store.session_log import SessionLog
from tests.judge.builders import store_session, trajectory
from tests.judge.openai_standin import OpenAIStandIn, Reply
from tests.judge.test_llm_judge import GENERATION, name_of

ROOT = Path(__file__).resolve().parents[2]
HERS_FIRST = "Which river did the QX-7 expedition of Alice's family follow?"
HERS_LATER = "Where is Alice's grandmother QX-9 buried?"
HIS = "In which language were books translated in Haymo of Faversham's era?"


def _scores(req: dict[str, Any]) -> str:
    """Every rubric the scoring prompt numbers gets a 1 (the numbers do not matter here)."""
    prompt = req["messages"][1]["content"]
    count = sum(1 for line in prompt.splitlines() if line.startswith("["))
    return json.dumps({"scores": [{"index": i, "score": 1, "justification": "ok"} for i in range(1, count + 1)]})


class HoldFirstGeneration:
    """Answers like a judge; the first rubric-generation request (the first group's) waits for `release`."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()

    def __call__(self, req: dict[str, Any]) -> str | Reply:
        if name_of(req) != "rubric_generation":
            return _scores(req)
        if not self.arrived.is_set():
            self.arrived.set()
            return Reply(content=json.dumps(GENERATION), hold=self.release)
        return json.dumps(GENERATION)


def _buffer_questions(log: SessionLog) -> set[str]:
    with log.transaction(write=False) as conn:
        return {str(r[0]) for r in conn.execute("SELECT question FROM rubric_buffers").fetchall()}


def test_a_deletion_during_rubricem_judge_is_not_undone_by_its_buffer_saves(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    log = SessionLog(data / "rubricem.sqlite3")
    with acting_as("alice"):
        store_session(log, trajectory("alice-1", question=HERS_FIRST))  # judged first: its group is in flight
    with acting_as("bob"):
        bobs = store_session(log, trajectory("bob-1", question=HIS))
    with acting_as("alice"):
        store_session(log, trajectory("alice-2", question=HERS_LATER))  # read at the start, judged after deletion
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "RUBRICEM_STORE__DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "RUBRICEM_LEARNING__JUDGE__MODEL": "judge",
        "RUBRICEM_LEARNING__JUDGE__CACHE": "false", "RUBRICEM_LEARNING__JUDGE__MAX_RETRIES": "0"}
    hold = HoldFirstGeneration()
    with OpenAIStandIn(responder=hold) as standin:
        env["RUBRICEM_LEARNING__JUDGE__BASE_URL"] = standin.root
        judge = subprocess.Popen([sys.executable, "-m", "app.cli", "judge"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert hold.arrived.wait(timeout=300), "the judge never asked for rubrics"
            # Her first group's buffer is loaded and its answer is on the way; her second group is already read.
            deleted = delete_user_data(log, "alice", requested_by="alice", keep_account=True)
            assert deleted.counts["sessions"] == 2
        finally:
            hold.release.set()
            out, err = judge.communicate(timeout=300)
    assert judge.returncode in (0, 1), err[-3000:]
    # Nothing of hers came back: no buffer row of either question, so neither text nor rubrics drawn from her runs.
    assert _buffer_questions(log) & {HERS_FIRST, HERS_LATER} == set()
    assert log.load_rubric_buffer(question_sha(HERS_FIRST)) is None
    assert log.load_rubric_buffer(question_sha(HERS_LATER)) is None
    # Everyone else's judging goes on: bob's session is judged, and his question's buffer (begun after the deletion)
    # is saved.
    assert [j.status for j in log.judgements(bobs)] == ["ok"], out + err[-3000:]
    assert _buffer_questions(log) == {HIS}
    log.close()
