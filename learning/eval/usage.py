"""Tokens and cost of one evaluated item (issue 36), as the peers' evaluation tables report them: what the policy read
and sampled, what the judge read and wrote, and what that cost under the price table (`agent/accounting.py`).

The policy's figures come from the item's trajectory, so they need nothing but what the run already recorded:
- **sampled tokens**: the token ids of the sampled turns (what the policy generated and the agent kept);
- **prompt tokens**: every sampled turn is one generation call, and that call read the whole context so far: the
  rendered prompt plus the token ids of every earlier turn, sampled, forced or tool output
  (`agent.sequence.SequenceWriter.sample`). A turn that records its own `prompt_tokens` (read at the call,
  `store.records.Turn.prompt_tokens`) carries that same number and is taken as is; turns logged without it get the
  count rebuilt, as `store.session_log.usage` does for the session views.
Samples the graph dropped and asked again (a plan without `<structured_plan>`, a call past the tool budget, an answer
before the review) and the clarify decision are no turns of the trajectory and are not counted, so where the graph
dropped a sample the policy figures are a lower bound. An item whose run failed has no trajectory here and no figures.
The judge's figures are its usage record: a grading that failed counts what its error says was billed.

Costs follow the price table's rules (`agent.accounting`, the same as for the session views): the embedded policy and
the offline (MiniLM) grader run in this process and cost 0; a model a non-empty table does not list has an unknown
cost (None, shown as "unknown", never 0), and a sum with an unknown part is unknown; the judge's own prices
(`RUBRICEM_LEARNING__JUDGE__PRICE_*`, already in its usage record) count where the table does not list its model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent.accounting import EMBEDDED_MODEL, PriceTable, add_costs, cost, judge_cost
from store.records import Trajectory

TOKEN_KEYS = ("policy_calls", "policy_prompt", "policy_sampled", "judge_prompt", "judge_completion")
COST_KEYS = ("policy", "judge", "total")


def policy_model(policy: object) -> str:
    """The policy's model name for prices: the served model's name, or "embedded" for the in-process one (the name
    `agent.sequence.policy_model` gives the policy's spans)."""
    model = getattr(policy, "model", None)
    return model if isinstance(model, str) and model else EMBEDDED_MODEL


def policy_tokens(traj: Trajectory) -> dict[str, int]:
    """Calls, prompt tokens and sampled tokens of the policy in one trajectory (see the module docstring).

    Prompt tokens of the call that made a sampled turn = len(prompt ids) + the token ids of all turns before it.
    """
    context = len(traj.prompt.token_ids)
    calls = prompt = sampled = 0
    for turn in traj.turns:
        if turn.kind == "sampled":
            calls += 1
            prompt += turn.prompt_tokens if turn.prompt_tokens else context  # read at the call, where recorded
            sampled += len(turn.token_ids)
        context += len(turn.token_ids)
    return {"policy_calls": calls, "policy_prompt": prompt, "policy_sampled": sampled}


def grading_cost(prices: PriceTable, judge: Mapping[str, Any] | None) -> float | None:
    """The cost of an item's grading from its `judge` record ({"model", "usage", "approximate"?}); 0 without one."""
    if not judge:
        return 0.0
    usage = judge.get("usage") or {}
    recorded = usage.get("cost_usd")
    return judge_cost(prices, str(judge.get("model") or ""), "offline" if judge.get("approximate") else "llm",
                      int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                      float(recorded) if isinstance(recorded, int | float) else None)


def item_usage(traj: Trajectory, model: str, judge: Mapping[str, Any] | None,
               prices: PriceTable) -> tuple[dict[str, int], dict[str, float | None]]:
    """(tokens, cost_usd) of one item: `TOKEN_KEYS` and `COST_KEYS` (a cost of None is unknown)."""
    tokens = policy_tokens(traj)
    usage = (judge or {}).get("usage") or {}
    tokens["judge_prompt"] = int(usage.get("prompt_tokens") or 0)
    tokens["judge_completion"] = int(usage.get("completion_tokens") or 0)
    spent = tokens["policy_prompt"] + tokens["policy_sampled"] > 0  # nothing spent costs nothing, priced or not
    policy = cost(prices, model, tokens["policy_prompt"], tokens["policy_sampled"],
                  local=model == EMBEDDED_MODEL) if spent else 0.0
    graded = grading_cost(prices, judge)
    return tokens, {"policy": policy, "judge": graded, "total": add_costs(policy, graded)}


def total_usage(records: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, float | None]]:
    """Tokens and costs summed over the records that have them (`items`: how many did); a cost with any unknown
    part is unknown."""
    counted = [r for r in records if isinstance(r.get("tokens"), Mapping)]
    tokens = {k: sum(int(r["tokens"].get(k) or 0) for r in counted) for k in TOKEN_KEYS}
    tokens["items"] = len(counted)
    costs = {k: add_costs(*((r.get("cost_usd") or {}).get(k) for r in counted)) for k in COST_KEYS}
    return tokens, costs


def add_totals(parts: Iterable[tuple[Mapping[str, int], Mapping[str, float | None]]]
               ) -> tuple[dict[str, int], dict[str, float | None]]:
    """Totals of several runs' totals (the spend of a `--runs N` evaluation)."""
    parts = list(parts)
    tokens = {k: sum(int(t.get(k) or 0) for t, _ in parts) for k in (*TOKEN_KEYS, "items")}
    return tokens, {k: add_costs(*(c.get(k) for _, c in parts)) for k in COST_KEYS}
