"""Scaffold compliance of one research session: did the model follow the scaffold itself, or did the graph force it?

Recorded per item wherever answers are scored (`rubricem eval`), beside EM/F1/cover-EM:
- `self_tagged_stages`: the share of the four stages (plan, research, review, answer) that have a sampled turn and no
  forced turn, i.e. the model opened and closed that stage's tags itself (a forced opening or closing tag, or a stage
  never reached, counts against it);
- `valid_tool_calls`: the share of the model's tool calls that parsed and ran without error (0 with no call);
- `self_citations`: distinct cited ids, in the model's own sampled answer text, that resolve to a snippet retrieved
  in this session (forced text and matched-after-writing references never count).

A whole call the graph issued itself (the question-first search, `RunOptions.question_first`: one forced turn from
`<call_tool` to `</call_tool>`) is the graph's action, not a tag it forced on the model: it neither counts against
the research stage's tags nor as one of the model's tool calls. Such calls are the session's first calls, one per
such turn.
"""

from __future__ import annotations

from typing import Any

from agent.parse import find_citations
from store.records import Trajectory

STAGES = ("plan", "research", "review", "answer")


def compliance(traj: Trajectory) -> dict[str, Any]:
    """The three compliance figures (see the module docstring) plus the raw counts behind them."""
    sampled = {t.stage for t in traj.turns if t.kind == "sampled" and t.text.strip()}
    issued = [t for t in traj.turns if t.kind == "forced" and _whole_call(t.text)]
    forced = {t.stage for t in traj.turns if t.kind == "forced" and not _whole_call(t.text)}
    self_tagged = [s for s in STAGES if s in sampled and s not in forced]
    calls = traj.tool_calls[len(issued):]
    valid = sum(1 for c in calls if c.error is None and c.query.strip())
    known = traj.snippets
    answer = "".join(t.text for t in traj.turns if t.stage == "answer" and t.kind == "sampled")
    cited = {i for c in find_citations(answer) for i in c.ids if i in known}
    return {
        "self_tagged_stages": len(self_tagged) / len(STAGES),
        "stages_self_tagged": self_tagged,
        "valid_tool_calls": valid / len(calls) if calls else 0.0,
        "tool_calls": len(calls),
        "graph_tool_calls": len(issued),
        "self_citations": len(cited),
        "has_self_citation": float(bool(cited)),
    }


def _whole_call(text: str) -> bool:
    body = text.strip()
    return body.startswith("<call_tool") and body.endswith("</call_tool>")
