"""Helpers for reflection tests: judged sessions written into a real session log, and sample reflections."""

from __future__ import annotations

from learning.judge.types import Judgement, Rubric, RubricScore, StageResult
from store.records import PromptRecord
from store.session_log import SessionLog
from tests.judge.builders import QUESTION, trajectory

RUBRICS = (
    Rubric(id="r1", stage="plan", title="Identifies Haymo's era", description="names the 13th century", weight=2),
    Rubric(id="r2", stage="answer", title="Cites a snippet that was never retrieved", description="bogus citation ids",
           weight=2, polarity="negative"),
    Rubric(id="r3", stage="answer", title="Names the language of the translations", description="Latin", weight=3),
)  # fmt: skip


def judgement_for(session_id: str, question: str = QUESTION) -> Judgement:
    """A graded judgement: the era only implied (1/2), a bogus citation (negative rubric hit), the language right."""
    return Judgement(
        session_id=session_id,
        question=question,
        stages={
            "plan": StageResult(stage="plan", score=0.5, rubric_scores=(
                RubricScore(rubric_id="r1", score=1, justification="the era is only implied, never dated"),)),
            "research": StageResult(stage="research", score=None, error="no rubrics"),
            "review": StageResult(stage="review", score=1.0),
            "answer": StageResult(stage="answer", score=0.4, rubric_scores=(
                RubricScore(rubric_id="r2", score=2, justification="cites an id that no search returned"),
                RubricScore(rubric_id="r3", score=2, justification="says Latin"))),
        },
        judge_model="judge-m",
        judge_kind="llm",
    )  # fmt: skip


def add_session(
    log: SessionLog,
    session_id: str,
    *,
    question: str = QUESTION,
    status: str = "completed",
    judged: str | None = "ok",
) -> str:
    """Write a builders trajectory into the log as a real session; finish and judge it as asked."""
    t = trajectory(session_id, question=question)
    sid = log.create_session(question, PromptRecord(t.prompt.text, t.prompt.token_ids, "p"), {}, "policy@1",
                             session_id=session_id)  # fmt: skip
    calls = iter(t.tool_calls)
    for turn in t.turns:
        log.append_turn(sid, turn)
        if turn.kind == "tool_output":
            log.append_tool_call(sid, next(calls))
    if status == "running":
        return sid
    log.finish(sid, status, report="Latin.")  # type: ignore[arg-type]
    if judged == "ok":
        log.record_judgement(sid, "judge-m", judgement_for(sid, question).model_dump(mode="json"))
    elif judged == "failed":
        log.record_judgement(sid, "judge-m", {"error": "boom"}, status="failed", error="boom")
    return sid


GOOD = """<reflection_rubrics>
Critical Requirement: state that books in Haymo of Faversham's era were translated into Latin, with the snippet.
Analytical Approach: date Haymo (a 13th-century Franciscan, d. 1244) before searching for the translation language.
Communication & Structure: one sentence naming the language and the era, each claim cited.
Pitfalls: citing a snippet id that no search returned; leaving the era implied instead of dated.
</reflection_rubrics>
<reflection_takeaways>
1. Write Haymo's dates (d. 1244) into the plan, since the era was only implied.
2. Cite only snippet ids that a tool output returned; check each cite id against the search results.
</reflection_takeaways>"""

GENERIC = """<reflection_rubrics>
Critical Requirement: be more careful.
Pitfalls: make sure to double-check.
</reflection_rubrics>
<reflection_takeaways>
1. Be more careful.
2. Always check your work.
3. Be more careful.
4. Pay attention to details.
5. Try harder next time.
6. Be thorough.
</reflection_takeaways>"""
