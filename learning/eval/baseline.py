"""The floor to beat: vanilla RAG with the same policy and index (`rubricem eval BENCH --baseline rag`).

One `local_search` with the question itself as the query, the top k passages in one prompt, one short answer. It
plays the research service's part for the eval runner, so it is scored exactly like the agent (EM, F1, cover-EM,
gold-passage recall from the passages it retrieved, seconds per question). Nothing is logged to the session store:
a baseline run is not a research session and must never reach training.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from agent.config import RunOptions
from agent.protocols import ChatMessage, PolicyClient, SearchTool
from agent.report import Report
from agent.tools.ids import CallIdFactory
from learning.eval.scoring import extract_prediction
from store.records import PromptRecord, ToolCallRecord, Trajectory, Turn

SYSTEM = ("You answer questions from the passages given. Reply with the short answer only: a name, a date, a number, "
          "yes or no, or a short phrase.")
ANSWER_TOKENS = 32


@dataclass(frozen=True, slots=True)
class BaselineOutcome:
    """A baseline answer in the shape the eval runner scores (ResearchOutcome)."""

    session_id: str
    trajectory: Trajectory
    report: Report
    policy_version: str
    seconds: float
    scaffold: bool = False  # no scaffold: compliance is not measured


class RagBaseline:
    """Vanilla RAG over the project's `local_search` and policy client."""

    def __init__(self, policy: PolicyClient, search: SearchTool, k: int = 5) -> None:
        """`search` is the `local_search` tool; `k` passages go into the prompt."""
        if k < 1:
            raise ValueError("--k must be at least 1")
        self.policy, self.search, self.k = policy, search, k

    async def run(self, question: str, options: RunOptions | None = None, *, source: str = "eval") -> BaselineOutcome:
        """Retrieve once with the question, answer once (`source` is accepted for the runner; nothing is logged)."""
        options = options or RunOptions()
        started = time.monotonic()
        ids = CallIdFactory(seed=options.seed)
        snippets = tuple(await self.search(question, {"limit": str(self.k)}, ids()))
        passages = "\n\n".join(f"[{n}] {s.title}\n{s.text}" for n, s in enumerate(snippets, 1))
        user = f"Passages:\n{passages}\n\nQuestion: {question}\nShort answer:"
        prompt = await self.policy.render_prompt([ChatMessage("system", SYSTEM), ChatMessage("user", user)])
        gen = await self.policy.generate(prompt, stop=["\n"], max_tokens=ANSWER_TOKENS,
                                         temperature=options.temperature, seed=options.seed)
        text = gen.text.replace("<|im_end|>", "").strip()
        body = extract_prediction(text)
        sid = f"rag-{uuid.uuid4().hex[:12]}"
        traj = Trajectory(
            session_id=sid, question=question,
            prompt=PromptRecord(text=prompt.text, token_ids=prompt.token_ids, prompt_sha="rag-baseline"),
            turns=(Turn(stage="answer", kind="sampled", text=gen.text, token_ids=gen.token_ids,
                        logprobs=gen.logprobs, policy_version=gen.policy_version, prompt_sha="rag-baseline"),),
            tool_calls=(ToolCallRecord(tool="local_search", query=question, snippets=snippets),),
        )  # fmt: skip
        report = Report(markdown=body, body=body, references=(), unknown_citations=0, answer_found=bool(body))
        return BaselineOutcome(sid, traj, report, f"rag:{self.policy.policy_version}", time.monotonic() - started)
