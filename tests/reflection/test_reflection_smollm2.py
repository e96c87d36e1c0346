"""The whole reflection path on the real embedded SmolLM2: candidates stored exactly, an invalid one never banked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from learning.judge.offline_reflection import OfflineReflectionJudge
from learning.judge.reflection import validity_error
from learning.reflection import write_reflection
from store.rubric_bank import RubricBank
from store.session_log import SessionLog
from tests.reflection.helpers import add_session


@pytest.mark.slow
def test_smollm2_reflects_end_to_end(log: SessionLog, bank: RubricBank, embedded_policy: Any) -> None:
    sid = add_session(log, "s1")
    out = asyncio.run(write_reflection(
        sid, log=log, policy=embedded_policy, judge=OfflineReflectionJudge(), bank=bank, candidates=2,
        max_tokens=48, trajectory_chars=1500, seed=3,
    ))  # fmt: skip
    rows = log.reflection_candidates(session_id=sid)
    assert out.candidates == len(rows) == 2 and out.batch_id == rows[0].batch_id
    tokenizer = embedded_policy.tokenizer
    for r in rows:
        c = r.candidate
        assert c.token_source == "server" and len(c.logprobs) == len(c.token_ids) > 0
        assert all(lp <= 0 for lp in c.logprobs) and c.seed in (3, 4)
        assert tokenizer.decode(list(c.token_ids)) == c.text  # the stored text is what the stored ids spell
        assert r.prompt.token_ids and r.prompt.text.endswith("assistant\n")
        assert c.valid == (validity_error(c.full_text) is None)  # the writer's verdict matches the format rule
        assert (c.u is None) or c.valid  # an invalid candidate is never scored
    # The base 135M model does not write the two required blocks in 48 tokens (measured: it writes "### Stage 5"
    # headings and <ref> tags), so the outcome is determined: both candidates are stored, marked invalid and never
    # scored, the batch says why, and nothing enters the bank.
    assert [(r.candidate.valid, r.candidate.u, r.accepted) for r in rows] == [(False, None, False)] * 2
    assert (out.valid, out.scored, out.best, out.reason) == (0, 0, None, "no_valid_candidate")
    assert out.detail == "no candidate had exactly the two required blocks" and bank.count() == 0
