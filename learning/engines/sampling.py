"""The sampler both embedded engines share: one row's seeded choices, its end conditions, and the loop that feeds it.

Why one sampler: the torch engine and the llama.cpp engine differ only in where the logits come from. Token choice
(seeded torch generator, temperature, top-p = 1), stop strings, EOS, the loop guard and the token cap are the same
code, so a rollout sampled on either engine is the same kind of sample for the trainer, and a group row makes
exactly the choices a single generation makes from the same logits and seed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from agent.protocols import Generation

if TYPE_CHECKING:  # torch is imported lazily so that importing this module stays cheap
    import torch

LOOP_WINDOW = 32  # tokens; a window sampled for the LOOP_REPEATS-th time ends the generation (see LoopGuard)
LOOP_REPEATS = 3


class Sampled(Protocol):
    """What a row needs from its engine's client: the end tokens, the detokenizer and the Generation builder."""

    @property
    def eos_token_ids(self) -> frozenset[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def finish(self, ids: list[int], logprobs: list[float], reason: str, stop: str | None,
               version: str) -> Generation: ...


class Row:
    """One sequence being sampled: its seeded generator, tokens, logprobs, loop guard and end conditions.

    The single-sequence and the group paths of both engines sample through `push`.
    """

    def __init__(self, client: Sampled, seed: int | None, stops: tuple[str, ...], max_tokens: int,
                 temperature: float, version: str) -> None:
        import torch

        self.client, self.stops, self.max_tokens = client, stops, max_tokens
        self.temperature, self.version = temperature, version
        self.generator = torch.Generator()
        self.generator.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.guard = LoopGuard()

    def push(self, logits: torch.Tensor) -> Generation | None:
        """Sample the next token from `logits` (1-D, float32); the finished Generation, or None to go on."""
        import torch

        if self.temperature > 0:
            lp = torch.log_softmax(logits / self.temperature, dim=-1)
            token = draw(lp, self.generator)
        else:
            lp = torch.log_softmax(logits, dim=-1)
            token = int(torch.argmax(lp).item())
        client = self.client
        if token in client.eos_token_ids:
            return client.finish(self.ids, self.logprobs, "stop", None, self.version)
        self.ids.append(token)
        self.logprobs.append(float(lp[token].item()))
        if self.stops:
            hit = earliest_stop(client.decode(self.ids), self.stops)
            if hit is not None:
                # this token completed the stop string (it was absent a step ago): keep it and stop here
                return client.finish(self.ids, self.logprobs, "stop", hit[1], self.version)
        if self.guard.looping(self.ids) or len(self.ids) >= self.max_tokens:
            return client.finish(self.ids, self.logprobs, "length", None, self.version)
        return None


def draw(logprobs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from the distribution `logprobs` (1-D, normalised), by inverting its cumulative sum at one seeded
    uniform number.

    Why not `torch.multinomial`: on a 49k vocabulary it took 0.9 ms a token on one thread against 0.05 ms here, about
    a second of a demo session (issue 47). Same distribution, other draws: a seed gives other tokens than it did
    before, on every engine alike.
    """
    import torch

    cdf = torch.cumsum(logprobs.exp(), dim=-1)
    u = torch.rand(1, generator=generator, dtype=cdf.dtype) * cdf[-1]  # cdf[-1] is 1 up to rounding
    return int(torch.searchsorted(cdf, u, right=True).clamp_max(cdf.numel() - 1).item())


def sample(row: Row, logits: torch.Tensor, step: Callable[[int], torch.Tensor]) -> Generation:
    """Run one row to its end: `logits` are the prompt's last position, `step(token)` feeds a sampled token to the
    engine and returns the next position's logits. The one sampling loop of both engines."""
    while True:
        done = row.push(logits)
        if done is not None:
            return done
        logits = step(row.ids[-1])


def continuation_logprobs(logits: torch.Tensor, cont: Sequence[int], temperature: float) -> tuple[float, ...]:
    """The log-probabilities of `cont` under `logits` (one row per token, float32), the sampler's way: divided by the
    temperature when it is above 0, raw logits otherwise (greedy)."""
    import torch

    if temperature > 0:
        logits = logits / temperature
    lp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(list(cont)).unsqueeze(-1)).squeeze(-1)
    return tuple(float(x) for x in lp.tolist())


class LoopGuard:
    """Ends a generation stuck in a verbatim loop: once the same LOOP_WINDOW-token window has been sampled
    LOOP_REPEATS times, the generation stops as if it had reached its token cap (finish_reason "length", so every node
    treats it as cut off and closes the stage itself).

    Why: a small model that starts copying a passage or a citation can repeat it until the cap (hundreds of tokens,
    tens of seconds on a CPU) and the report shows the loop. Stopping is only an earlier stop: the kept tokens and
    their logprobs are exactly what was sampled, so a rollout stays a valid sample for the trainer. vLLM has no such
    rule; it only changes how long a looping in-process generation runs.
    """

    def __init__(self, window: int = LOOP_WINDOW, repeats: int = LOOP_REPEATS) -> None:
        self.window, self.repeats = window, repeats
        self._seen: dict[tuple[int, ...], int] = {}

    def looping(self, ids: Sequence[int]) -> bool:
        """Call after each new token with all tokens so far; True once the latest window was seen `repeats` times."""
        if len(ids) < self.window:
            return False
        key = tuple(ids[-self.window:])
        self._seen[key] = self._seen.get(key, 0) + 1
        return self._seen[key] >= self.repeats


def earliest_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """The stop string that occurs first in `text` (ties: the one listed first), with its position."""
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    return best
