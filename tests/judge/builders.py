"""Hand-built trajectories for judge tests (store.records types directly; no model needed)."""

from __future__ import annotations

from agent.report import build_report
from store.records import PromptRecord, Snippet, ToolCallRecord, Trajectory, Turn
from store.session_log import SessionLog

QUESTION = "In which language were books translated in Haymo of Faversham's era?"

PLAN = (
    "<think>I need the language of translations in Haymo's era.</think>\n<structured_plan>\n"
    "<deep_analysis>Haymo was a 13th-century Franciscan; translations then were mostly into Latin.</deep_analysis>\n"
    "<rubric>Knowledge Checklist:\n- the language books were translated into\n- the period Haymo lived in</rubric>\n"
    "<research_plan>Step 1: search Haymo of Faversham. Step 2: confirm the language.</research_plan>\n"
    "</structured_plan>"
)


def _turn(stage: str, kind: str, text: str) -> Turn:
    return Turn(stage=stage, kind=kind, text=text, token_ids=tuple(range(max(1, len(text) // 8))))  # type: ignore[arg-type]


def snippet(call: str, index: int, text: str, title: str = "Haymo of Faversham") -> Snippet:
    return Snippet(id=f"{call}-{index}", tool="local_search", title=title, text=text)


def trajectory(
    session_id: str = "s1",
    *,
    question: str = QUESTION,
    answer: str | None = 'Books were translated into <cite id="abcd0001-0">Latin</cite>.',
    plan: str | None = PLAN,
    review: str | None = (
        "<think>Enough.</think><review><rubric_review>Language found in abcd0001-0.</rubric_review>"
        "<writing_plan>State the language with its source.</writing_plan></review>"
    ),
    queries: tuple[str, ...] = ("Haymo of Faversham translation",),
    tool_error: str | None = None,
    tool_output_text: str = "Haymo of Faversham (d. 1244) was an English Franciscan. Books were translated into Latin.",
    malformed: bool = False,
) -> Trajectory:
    """A scaffold-following session; pass None for a stage to leave it out."""
    turns: list[Turn] = []
    calls: list[ToolCallRecord] = []
    if plan is not None:
        turns.append(_turn("plan", "sampled", plan))
    for n, q in enumerate(queries):
        call_id = f"abcd000{n + 1}"
        turns.append(_turn("research", "sampled", f'\n<call_tool name="local_search">{q}</call_tool>'))
        snippets = () if tool_error else (snippet(call_id, 0, tool_output_text),)
        out = f"Error: {tool_error}" if tool_error else f'<snippet id="{call_id}-0">{tool_output_text}</snippet>'
        turns.append(_turn("research", "tool_output", f"\n<tool_output>\n{out}\n</tool_output>\n"))
        calls.append(ToolCallRecord(tool="local_search", query=q, snippets=snippets, error=tool_error))
    if review is not None:
        turns.append(_turn("review", "sampled", review))
    if answer is not None:
        turns.append(_turn("answer", "forced", "<answer>"))
        turns.append(_turn("answer", "sampled", answer + "</answer>"))
    return Trajectory(
        session_id=session_id,
        question=question,
        prompt=PromptRecord(text=f"User: {question}", token_ids=(1, 2, 3), prompt_sha="p"),
        turns=tuple(turns),
        tool_calls=tuple(calls),
        malformed=malformed,
    )


def store_session(log: SessionLog, t: Trajectory, status: str = "completed", report: str | None = "auto",
                  policy_version: str = "policy@2") -> str:
    """Write a built trajectory into the log turn by turn (tool calls beside their outputs) and finish it;
    report "auto" stores the report `build_report` renders."""
    sid = log.create_session(t.question, PromptRecord(t.prompt.text, t.prompt.token_ids, "p"), {}, policy_version,
                             session_id=t.session_id)
    calls = iter(t.tool_calls)
    for turn in t.turns:
        log.append_turn(sid, turn)
        if turn.kind == "tool_output":
            log.append_tool_call(sid, next(calls))
    if status != "running":
        log.finish(sid, status, report=build_report(t).markdown if report == "auto" else report)  # type: ignore[arg-type]
    return sid
