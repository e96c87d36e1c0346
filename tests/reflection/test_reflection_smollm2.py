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
    accepted = [r for r in rows if r.accepted]
    assert bank.count() == len(accepted) <= 1
    for r in accepted:  # whatever the small model wrote, only a valid, scored candidate can be in the bank
        assert r.candidate.valid and r.candidate.u is not None and bank.get(r.bank_item_id or "").session_id == sid
    if out.valid == 0:
        assert out.reason == "no_valid_candidate" and bank.count() == 0
