"""Training sequences: prompt + response token ids with per-token mask and advantage, padded into batches, and the
per-token log-probabilities a causal LM assigns to the response.

A research trajectory becomes one sequence: the rendered prompt, then the whole assistant sequence (sampled turns,
forced tags, tool output). Only sampled tokens with server-exact ids are trainable (METHOD D6); tool output, forced
tags and re-tokenized text (llama.cpp) are context. A reflection candidate is the reflection prompt plus the sampled
candidate tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learning.head_loss import linear_logprobs, split_head
from store.records import STAGES, Trajectory, Turn


@dataclass(frozen=True, slots=True)
class TrainSequence:
    """One sequence to train on.

    `mask`, `stages` and `advantages` align with `response_ids`; `stages` is the stage index 0..3 or -1 (no
    gradient); `advantages` is 0 wherever the mask is 0.
    """

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    mask: tuple[int, ...]
    stages: tuple[int, ...]
    advantages: tuple[float, ...]
    sampled_logprobs: tuple[float, ...] = ()  # what the sampler reported (for the mismatch metric), may be empty
    kind: str = "task"  # "task" or "reflection"

    def __post_init__(self) -> None:
        n = len(self.response_ids)
        if not (len(self.mask) == len(self.stages) == len(self.advantages) == n):
            raise ValueError("mask, stages and advantages must align with response_ids")
        if not self.prompt_ids:
            raise ValueError("a training sequence needs a non-empty prompt")

    @property
    def n_trainable(self) -> int:
        """Tokens that get a gradient."""
        return sum(self.mask)


def trajectory_stages_and_mask(traj: Trajectory) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """Per-token stage index (-1 = no gradient), trainable mask and sampler logprobs (NaN where none) of a trajectory.

    Re-tokenized turns are not trainable: their ids are not the sampled ones (STYLE.md §3).
    """
    stages: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for t in traj.turns:
        trainable = _trains(t)
        stage = STAGES.index(t.stage) if trainable else -1
        stages += [stage] * len(t.token_ids)
        mask += [1 if trainable else 0] * len(t.token_ids)
        lps = list(t.logprobs) if len(t.logprobs) == len(t.token_ids) else [float("nan")] * len(t.token_ids)
        logprobs += lps
    return tuple(stages), tuple(mask), tuple(logprobs)


def _trains(turn: Turn) -> bool:
    """Whether a turn's tokens get a gradient: sampled, with the sampler's own ids (not re-tokenized text)."""
    return turn.trainable and turn.token_source != "retokenized"


def has_bad_logprobs(traj: Trajectory) -> bool:
    """Whether the sampler reported a NaN/inf log-prob for a token that would be trained (never train on that)."""
    return any(_trains(t) and len(t.logprobs) == len(t.token_ids) and not all(math.isfinite(lp) for lp in t.logprobs)
               for t in traj.turns)


@dataclass(frozen=True, slots=True)
class Batch:
    """Right-padded tensors for a micro-batch of sequences.

    input_ids (B, L), attention_mask (B, L); response positions are described in response-token coordinates:
    targets (B, T), mask (B, T), advantages (B, T), where T is the longest response and position t of row b is the
    token at input index prompt_len[b] + t.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lens: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    sampler_logprobs: torch.Tensor | None = None  # (B, T) what the sampler reported, NaN where it reported nothing

    @property
    def n_tokens(self) -> int:
        """All non-padding tokens (prompt + response), the throughput unit."""
        return int(self.attention_mask.sum().item())


def collate(seqs: Sequence[TrainSequence], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    """Pad sequences on the right into one Batch on `device` (the model's)."""
    if not seqs:
        raise ValueError("cannot collate an empty micro-batch")
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in seqs]
    width, t_max = max(lengths), max(max(len(s.response_ids) for s in seqs), 1)
    b = len(seqs)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)  # (B, L)
    attention = torch.zeros((b, width), dtype=torch.long)  # (B, L)
    targets = torch.zeros((b, t_max), dtype=torch.long)  # (B, T)
    mask = torch.zeros((b, t_max), dtype=torch.float32)  # (B, T)
    adv = torch.zeros((b, t_max), dtype=torch.float32)  # (B, T)
    sampler = torch.full((b, t_max), float("nan"), dtype=torch.float32)  # (B, T)
    for i, s in enumerate(seqs):
        ids = torch.tensor(s.prompt_ids + s.response_ids, dtype=torch.long)
        input_ids[i, : len(ids)] = ids
        attention[i, : len(ids)] = 1
        n = len(s.response_ids)
        if n:
            targets[i, :n] = torch.tensor(s.response_ids, dtype=torch.long)
            mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
            adv[i, :n] = torch.tensor(s.advantages, dtype=torch.float32)
            if len(s.sampled_logprobs) == n:
                sampler[i, :n] = torch.tensor(s.sampled_logprobs, dtype=torch.float32)
    prompt_lens = torch.tensor([len(s.prompt_ids) for s in seqs], dtype=torch.long)  # (B,)
    return Batch(*(t.to(device) for t in (input_ids, attention, prompt_lens, targets, mask, adv, sampler)))


def response_logprobs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """log π(token | prefix) for every response position, (B, T); padding positions hold garbage the mask removes.

    The logits at input index j predict token j + 1, so response token t of row b (input index p_b + t) is read from
    logits index p_b + t - 1. On one process with a plain head (`learning.head_loss.split_head`) the decoder runs
    alone and only the response positions' hidden states go through `linear_logprobs`, which never holds the
    (B, T, vocabulary) logits (at 8B shape they made the update's peak memory ×1.9 TRL's). Otherwise the model's own
    forward, with only the positions from the shortest prompt's end onwards through the LM head (`logits_to_keep`).
    """
    b, t = batch.targets.shape
    split = split_head(model)
    if split is not None:
        decoder, head = split
        hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         use_cache=False).last_hidden_state  # (B, L, D)
        positions = batch.prompt_lens.unsqueeze(1) - 1 + torch.arange(t, device=hidden.device).unsqueeze(0)
        positions = positions.clamp(max=hidden.shape[1] - 1)  # (B, T)
        picked = hidden.gather(1, positions.unsqueeze(-1).expand(b, t, hidden.shape[-1]))  # (B, T, D)
        flat = linear_logprobs(picked.reshape(b * t, -1), head.weight, batch.targets.reshape(-1), temperature)
        return flat.view(b, t).float()
    width = batch.input_ids.shape[1]
    first = int(batch.prompt_lens.min()) - 1  # the earliest logits position any response needs
    keep = width - first
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, logits_to_keep=keep)
    logits = out.logits  # (B, keep, V): input positions first .. width-1
    positions = batch.prompt_lens.unsqueeze(1) - 1 - first + torch.arange(t, device=logits.device).unsqueeze(0)
    positions = positions.clamp(max=logits.shape[1] - 1)  # (B, T)
    picked = logits.gather(1, positions.unsqueeze(-1).expand(b, t, logits.shape[-1]))  # (B, T, V)
    if picked.dtype != torch.float32:
        picked = picked.float()
    if temperature != 1.0:
        picked = picked / temperature
    return torch.log_softmax(picked, dim=-1).gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)  # (B, T)


def micro_batches(seqs: Sequence[TrainSequence], token_budget: int) -> list[list[TrainSequence]]:
    """Split sequences (longest first) into micro-batches whose padded size stays within `token_budget` tokens."""
    order = sorted(seqs, key=lambda s: len(s.prompt_ids) + len(s.response_ids), reverse=True)
    out: list[list[TrainSequence]] = []
    current: list[TrainSequence] = []
    width = 0
    for s in order:
        n = len(s.prompt_ids) + len(s.response_ids)
        if current and max(width, n) * (len(current) + 1) > token_budget:
            out.append(current)
            current, width = [], 0
        current.append(s)
        width = max(width, n)
    if current:
        out.append(current)
    return out
