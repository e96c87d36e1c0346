"""Growing the one assistant token sequence: sampled, forced and tool-output turns (STYLE §3).

Every turn is handed to the recorder the moment it exists, so a crash never loses what was already generated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agent import telemetry
from agent.deps import AgentDeps
from agent.errors import BudgetExceeded, ContextTooLong
from agent.protocols import Generation, PromptContext
from store.records import Stage, Turn, TurnKind

MIN_NEW_TOKENS = 16  # below this a stage cannot say anything useful; the run fails as "context too long"


class SequenceWriter:
    """Appends turns for one node call on top of the turns already in the state."""

    def __init__(self, deps: AgentDeps, prompt: PromptContext, turns: Sequence[Turn]) -> None:
        self.deps = deps
        self.prompt = prompt
        self.previous = list(turns)
        self.new: list[Turn] = []
        self.last_prompt_tokens = 0  # context tokens the last `sample` call read (its prompt tokens)

    @property
    def turns(self) -> list[Turn]:
        """Every turn so far, old and new."""
        return self.previous + self.new

    def context(self) -> PromptContext:
        """Prompt plus the whole assistant sequence so far."""
        turns = self.turns
        return PromptContext(
            text=self.prompt.text + "".join(t.text for t in turns),
            token_ids=self.prompt.token_ids + tuple(i for t in turns for i in t.token_ids),
        )

    def tokens_used(self) -> int:
        """Prompt tokens plus assistant tokens."""
        return len(self.prompt.token_ids) + sum(len(t.token_ids) for t in self.turns)

    async def sample(self, stage: Stage, stop: Sequence[str], cap: int) -> Generation:
        """Sample a continuation, bounded by the stage cap, the context window and the wall clock."""
        room = self.deps.options.context_tokens - self.tokens_used()
        max_tokens = min(cap, room)
        if max_tokens < MIN_NEW_TOKENS:
            raise ContextTooLong(
                f"only {room} tokens of the {self.deps.options.context_tokens}-token context are left for {stage}"
            )
        remaining = self.deps.remaining()
        if remaining <= 0:
            raise BudgetExceeded(f"wall-clock limit of {self.deps.options.wall_clock_s:.0f} s reached before {stage}")
        self.deps.recorder.event("generating", {"stage": stage, "max_tokens": max_tokens})
        self.deps.generate_calls += 1
        calls = self.deps.generate_calls
        context = self.context()
        self.last_prompt_tokens = len(context.token_ids)
        with telemetry.policy_call(stage=stage, model=policy_model(self.deps), input_tokens=self.last_prompt_tokens,
                                   max_tokens=max_tokens, temperature=self.deps.options.temperature,
                                   policy_version=self.deps.policy.policy_version) as traced:
            try:
                gen = await asyncio.wait_for(
                    self.deps.policy.generate(
                        context,
                        stop=list(stop),
                        max_tokens=max_tokens,
                        temperature=self.deps.options.temperature,
                        # One seed per call (seed + calls so far): the same seed on every turn would replay one
                        # random stream at each stage; the run stays reproducible.
                        seed=None if self.deps.options.seed is None else self.deps.options.seed + calls,
                    ),
                    timeout=remaining,
                )
            except TimeoutError as exc:
                raise BudgetExceeded(
                    f"wall-clock limit of {self.deps.options.wall_clock_s:.0f} s reached while generating {stage}"
                ) from exc
            traced.finish(output_tokens=len(gen.token_ids), finish_reason=gen.finish_reason)
        return gen

    def _append(self, turn: Turn) -> Turn:
        self.new.append(turn)
        self.deps.recorder.turn(turn)
        return turn

    def keep(self, stage: Stage, gen: Generation) -> Turn | None:
        """Record a sampled generation (nothing is recorded for an empty one), with the prompt tokens of the call
        that sampled it: the last `sample` of this writer (None when this writer sampled nothing, which no node
        does; a real call always reads at least the prompt)."""
        if not gen.token_ids and not gen.text:
            return None
        return self._append(
            Turn(
                stage=stage,
                kind="sampled",
                text=gen.text,
                token_ids=gen.token_ids,
                logprobs=gen.logprobs,
                policy_version=gen.policy_version,
                prompt_sha=self.deps.prompt_sha,
                token_source=gen.token_source,
                finish_reason=gen.finish_reason,
                prompt_tokens=self.last_prompt_tokens or None,
            )
        )

    async def tokenize(self, text: str) -> tuple[int, ...]:
        """Tokenize inserted text with the policy's tokenizer, within the wall-clock budget."""
        remaining = self.deps.remaining()
        if remaining <= 0:
            raise BudgetExceeded(f"wall-clock limit of {self.deps.options.wall_clock_s:.0f} s reached")
        try:
            return tuple(await asyncio.wait_for(self.deps.policy.tokenize(text), timeout=remaining))
        except TimeoutError as exc:
            raise BudgetExceeded(f"wall-clock limit of {self.deps.options.wall_clock_s:.0f} s reached") from exc

    async def insert(self, stage: Stage, text: str, kind: TurnKind = "forced") -> Turn:
        """Record text the graph inserts itself (a forced tag or a tool output); never trained."""
        return self.insert_tokenized(stage, text, await self.tokenize(text), kind)

    def insert_tokenized(self, stage: Stage, text: str, ids: tuple[int, ...], kind: TurnKind = "forced") -> Turn:
        """Record inserted text whose token ids are already known."""
        return self._append(
            Turn(
                stage=stage,
                kind=kind,
                text=text,
                token_ids=ids,
                policy_version=self.deps.policy.policy_version,
                prompt_sha=self.deps.prompt_sha,
                token_source="tokenizer",
            )
        )

    async def keep_closed(self, stage: Stage, gen: Generation, closing: str) -> Turn | None:
        """Record a sampled turn that stopped at `closing`; insert the tag if the server dropped it."""
        turn = self.keep(stage, gen)
        # vLLM/in-process keep the stop string's tokens (possibly followed by a few characters of the same token);
        # the llama.cpp server drops it.
        if closing not in gen.text[-(len(closing) + 8) :]:
            await self.insert(stage, closing)
        return turn


def policy_model(deps: AgentDeps) -> str:
    """The served model's name (endpoint policies), or "embedded" for the in-process one: spans and prices use it."""
    model = getattr(deps.policy, "model", None)
    return model if isinstance(model, str) and model else "embedded"


def has_sampled(turns: Sequence[Turn], stage: Stage) -> bool:
    """Whether the stage has any sampled (non-empty) turn."""
    return any(t.stage == stage and t.kind == "sampled" and t.text.strip() for t in turns)
