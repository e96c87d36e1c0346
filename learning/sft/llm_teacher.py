"""The LLM teacher (the paper's way, METHOD §10.2–10.3): any OpenAI-compatible chat endpoint writes the rounds.

Round 1 uses the planning prompt (`teacher_plan.md`: scratchpad, structured plan with deep analysis and rubric,
exactly one tool call, never an answer); later rounds use the research-and-synthesis prompt (`teacher_research.md`:
scratchpad, state evaluation, then a tool call or the review and answer). Every tool call is executed by the
project's own tools and rendered exactly as in a research session, up to the round limit. The teacher's
`<scratchpad>` becomes `<think>` in post-processing, and tool-name variants are normalised (trajectory.postprocess).

An endpoint that times out, fails or returns an empty message raises `TeacherFailed`; the driver counts it as
`teacher_error` and writes nothing for that question.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from agent.errors import ToolError
from agent.nodes.tools import render_output
from agent.parse import CallParseError, parse_tool_call
from agent.prompts import render as render_agent_prompt
from agent.protocols import SearchTool
from agent.tools.ids import CallIdFactory
from agent.tools.names import resolve_tool_name
from learning.judge.client import chat_completions_url
from learning.prompts import render
from learning.sft.questions import SFTQuestion
from learning.sft.trajectory import TEACHER_ERROR, Segment, Trajectory, postprocess

STOPS = ("</call_tool>", "</answer>")


class TeacherFailed(Exception):
    """The teacher endpoint failed (timeout, HTTP error, unreadable or empty reply)."""

    reason = TEACHER_ERROR


class LLMTeacher:
    """Multi-round trajectory generation through a chat endpoint, with the project's tools in the loop."""

    def __init__(self, base_url: str, model: str, tools: Mapping[str, SearchTool], *, api_key: str | None = None,
                 max_rounds: int = 10, timeout_s: float = 120.0, max_tokens: int = 2048,
                 temperature: float = 0.7) -> None:
        """`base_url` is the endpoint root (with or without /v1); `tools` the project's tools, keyed by name."""
        self.url = chat_completions_url(base_url)
        self.model, self.tools, self.api_key = model, dict(tools), api_key
        self.max_rounds, self.timeout_s, self.max_tokens, self.temperature = max_rounds, timeout_s, max_tokens, temperature
        self.name = f"llm:{model}"

    async def _chat(self, client: httpx.AsyncClient, system: str, user: str, seed: int) -> str:
        body: dict[str, Any] = {
            "model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens, "seed": seed,
            "stop": list(STOPS), "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        }  # fmt: skip
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            resp = await client.post(self.url, json=body, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise TeacherFailed(f"teacher request failed: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            raise TeacherFailed(f"teacher answered HTTP {resp.status_code}")
        try:
            choice = resp.json()["choices"][0]
            text = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TeacherFailed("teacher reply is not an OpenAI chat completion") from exc
        if not isinstance(text, str) or not text.strip():
            raise TeacherFailed("teacher returned an empty message")
        # Servers drop the matched stop string; put the closing tag back where the call or answer was left open.
        if text.rfind("<call_tool") > text.rfind("</call_tool>"):
            return text + "</call_tool>"
        if text.rfind("<answer>") > text.rfind("</answer>"):
            return text + "</answer>"
        return text

    async def write(self, q: SFTQuestion, fmt: str, max_tool_calls: int | None, seed: int) -> Trajectory:
        """Run up to `max_rounds` rounds; the trajectory is returned whatever its state (the rules judge it)."""
        budget = max_tool_calls or 10
        traj = Trajectory(q.id, self.name, fmt, budget)
        ids = CallIdFactory(seed=seed)
        instruction = render_agent_prompt(f"instructions/{fmt}")
        tool_lines = "\n".join(f"- {n}: {t.description}" for n, t in sorted(self.tools.items()))
        async with httpx.AsyncClient() as client:
            for round_no in range(self.max_rounds):
                if round_no == 0:
                    system = render("teacher_plan", tools=tool_lines)
                    user = f"{q.question}\n\n{instruction}"
                else:
                    system = render("teacher_research", tools=tool_lines, max_tool_calls=str(budget))
                    user = f"{q.question}\n\n{instruction}\n\nYour research so far:\n{_transcript(traj)}"
                text = postprocess(await self._chat(client, system, user, seed + round_no), list(self.tools))
                traj.segments.append(Segment("model", text))
                if "</answer>" in text or not text.rstrip().endswith("</call_tool>"):
                    break
                if len(traj.tool_calls) >= budget:
                    break
                traj.segments.append(Segment("tool", await self._execute(text, traj, ids)))
        return traj

    async def _execute(self, text: str, traj: Trajectory, ids: CallIdFactory) -> str:
        try:
            call = parse_tool_call(text)
        except CallParseError as exc:
            traj.tool_calls.append({"tool": "", "query": "", "snippet_ids": [], "error": str(exc)})
            return render_output((), str(exc))
        name = resolve_tool_name(call.name, self.tools)
        if name is None:
            error = f"unknown tool {call.name!r}"
            traj.tool_calls.append({"tool": call.name, "query": call.query, "snippet_ids": [], "error": error})
            return render_output((), error)
        try:
            found = tuple(await asyncio.wait_for(self.tools[name](call.query, call.attrs, ids()), self.timeout_s))
            error = None
        except (ToolError, TimeoutError) as exc:
            found, error = (), str(exc) or type(exc).__name__
        traj.tool_calls.append({"tool": name, "query": call.query, "snippet_ids": [s.id for s in found],
                                "error": error})
        return render_output(found, error)


def _transcript(traj: Trajectory) -> str:
    return "".join(s.text for s in traj.segments)
