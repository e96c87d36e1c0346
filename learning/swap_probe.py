"""The swap probe's decision (issue 63): did a hot swap really put the new version's weights in service?

Pure maths, no I/O and no torch; `learning.swap_verify` gathers the log-probs and acts on the verdict.

The silent failure it catches: after a hot swap the engine keeps sampling from the old weights (a stale adapter, a
load that answered "done" but kept the old one), while every session records the new version's name. Two readings of
one fixed probe prompt, sampled with one seed at temperature 1, are compared:

* **Agreement with the trainer.** The engine's log-probs of the tokens it sampled under the new version against the
  trainer's log-probs of the same tokens for the new version: the mean k3 estimate of KL(served ‖ trainer) per token,
  exp(Δ) − Δ − 1 with Δ = trainer − served, the same figure as the training loop's `sampler_kl`, must be within the
  engine gap a sound engine shows (`tolerance`: `TrainConfig.max_sampler_kl`'s 0.05 by default, about 8× the gap
  measured on bf16 vLLM, torch and llama.cpp's Q4_1). A sampler that still has the old adapter while the trainer has
  the new one measures far above it when the versions differ much (a missing adapter: about 0.45).
* **A difference from the previous version.** The engine's own reading under the previous version (same prompt,
  same seed) against its reading under the new one: the two must differ, at some token or in some log-prob. An engine
  is deterministic for one seed, prompt and set of weights, so identical readings mean that the same weights served
  both. This half needs no trainer, so it catches a stale swap however small the update: the trainer's comparison
  cannot tell a version from its parent when they differ by less than the engine's own rounding.

`to_previous` is the k3 distance over the tokens both readings share (the prefix on which they sampled the same ids),
and `diverged_at` the first position where their ids differ; readings that differ only in length (one ended at EOS)
differ too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from learning.errors import LearningError


@dataclass(frozen=True, slots=True)
class ProbeReading:
    """What one engine sampled for the probe prompt under one version: token ids and their log-probs."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} probe tokens but {len(self.logprobs)} log-probs")


@dataclass(frozen=True, slots=True)
class ProbeDistances:
    """The two distances of a swap probe (module docstring), in nats per token."""

    to_new: float  # mean k3 KL(served ‖ trainer's new version) over the new reading's tokens; NaN when none compare
    to_previous: float  # mean k3 between the new and previous readings over their shared prefix; NaN when empty
    tokens: int  # tokens of the new reading compared with the trainer
    shared: int  # leading tokens both readings sampled alike
    diverged_at: int | None  # first position whose ids differ (or where one reading ended); None: same ids

    def as_dict(self) -> dict[str, Any]:
        """JSON for a cycle's record."""
        return {"to_new": _round(self.to_new), "to_previous": _round(self.to_previous), "tokens": self.tokens,
                "shared": self.shared, "diverged_at": self.diverged_at}


@dataclass(frozen=True, slots=True)
class ProbeVerdict:
    """Whether a swap is verified; `reason` says why not ("" when it is)."""

    verified: bool
    distances: ProbeDistances
    reason: str


class SwapNotVerified(LearningError):
    """A hot swap failed its probe, or the probe could not run before its deadline: the version is not promoted.

    The message names the version, the engine, the replica and both distances (when they were measured)."""

    def __init__(self, message: str, *, version: str, engine: str, replica: str,
                 distances: ProbeDistances | None = None, after_swap: bool = False) -> None:
        super().__init__(message)
        self.version, self.engine, self.replica, self.distances = version, engine, replica, distances
        self.after_swap = after_swap  # the swap had run (the version may be loaded now), or failed before it

    def record(self) -> dict[str, Any]:
        """JSON for the cycle's record."""
        out: dict[str, Any] = {"version": self.version, "engine": self.engine, "replica": self.replica,
                               "after_swap": self.after_swap}
        if self.distances is not None:
            out.update(self.distances.as_dict())
        return out


def k3(served: Sequence[float], reference: Sequence[float]) -> tuple[float, int]:
    """(mean k3 estimate of KL(served ‖ reference) per token, tokens used): exp(Δ) − Δ − 1, Δ = reference − served,
    over the positions where both are finite (Δ clamped to ±20 as the trainer does); (NaN, 0) when there are none.

    Raises:
        ValueError: the sequences differ in length.
    """
    if len(served) != len(reference):
        raise ValueError(f"{len(served)} served log-probs against {len(reference)} reference ones")
    terms = []
    for s, r in zip(served, reference, strict=True):
        if math.isfinite(s) and math.isfinite(r):
            d = min(max(r - s, -20.0), 20.0)
            terms.append(math.expm1(d) - d)
    return (math.fsum(terms) / len(terms), len(terms)) if terms else (math.nan, 0)


def distances(new: ProbeReading, trainer_new: Sequence[float], previous: ProbeReading) -> ProbeDistances:
    """Both distances of a probe (module docstring)."""
    to_new, tokens = k3(new.logprobs, trainer_new)
    shared = 0
    for a, b in zip(new.token_ids, previous.token_ids):
        if a != b:
            break
        shared += 1
    same_ids = shared == len(new.token_ids) == len(previous.token_ids)
    to_previous, _ = k3(new.logprobs[:shared], previous.logprobs[:shared])
    return ProbeDistances(to_new, to_previous, tokens, shared, None if same_ids else shared)


# The trainer's own distance between the new version and the previous one on the probe's tokens below which an engine
# cannot be expected to show any difference: about the engine gap measured on bf16 vLLM, torch and llama.cpp
# (0.002-0.007). A real first training step moved the probe by about 0.001, and llama.cpp then read both versions
# identically, so "identical readings" alone would refuse every small honest update (make test, 2026-12-07).
VISIBLE_UPDATE = 0.01


def identical(new: ProbeReading, previous: ProbeReading) -> bool:
    """Whether two readings are the same ids with the same log-probs (what one set of weights gives twice)."""
    return new.token_ids == previous.token_ids and tuple(new.logprobs) == tuple(previous.logprobs)


def judge_swap(new: ProbeReading, trainer_new: Sequence[float], previous: ProbeReading,
               tolerance: float, trainer_previous: Sequence[float] | None = None) -> ProbeVerdict:
    """Verified when the new reading agrees with the trainer within `tolerance` and differs from the previous reading.

    Args:
        new: the engine's reading under the new version.
        trainer_new: the trainer's log-probs of `new.token_ids` for the new version.
        previous: the engine's reading under the previous version (same prompt and seed).
        tolerance: the largest mean k3 per token a sound engine may show (> 0; math.inf accepts any agreement).
        trainer_previous: the trainer's log-probs of `new.token_ids` for the previous version. Identical readings
            are a stale swap only when these are at least VISIBLE_UPDATE from `trainer_new` (the update is one an
            engine can show); None: always.

    Raises:
        ValueError: `trainer_new` does not align with `new`, or a tolerance that is not > 0.
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, not {tolerance!r}")
    d = distances(new, trainer_new, previous)
    if not new.token_ids:
        return ProbeVerdict(False, d, "the engine sampled no probe token under the new version")
    if d.tokens == 0:
        return ProbeVerdict(False, d, "no probe token has a finite log-prob from both the engine and the trainer")
    reasons = []
    if d.to_new > tolerance:
        reasons.append(f"the served log-probs are {d.to_new:.4g} nats/token from the trainer's for the new version, "
                       f"above the engine gap allowed ({tolerance:g})")
    update = k3(trainer_previous, trainer_new)[0] if trainer_previous is not None else math.inf
    if identical(new, previous) and not update < VISIBLE_UPDATE:
        reasons.append("the served log-probs are identical to the previous version's (same tokens, same log-probs): "
                       "the engine still serves the previous weights")
    return ProbeVerdict(not reasons, d, "; and ".join(reasons))


def _round(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 6)


def describe(distances: ProbeDistances, new: str, previous: str, tolerance: float) -> str:
    """Both distances in words, for an error message or a log line."""
    prev = "the same ids" if distances.diverged_at is None else f"ids differ from token {distances.diverged_at}"
    return (f"distance to the trainer's {new}: {distances.to_new:.4g} nats/token over {distances.tokens} token(s) "
            f"(engine gap allowed {tolerance:g}); distance to the previous version {previous}: "
            f"{distances.to_previous:.4g} nats/token over {distances.shared} shared token(s), {prev}")
