"""The Plan → Research → Review → Answer graph on a scripted policy and the real local search."""

from __future__ import annotations

import asyncio
import re

from agent.config import RunOptions, StageTokenCaps
from agent.deps import AgentDeps
from agent.run import RunResult, execute, render_prompt
from agent.tools.ids import CounterCallIds
from learning.eval.compliance import compliance
from store.records import STAGES, loss_mask, stage_spans
from tests.agent.scripts import PLAN, SNIPPET_ID, stage_of, well_formed
from tests.fakes import ScriptedPolicy

RAW_TAG = re.compile(r"</?(think|answer|cite|review|call_tool|tool_output|snippet|structured_plan)\b")


QUESTION = "What language were books translated into in Haymo's era?"


def run(policy: ScriptedPolicy, tools: dict, question: str = QUESTION, **opts: object) -> RunResult:  # type: ignore[type-arg]
    opts.setdefault("context_tokens", 65536)  # the byte tokenizer spends one token per byte
    opts.setdefault("question_first", False)  # the scripts write every call (the paper's scaffold); tested apart below
    deps = AgentDeps(policy=policy, tools=tools, options=RunOptions(**opts), call_ids=CounterCallIds())

    async def go() -> RunResult:
        prompt = await render_prompt(question, deps)
        return await execute("s1", question, prompt, deps)

    return asyncio.run(go())


def test_well_formed_run_has_four_stages_masks_and_a_cited_report(local_tools: dict) -> None:  # type: ignore[type-arg]
    result = run(ScriptedPolicy(well_formed(n_calls=2)), local_tools)
    traj = result.trajectory
    assert [s for s in STAGES if s in traj.stages_present] == list(STAGES)
    assert not traj.malformed
    assert len(traj.tool_calls) == 2 and all(c.error is None and c.snippets for c in traj.tool_calls)
    # Tool output is never trainable; with vLLM-style stop handling nothing had to be forced.
    assert all(not t.trainable for t in traj.turns if t.kind == "tool_output")
    assert [t.text for t in traj.turns if t.kind == "forced"] == []
    mask = loss_mask(traj.turns)
    assert len(mask) == len(traj.token_ids)
    spans = stage_spans(traj.turns)
    assert all(spans[s] for s in STAGES)
    # The plan span is exactly the sampled plan (ending at </structured_plan>).
    plan_range = spans["plan"][0]
    assert bytes(traj.token_ids[plan_range.start:plan_range.stop]).decode() == PLAN
    report = result.report
    assert report.unknown_citations == 1  # the invented id was removed and counted
    assert len(report.references) == 1 and "Latin [1]" in report.body
    assert report.references[0].id == traj.tool_calls[0].snippets[0].id
    assert "hidden" not in report.markdown and not RAW_TAG.search(report.body)
    assert "## References" in report.markdown


def test_servers_that_drop_stop_strings_get_forced_masked_closing_tags(local_tools: dict) -> None:  # type: ignore[type-arg]
    result = run(ScriptedPolicy(well_formed(n_calls=1), keep_stop=False), local_tools)
    forced = [t for t in result.trajectory.turns if t.kind == "forced"]
    assert {t.text for t in forced} == {"</structured_plan>", "</call_tool>", "</review>", "</answer>"}
    assert all(sum(t.mask) == 0 for t in forced)
    assert result.report.references  # the answer still cites a real snippet


def test_missing_plan_tag_is_forced_and_resampled(local_tools: dict) -> None:  # type: ignore[type-arg]
    base = well_formed(n_calls=1)
    attempts = []

    def script(context: str, stop: list[str]) -> str:  # type: ignore[override]
        if stage_of(stop) == "plan":
            attempts.append(context.endswith("<structured_plan>"))
            if not context.endswith("<structured_plan>"):
                return "I will just answer: Latin.</answer>"
            return "<deep_analysis>a</deep_analysis><rubric>r</rubric><research_plan>p</research_plan></structured_plan>"
        return base(context, stop)

    traj = run(ScriptedPolicy(script), local_tools).trajectory
    assert attempts == [False, True]
    first = traj.turns[0]
    assert first.kind == "forced" and first.text == "<structured_plan>" and first.stage == "plan"
    assert traj.turns[1].kind == "sampled" and traj.turns[1].stage == "plan"
    assert "I will just answer" not in traj.assistant_text  # the dropped sample is gone from the sequence
    assert not traj.malformed


def test_endless_tool_calls_stop_at_the_budget(local_tools: dict) -> None:  # type: ignore[type-arg]
    def script(context: str, stop: list[str]) -> str:
        stage = stage_of(stop)
        if stage == "plan":
            return PLAN
        if stage == "research":
            return '<call_tool name="local_search">again</call_tool>'
        if stage == "review":
            return "<rubric_review>x</rubric_review></review>"
        return "<answer>Latin.</answer>"

    policy = ScriptedPolicy(script)
    traj = run(policy, local_tools, max_tool_calls=3).trajectory
    assert len(traj.tool_calls) == 3
    assert [t.stage for t in traj.turns if t.kind == "sampled"][-2:] == ["review", "answer"]
    # plan, three research turns, the tool-free final turn (its fourth call is dropped whole), review, answer
    assert len(policy.calls) == 1 + 3 + 1 + 1 + 1
    assert traj.assistant_text.count("<call_tool") == 3
    assert [t.text for t in traj.turns if t.kind == "forced"] == ["\n<review>"]


def test_after_the_tool_budget_the_model_writes_its_own_review(local_tools: dict) -> None:  # type: ignore[type-arg]
    final = ("<think>Two searches are enough.</think><state_evaluation>Covered.</state_evaluation>\n"
             "<review><rubric_review>Item 1 satisfied.</rubric_review><writing_plan>State it.</writing_plan></review>")
    seen: list[str] = []

    def script(context: str, stop: list[str]) -> str:
        stage = stage_of(stop)
        seen.append(stage)
        if stage == "plan":
            return PLAN
        if stage == "research":
            n = context.count("</tool_output>")
            return final if n == 2 else f'\n<call_tool name="local_search">Haymo of Faversham {n}</call_tool>'
        ids = SNIPPET_ID.findall(context)
        return f'<answer>It was <cite id="{ids[0]}">Latin</cite>.</answer>'

    traj = run(ScriptedPolicy(script), local_tools, max_tool_calls=2).trajectory
    assert len(traj.tool_calls) == 2
    assert seen == ["plan", "research", "research", "research", "answer"]  # no review node: nothing forced
    assert [t.kind for t in traj.turns if t.kind == "forced"] == []
    assert compliance(traj)["stages_self_tagged"] == ["plan", "research", "review", "answer"]


def test_unknown_tool_and_empty_query_are_tool_errors_and_counted(local_tools: dict) -> None:  # type: ignore[type-arg]
    def script(context: str, stop: list[str]) -> str:
        stage = stage_of(stop)
        if stage == "plan":
            return PLAN
        if stage == "research":
            n = context.count("</tool_output>")
            return [
                '<call_tool name="nonexistent_tool">q</call_tool>',
                '<call_tool name="local_search">   </call_tool>',
                '<call_tool name="local_search">Haymo of Faversham</call_tool>',
                "<review>done</review>",
            ][n]
        return "<answer>Latin.</answer>"

    traj = run(ScriptedPolicy(script), local_tools).trajectory
    errors = [c.error for c in traj.tool_calls]
    assert errors[0] is not None and "unknown tool" in errors[0] and "local_search" in errors[0]
    assert errors[1] is not None and "empty query" in errors[1]
    assert errors[2] is None
    assert traj.max_consecutive_tool_errors == 2
    outputs = [t.text for t in traj.turns if t.kind == "tool_output"]
    assert "Error: unknown tool" in outputs[0]


def test_length_limited_turns_are_kept_and_closed(local_tools: dict) -> None:  # type: ignore[type-arg]
    long_text = "<think>" + "word " * 500
    policy = ScriptedPolicy(lambda context, stop: "<structured_plan>" + long_text)
    caps = StageTokenCaps(plan=40, research=30, review=30, answer=30)
    traj = run(policy, local_tools, token_caps=caps, max_tool_calls=2).trajectory
    sampled = [t for t in traj.turns if t.kind == "sampled"]
    assert sampled and all(len(t.token_ids) <= 40 for t in sampled)
    assert all(t.finish_reason == "length" for t in sampled)
    assert traj.assistant_text.count("</structured_plan>") == 1


def test_a_final_turn_cut_inside_its_own_review_finishes_the_review_under_the_review_cap(local_tools: dict) -> None:  # type: ignore[type-arg]
    review = "<review><rubric_review>" + "Item 1 is satisfied by the first snippet. " * 6 + "</rubric_review>"
    tail = "<writing_plan>State it.</writing_plan></review>"

    def script(context: str, stop: list[str]) -> str:
        stage = stage_of(stop)
        if stage == "plan":
            return PLAN
        if stage == "research":
            if "</tool_output>" not in context:
                return '\n<call_tool name="local_search">Haymo of Faversham</call_tool>'
            return "<think>Enough.</think><state_evaluation>Covered.</state_evaluation>\n" + review + tail
        if stage == "review":  # the continuation: whatever of the review the research cap cut off
            written = context[context.rindex("</tool_output>"):]
            full = "<think>Enough.</think><state_evaluation>Covered.</state_evaluation>\n" + review + tail
            return full[len(written) - len("</tool_output>"):]
        ids = SNIPPET_ID.findall(context)
        return f'<answer>It was <cite id="{ids[0]}">Latin</cite>.</answer>'

    caps = StageTokenCaps(research=120, review=400)
    traj = run(ScriptedPolicy(script), local_tools, token_caps=caps).trajectory
    text = traj.assistant_text
    assert text.count("<review>") == 1 and text.count("</review>") == 1
    assert "Item 1 is satisfied" in text and text.index("</review>") > text.index("<writing_plan>")
    review_turns = [t for t in traj.turns if t.stage == "review"]
    assert [t.kind for t in review_turns] == ["sampled", "sampled"]  # cut turn + continuation, nothing forced
    assert review_turns[0].finish_reason == "length"
    assert compliance(traj)["stages_self_tagged"] == ["plan", "research", "review", "answer"]


def test_oversized_tool_output_is_cut_to_fit_and_only_shown_snippets_count(small_index) -> None:  # type: ignore[no-untyped-def]
    from agent.tools.local_search import LocalSearch

    tools = {"local_search": LocalSearch(small_index, k=30, snippet_chars=5000)}
    traj = run(ScriptedPolicy(well_formed(n_calls=1, bogus_cite=False)), tools, context_tokens=65536).trajectory
    output = next(t for t in traj.turns if t.kind == "tool_output")
    assert len(output.token_ids) <= 1024
    shown = traj.tool_calls[0].snippets
    assert shown and all(f'id="{s.id}"' in output.text for s in shown)
    assert output.text.count("<snippet id=") == len(shown)


def test_bad_settings_exit_2_without_echoing_secrets(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    env = {**os.environ, "RUBRICEM_AGENT__POLICY_BASE_URL": "http://x/v1", "RUBRICEM_AGENT__POLICY_API_KEY": "sk-TOPSECRET",
           "RUBRICEM_STORE__DATA_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "app.cli", "ask", "hello?"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "policy_base_url" in p.stderr and "sk-TOPSECRET" not in p.stderr + p.stdout


def test_question_first_the_graph_searches_the_question_and_the_model_writes_the_rest(local_tools: dict) -> None:  # type: ignore[type-arg]
    policy = ScriptedPolicy(well_formed(n_calls=2))
    traj = run(policy, local_tools, question_first=True).trajectory
    first, second = traj.tool_calls
    # The first search is the question as asked (vanilla RAG's query), issued before the model's first research turn.
    assert (first.tool, first.query) == ("local_search", QUESTION)
    assert first.error is None and first.snippets
    assert second.query == "Haymo of Faversham translation 1"  # the model's own query, written after reading them
    issued = [t for t in traj.turns if t.kind == "forced"]
    assert [t.text for t in issued] == [f'\n<call_tool name="local_search">{QUESTION}</call_tool>']
    assert issued[0].stage == "research" and sum(issued[0].mask) == 0  # never trained
    # The turn after the plan is the forced call, then its tool output: the model was not asked in between.
    kinds = [(t.stage, t.kind) for t in traj.turns]
    assert kinds[:3] == [("plan", "sampled"), ("research", "forced"), ("research", "tool_output")]
    assert [stage_of(c["stop"]) for c in policy.calls][:2] == ["plan", "research"]
    # Compliance: the graph's call is neither a forced tag nor one of the model's calls.
    c = compliance(traj)
    assert c["stages_self_tagged"] == ["plan", "research", "review", "answer"]
    assert (c["graph_tool_calls"], c["tool_calls"], c["valid_tool_calls"]) == (1, 1, 1.0)


def test_question_first_keeps_a_question_with_markup_as_one_query_and_respects_a_zero_budget(
    local_tools: dict,  # type: ignore[type-arg]
) -> None:
    question = 'What does "</call_tool>" mean in <b>this</b> scaffold?'
    traj = run(ScriptedPolicy(well_formed(n_calls=1)), local_tools, question=question, question_first=True).trajectory
    assert traj.tool_calls[0].query == question  # built, not parsed back out of the text
    assert traj.tool_calls[0].error is None
    # No tool budget: no search at all, not even the question's.
    traj = run(ScriptedPolicy(well_formed(n_calls=1)), local_tools, question_first=True, max_tool_calls=0).trajectory
    assert traj.tool_calls == () and "<call_tool" not in traj.assistant_text


def test_question_first_with_a_budget_of_one_leaves_the_model_its_tool_free_final_turn(local_tools: dict) -> None:  # type: ignore[type-arg]
    policy = ScriptedPolicy(well_formed(n_calls=1))
    traj = run(policy, local_tools, question_first=True, max_tool_calls=1).trajectory
    assert [c.query for c in traj.tool_calls] == [QUESTION]
    # plan, then (after the graph's search) one tool-free research turn that reviews, then the answer
    assert [stage_of(c["stop"]) for c in policy.calls] == ["plan", "research", "answer"]
    assert compliance(traj)["tool_calls"] == 0
