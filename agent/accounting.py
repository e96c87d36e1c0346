"""Token and cost accounting (issue 36): a price table per model, and what a count of tokens costs under it.

Decisions (the issue is silent on where "local" ends):
- An **empty table** (the default) prices every model at 0: the embedded policy, a self-hosted vLLM and the offline
  judge cost nothing to run per token.
- A **non-empty table** prices the models it lists; a model it does not list has an **unknown** cost (None), shown as
  "unknown", never as 0, so a forgotten entry cannot pass for a free model. Engines that run inside this process (the
  embedded policy, the offline judge) stay at 0 either way: `cost(..., local=True)`.
- Prices are USD per million tokens, in and out, as the API vendors quote them.
- Tokens spent are counted from the session log (`session_usage`): its decisions (policy per stage, judge per
  judgement, which price wins for the judge) are in that function's docstring. Every view (`rubricem sessions`, the
  chat's session view, batch indexes, the learning page) prices them with this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from store.records import Stage

if TYPE_CHECKING:  # the settings import this module: the session log is not loaded with them
    from store.session_log import SessionLog, SessionTokens


class ModelPrice(BaseModel):
    """What one model costs, USD per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_mtok: float = Field(default=0.0, ge=0, description="USD per million prompt tokens.")
    output_per_mtok: float = Field(default=0.0, ge=0, description="USD per million completion (sampled) tokens.")


PriceTable = Mapping[str, ModelPrice]


def cost(prices: PriceTable, model: str, prompt_tokens: int, completion_tokens: int, *,
         local: bool = False) -> float | None:
    """USD for the tokens under the table, or None when the table is non-empty and does not know the model."""
    if local or not prices:
        return 0.0
    price = prices.get(model)
    if price is None:
        return None
    return (prompt_tokens * price.input_per_mtok + completion_tokens * price.output_per_mtok) / 1_000_000


def add_costs(*costs: float | None) -> float | None:
    """A sum of costs that stays unknown (None) when any part is unknown."""
    total = 0.0
    for c in costs:
        if c is None:
            return None
        total += c
    return total


def format_cost(value: float | None) -> str:
    """'$0.0123', '$0' for free, 'unknown' for an unpriced model."""
    if value is None:
        return "unknown"
    if value == 0:
        return "$0"
    return f"${value:.4f}" if value >= 0.0001 else f"${value:.2e}"


# ---- per-session usage (read from the session log) -----------------------------------------------------------------

EMBEDDED_MODEL = "embedded"
"""The policy model name of the in-process policy (`agent.sequence.policy_model`): it runs here and costs 0."""

LOCAL_JUDGE_KINDS = frozenset({"offline"})
"""Judge kinds that run in this process (the offline MiniLM judge): they cost 0."""


def _priced(prices: PriceTable, model: str | None, prompt: int, completion: int, *, local: bool) -> float | None:
    if prompt == 0 and completion == 0:  # nothing spent costs nothing, priced or not
        return 0.0
    return cost(prices, model or "", prompt, completion, local=local)


@dataclass(frozen=True, slots=True)
class StageUsage:
    """The policy's calls of one stage of a session and what they cost."""

    stage: Stage
    calls: int  # sampled turns (each one policy call)
    prompt_tokens: int  # what those calls read (see `reconstructed`)
    sampled_tokens: int  # what they sampled
    cost: float | None  # None: unknown (a non-empty price table without the session's model)
    reconstructed: int = 0  # calls whose prompt count was rebuilt from the log (logged before migration 0012)


@dataclass(frozen=True, slots=True)
class JudgeUsage:
    """What one stored judgement's judge calls used and cost (a whole judgement: see `session_usage`)."""

    judgement_id: int
    model: str
    kind: str
    status: str
    calls: int
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None


@dataclass(frozen=True, slots=True)
class SessionUsage:
    """Tokens and cost of one session: the policy per stage, the judge per judgement, and their totals."""

    session_id: str
    policy_model: str | None  # None for sessions logged before migration 0012 (unknown under a non-empty table)
    stages: tuple[StageUsage, ...]  # STAGES order
    judgements: tuple[JudgeUsage, ...] = ()

    @property
    def policy_calls(self) -> int:
        return sum(s.calls for s in self.stages)

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.stages)

    @property
    def sampled_tokens(self) -> int:
        return sum(s.sampled_tokens for s in self.stages)

    @property
    def reconstructed(self) -> int:
        return sum(s.reconstructed for s in self.stages)

    @property
    def policy_cost(self) -> float | None:
        return add_costs(*(s.cost for s in self.stages))

    @property
    def judge_calls(self) -> int:
        return sum(j.calls for j in self.judgements)

    @property
    def judge_prompt_tokens(self) -> int:
        return sum(j.prompt_tokens for j in self.judgements)

    @property
    def judge_completion_tokens(self) -> int:
        return sum(j.completion_tokens for j in self.judgements)

    @property
    def judge_cost(self) -> float | None:
        return add_costs(*(j.cost for j in self.judgements))

    @property
    def total_cost(self) -> float | None:
        return add_costs(self.policy_cost, self.judge_cost)


def judge_cost(prices: PriceTable, model: str, kind: str, prompt: int, completion: int,
               recorded: float | None) -> float | None:
    """The cost of a judgement's calls. The offline judge runs here (0). The table prices the judge's model when it
    lists it; otherwise a figure the judge client recorded itself (the legacy `learning.judge.price_*` settings)
    counts when it is > 0; otherwise the table's rules apply (0 for an empty table, unknown for a non-empty one)."""
    if model not in prices and recorded is not None and recorded > 0 and kind not in LOCAL_JUDGE_KINDS:
        return recorded
    return _priced(prices, model, prompt, completion, local=kind in LOCAL_JUDGE_KINDS)


def session_usage(counts: SessionTokens, prices: PriceTable) -> SessionUsage:
    """Price one session's token counts (`store.session_log.SessionLog.token_counts`) under the table.

    Decisions:
    - **Policy, per stage.** Prompt tokens are what each sampled turn's call read (the whole context: prompt plus
      every earlier turn, as an API bills it without prefix caching); sampled tokens are the turns' token ids. Calls
      that left no turn (a sample the graph dropped and asked again, the clarify decision) are not counted, so the
      policy figures are the log's, a lower bound where the graph dropped a sample.
    - **Judge, per judgement, not per stage.** One scoring call grades every stage at once, so a per-stage split of
      the judge would be invented. A judgement's usage is everything its judge calls used: the scoring call, the
      answer-only fallback, the citation-support checks, and, for the first session of a question group, the
      group's rubric generation (the judge charges the group's shared call to its first row, so sums over sessions
      are exact). Failed judgements that recorded usage count too: they were billed. The stored usage is not split
      by call kind, so neither is this.
    - **Prices** (`cost`): the embedded policy and the offline judge cost 0; a non-empty table without the model
      gives an unknown cost (None), which makes every sum it is part of unknown. A session logged before migration
      0012 has no policy model and so an unknown policy cost under a non-empty table. For the judge, see
      `judge_cost` (the table wins when it lists the judge's model).
    """
    model = counts.policy_model
    local = model == EMBEDDED_MODEL
    stages = tuple(
        StageUsage(stage=s.stage, calls=s.calls, prompt_tokens=s.prompt_tokens, sampled_tokens=s.sampled_tokens,
                   cost=_priced(prices, model, s.prompt_tokens, s.sampled_tokens, local=local),
                   reconstructed=s.reconstructed)
        for s in counts.stages
    )
    judgements = tuple(
        JudgeUsage(judgement_id=j.judgement_id, model=j.judge_model, kind=j.judge_kind, status=j.status,
                   calls=j.calls, cached_calls=j.cached_calls, prompt_tokens=j.prompt_tokens,
                   completion_tokens=j.completion_tokens,
                   cost=judge_cost(prices, j.judge_model, j.judge_kind, j.prompt_tokens, j.completion_tokens,
                                   j.recorded_cost_usd))
        for j in counts.judgements
    )
    return SessionUsage(counts.session_id, model, stages, judgements)


def usages(log: SessionLog, session_ids: Sequence[str], prices: PriceTable) -> dict[str, SessionUsage]:
    """`session_usage` of each known session among `session_ids` (read in a few aggregate queries)."""
    return {sid: session_usage(c, prices) for sid, c in log.token_counts(session_ids).items()}


def usage_of(log: SessionLog, session_id: str, prices: PriceTable) -> SessionUsage | None:
    """`session_usage` of one session, or None when the log does not know it."""
    return usages(log, [session_id], prices).get(session_id)


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Tokens and cost summed over several sessions (a batch, a retraining cycle's window)."""

    sessions: int = 0
    policy_calls: int = 0
    prompt_tokens: int = 0
    sampled_tokens: int = 0
    judge_calls: int = 0
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    policy_cost: float | None = 0.0
    judge_cost: float | None = 0.0

    @property
    def total_cost(self) -> float | None:
        return add_costs(self.policy_cost, self.judge_cost)


def total_usage(items: Iterable[SessionUsage]) -> UsageTotals:
    """The sums over sessions; a cost with any unknown part is unknown."""
    listed = list(items)
    return UsageTotals(
        sessions=len(listed), policy_calls=sum(u.policy_calls for u in listed),
        prompt_tokens=sum(u.prompt_tokens for u in listed), sampled_tokens=sum(u.sampled_tokens for u in listed),
        judge_calls=sum(u.judge_calls for u in listed), judge_prompt_tokens=sum(u.judge_prompt_tokens for u in listed),
        judge_completion_tokens=sum(u.judge_completion_tokens for u in listed),
        policy_cost=add_costs(*(u.policy_cost for u in listed)), judge_cost=add_costs(*(u.judge_cost for u in listed)),
    )


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One line of a session's usage table: a stage of the policy, the policy's total, the judge, or the total."""

    label: str
    calls: int
    prompt_tokens: int
    output_tokens: int  # sampled (policy) or completion (judge) tokens
    cost: float | None
    note: str = ""


def usage_rows(usage: SessionUsage) -> tuple[UsageRow, ...]:
    """The table every session view shows: the four stages, the policy's total, the judge, and the session total."""
    rows = [UsageRow(s.stage, s.calls, s.prompt_tokens, s.sampled_tokens, s.cost,
                     f"{s.reconstructed} prompt count(s) rebuilt from the log" if s.reconstructed else "")
            for s in usage.stages]
    rows.append(UsageRow("policy", usage.policy_calls, usage.prompt_tokens, usage.sampled_tokens, usage.policy_cost,
                         usage.policy_model or "model not recorded"))
    judges = sorted({f"{j.kind}/{j.model}" for j in usage.judgements})
    rows.append(UsageRow("judge", usage.judge_calls, usage.judge_prompt_tokens, usage.judge_completion_tokens,
                         usage.judge_cost, f"{len(usage.judgements)} judgement(s)" + (
                             f": {', '.join(judges)}" if judges else "")))
    rows.append(UsageRow("total", usage.policy_calls + usage.judge_calls,
                         usage.prompt_tokens + usage.judge_prompt_tokens,
                         usage.sampled_tokens + usage.judge_completion_tokens, usage.total_cost))
    return tuple(rows)


def unpriced_models(usage: SessionUsage) -> tuple[str, ...]:
    """The models whose cost is unknown in this session (why a cost shows "unknown")."""
    missing: list[str] = []
    if usage.policy_cost is None:
        missing.append(usage.policy_model or "the policy (its model was not recorded)")
    missing += [j.model for j in usage.judgements if j.cost is None and j.model not in missing]
    return tuple(dict.fromkeys(missing))


def prices_note(prices: PriceTable) -> str:
    """One line on the price table in force."""
    if not prices:
        return "no price table (RUBRICEM_PRICES): every model costs 0"
    return f"price table of {len(prices)} model(s) (RUBRICEM_PRICES); in-process models cost 0"
