"""Token and cost accounting (issue 36): a price table per model, and what a count of tokens costs under it.

Decisions (the issue is silent on where "local" ends):
- An **empty table** (the default) prices every model at 0: the embedded policy, a self-hosted vLLM and the offline
  judge cost nothing to run per token.
- A **non-empty table** prices the models it lists; a model it does not list has an **unknown** cost (None), shown as
  "unknown", never as 0, so a forgotten entry cannot pass for a free model. Engines that run inside this process (the
  embedded policy, the offline judge) stay at 0 either way: `cost(..., local=True)`.
- Prices are USD per million tokens, in and out, as the API vendors quote them.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field


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
