"""A research process for the resume tests (tests/app/test_resume.py): the real ResearchService, session log,
checkpointer and graph, with the scripted policy for exact outputs and a small search tool.

    python -m tests.app.resume_worker DATA_DIR start|resume [BLOCK]

BLOCK = `research` (hang while the model writes the first query, right after the graph forced the call's opening
tag: a turn is then in the log but not in any checkpoint) or `tool` (hang inside the second tool call). The process
writes DATA_DIR/blocked when it hangs, so the test can SIGKILL it there. Prints the outcome as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from agent.config import AgentConfig, RunOptions
from app.durable import DurableSessions, LeaseTiming
from app.service import ResearchOutcome, ResearchService
from store.config import StoreConfig
from store.records import Snippet
from store.session_log import SessionLog
from tests.agent.scripts import PLAN, SNIPPET_ID
from tests.fakes import ScriptedPolicy

QUESTION = "What language were books translated into in Haymo's era?"
# question_first off: the research block below hangs inside the model's own first query, after the forced opening.
OPTIONS = RunOptions(context_tokens=65536, seed=7, max_tool_calls=3, inject_bank=False, question_first=False)
# A short lease (issue 34): a killed worker's session can be resumed a few seconds later; a live one is renewed.
LEASE = LeaseTiming(heartbeat_s=0.5, lease_s=3.0)


def script(block: str | None, marker: Path):  # noqa: ANN201
    async def hang() -> None:
        marker.write_text("blocked")
        await asyncio.sleep(600)

    def say(context: str, stop: Sequence[str]) -> str:
        assistant = context.rsplit("<|im_start|>assistant\n", 1)[-1]
        if "</structured_plan>" in stop:
            return PLAN
        if list(stop) == ["</call_tool>", "</call>"]:  # the query after a forced call opening
            return "Haymo of Faversham</call_tool>"
        if "</call_tool>" in stop:
            done = assistant.count("</tool_output>")
            if done == 0:
                return "<think>Let me think first.</think>"  # no call: the graph forces one
            if done == 1:
                return '<think>One more.</think>\n<call_tool name="local_search">Haymo translations Latin</call_tool>'
            return ("<think>Enough.</think><state_evaluation>Covered.</state_evaluation>\n<review><rubric_review>"
                    "Item 1 satisfied.</rubric_review><writing_plan>State it.</writing_plan></review>")
        if "</review>" in stop:
            return "<rubric_review>ok</rubric_review><writing_plan>write</writing_plan></review>"
        cite = SNIPPET_ID.findall(assistant)
        return f'<answer>Books were translated into <cite id="{cite[0] if cite else "x"}">Latin</cite>.</answer>'

    class Blocking(ScriptedPolicy):
        async def generate(self, context, *, stop, max_tokens, temperature, seed=None):  # type: ignore[no-untyped-def]
            if block == "research" and list(stop) == ["</call_tool>", "</call>"]:  # the query after a forced opening
                await hang()
            return await super().generate(context, stop=stop, max_tokens=max_tokens, temperature=temperature, seed=seed)

    class Search:
        name, description = "local_search", "search the local documents"
        calls = 0

        async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
            Search.calls += 1
            if block == "tool" and "Latin" in query:
                await hang()
            return [Snippet(id=f"{call_id}-0", tool="local_search", title="Haymo of Faversham",
                            text=f"In Haymo's era books were translated into Latin ({query}).")]

    return Blocking(say), Search()


async def main(data: Path, mode: str, block: str | None) -> dict[str, object]:
    store = StoreConfig(data_dir=data)
    log = SessionLog.from_config(store)
    policy, search = script(block, data / "blocked")
    service = ResearchService(policy, {"local_search": search}, log, AgentConfig(),
                              durable=DurableSessions.for_store(log, store), lease=LEASE)
    if mode == "start":
        out = await service.start(QUESTION, OPTIONS, source="cli")
    else:
        (sid,) = [s.session_id for s in log.list_sessions()]
        out = await service.resume(sid)
    assert isinstance(out, ResearchOutcome)
    return {"session_id": out.session_id, "report": out.report.markdown}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))))
