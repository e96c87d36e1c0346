"""Citation check: cited ids vs retrieved snippets, and the optional LLM support check through the real client."""

from __future__ import annotations

import asyncio
import json

from learning.judge.citations import answer_text, check_citations, checkable_claims, support_check
from learning.judge.client import JudgeClient
from tests.judge.builders import trajectory
from tests.judge.openai_standin import OpenAIStandIn


def test_precision_counts_every_cited_id() -> None:
    t = trajectory(answer='It was <cite id="abcd0001-0">Latin</cite>; see <cite id="deadbeef-9, abcd0001-0">x</cite>.')
    check = check_citations(t)
    assert (check.cited, check.valid) == (3, 2)
    assert check.precision == 2 / 3
    assert check.support_checked == 0


def test_nothing_cited_is_none_not_zero() -> None:
    check = check_citations(trajectory(answer="Latin, I believe."))
    assert (check.cited, check.valid, check.precision) == (0, 0, None)


def test_answer_text_reads_only_the_answer_block() -> None:
    t = trajectory(answer="<think>hidden</think>The answer is Latin.")
    assert answer_text(t) == "The answer is Latin."
    assert answer_text(trajectory(answer=None)) == ""


def test_checkable_claims_keep_only_valid_ids() -> None:
    t = trajectory(answer='<cite id="deadbeef-1">bogus</cite> and <cite id="deadbeef-2, abcd0001-0">real</cite>')
    claims = checkable_claims(t)
    assert [(c.claim, c.ids) for c in claims] == [("real", ("abcd0001-0",))]


def test_support_check_counts_verdicts_and_failures(openai_standin: OpenAIStandIn) -> None:
    t = trajectory(
        answer='It was <cite id="abcd0001-0">Latin</cite>. He was <cite id="abcd0001-0">a pope</cite>. '
        'Also <cite id="abcd0001-0">English</cite>.'
    )
    openai_standin.push(content=json.dumps({"supported": True, "reason": "the snippet says Latin"}))
    openai_standin.push(content=json.dumps({"supported": False, "reason": "not in the snippet"}))
    openai_standin.push(content="not json at all", times=2)  # the third claim: invalid even after the repair

    async def go():
        async with JudgeClient(openai_standin.root, "judge", concurrency=1, max_retries=0) as client:
            return await support_check(client, t)

    result = asyncio.run(go())
    assert result.check.cited == 3 and result.check.valid == 3
    assert result.check.support_checked == 2
    assert result.check.supported == 1
    assert result.failed == 1
    assert [v.supported for v in result.verdicts] == [True, False, None]
    # Usage counts every billed call: the two verdicts, and the third claim's invalid answer and its repair, whose
    # cost the JudgeOutputInvalid carries (an invalid answer is billed like a valid one).
    assert result.usage.calls == 4
    assert len(openai_standin.chat_requests) == 4
    user = openai_standin.chat_requests[0].json["messages"][-1]["content"]
    assert "Latin" in user and "Haymo of Faversham (d. 1244)" in user
    # the same facts the report's support check uses (issue 48): "Latin" is one of the passage's words
    assert "## Automatic check" in user and "abcd0001-0: support" in user and "(word overlap 1.00)" in user
    pope = [r.json["messages"][-1]["content"] for r in openai_standin.chat_requests if "a pope" in
            r.json["messages"][-1]["content"]][0]
    assert "(word overlap 0.00)" in pope
