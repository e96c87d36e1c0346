"""`rubricem ask --json` counts the invented citation ids (issue 64, item 6): the payload the command writes, built
from a whole session through the real service (graph, local search, citation check, session log) with a scripted
model. The command itself is run end to end with the embedded model in tests/app/test_cli.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent.config import AgentConfig, RunOptions
from agent.support import UNSUPPORTED_MARK
from app.cli.main import ask_payload
from app.service import ResearchService
from store.embeddings import embed_texts
from store.session_log import SessionLog
from tests.agent.scripts import well_formed
from tests.fakes import ScriptedPolicy


def test_ask_json_counts_invented_ids_and_its_report_marks_their_claims(local_tools: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    svc = ResearchService(ScriptedPolicy(well_formed(n_calls=1)), local_tools,  # type: ignore[arg-type]
                          SessionLog(tmp_path / "s.sqlite3"), AgentConfig(), embed=embed_texts)
    outcome = asyncio.run(svc.run("What language were books translated into in Haymo's era?",
                                  RunOptions(context_tokens=65536, question_first=False)))
    payload = json.loads(json.dumps(ask_payload(outcome)))  # as written to the --json file
    assert payload["invented_citations"] == 1  # the script cites "deadbeef-9", which no search returned
    assert f"an invented claim {UNSUPPORTED_MARK}." in payload["report"]
    assert "Invented citation ids: 1" in payload["report"] and "deadbeef" not in payload["report"]
    assert set(payload) == {"session_id", "report", "citations", "support", "invented_citations", "stages",
                            "policy_version"}
