"""Running the swap probe (issue 63): read a fixed probe prompt on every engine and replica that is to serve a new
version, before and after the swap, score the new reading with the trainer, and refuse the swap unless
`learning.swap_probe.judge_swap` verifies it on each.

The order is the point: each target is read under the previous version first (pinned to it: vLLM keeps the previous
adapter loaded for a rollback; an in-process engine loads it back for the reading), then the caller's `swap` runs
(the real load: `ensure_adapter` on every replica, `aload_adapter` in process), then each target is read under the
new version, pinned to it as a session would be. Nothing else is loaded between the swap and the reading, so what is
verified is the swap that will serve.

A target that cannot answer (down, restarting, rate-limited) is retried with backoff until `deadline_s` after its
first try; then the swap fails with the reason. A swap is never passed unverified: any other failure fails it too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import PolicyRateLimited, PolicyTimeout, PolicyUnavailable
from agent.protocols import ChatMessage, PromptContext, Served
from learning.swap_probe import (
    ProbeDistances,
    ProbeReading,
    SwapNotVerified,
    describe,
    identical,
    judge_swap,
)

log = logging.getLogger(__name__)

PROBE_MESSAGES = (
    ChatMessage("system", "You are a helpful assistant."),
    ChatMessage("user", "Write a detailed essay about the history of the printing press in Europe."),
)  # a prompt every version answers at length, so the probe has its tokens (EOS comes late)
PROBE_SEED = 20_263
PROBE_TEMPERATURE = 1.0  # the raw distribution: vLLM's raw and processed log-probs agree there, as the trainer's
_TRANSIENT = (PolicyUnavailable, PolicyTimeout, PolicyRateLimited)  # the engine may answer later: retried
_ENGINES = {"EmbeddedLlamaCppClient": "llama.cpp", "TransformersPolicyClient": "torch", "VLLMPolicyClient": "vllm"}


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """One place a version serves from: an engine and, for vLLM, one replica."""

    engine: str  # "vllm", "llama.cpp", "torch"
    replica: str  # the replica's URL without credentials, or "in-process"
    client: Any  # render_prompt, and generate(..., served=...)

    @property
    def label(self) -> str:
        return f"{self.engine} {self.replica}"


@dataclass(frozen=True, slots=True)
class ProbeVersion:
    """A version as the probe addresses it."""

    name: str  # the registry's name, for messages
    served: Served  # how an engine is told to serve it (pinned per request)
    adapter: Path | None  # the trainer's adapter folder for it; None = the base weights


def probe_targets(policy: Any) -> list[ProbeTarget]:
    """Every replica of a `ReplicaSet` (`replica_clients`), else the one client (vLLM: its server; an in-process
    engine: "in-process")."""
    replicas = getattr(policy, "replica_clients", None)
    if callable(replicas):
        return [ProbeTarget("vllm", url, client) for url, client in replicas()]
    engine = _ENGINES.get(type(policy).__name__, type(policy).__name__)
    replica = str(getattr(policy, "server_url", "")) or "in-process"
    return [ProbeTarget(engine, replica, policy)]


class TrainerReference:
    """The trainer's log-probs of token sequences for a version: the base model in the trainer's dtype, with the
    version's PEFT adapter loaded as training loads it (`learning.model.load_trainable`), scored by the trainer's own
    `learning.sequences.response_logprobs` at temperature 1. One model is kept, for the last adapter asked for (a
    probe asks for one version); it is loaded again when the adapter's files change."""

    def __init__(self, model_dir: Path | str | Callable[[], Path], dtype: str = "float32") -> None:
        """`model_dir` is the base model's folder, or a function that finds it (called once, when a log-prob is first
        asked for: a probe that fails before scoring never converts or loads a model)."""
        self._model_dir = model_dir if callable(model_dir) else Path(model_dir)
        self._dtype = dtype
        self._lock = threading.Lock()
        self._key: tuple[Any, ...] | None = None
        self._model: Any = None
        self._pad_id = 0

    def logprobs(self, adapter: Path | None, prompt_ids: Sequence[int], token_ids: Sequence[int]
                 ) -> tuple[float, ...]:
        """log π(token | prefix) of each of `token_ids` after `prompt_ids`, for `adapter` (None: the base weights).

        Blocking (torch); call it in a worker thread.
        """
        import torch

        from learning.sequences import TrainSequence, collate, response_logprobs

        n = len(token_ids)
        if n == 0:
            return ()
        with self._lock:
            model = self._load(adapter)
            seq = TrainSequence(tuple(int(i) for i in prompt_ids), tuple(int(i) for i in token_ids), (1,) * n,
                                (0,) * n, (0.0,) * n)
            with torch.no_grad():
                lp = response_logprobs(model, collate([seq], self._pad_id), temperature=1.0)
            return tuple(float(x) for x in lp[0, :n])

    def close(self) -> None:
        """Free the model."""
        with self._lock:
            self._model, self._key = None, None

    def _load(self, adapter: Path | None) -> Any:
        key = (None,) if adapter is None else _adapter_key(Path(adapter))
        if self._model is None or key != self._key:
            from learning.model import LoraSettings, load_trainable

            self._model = None  # one model at a time
            if callable(self._model_dir):
                self._model_dir = Path(self._model_dir())
            model, tokenizer = load_trainable(self._model_dir, lora=LoraSettings() if adapter is not None else None,
                                              dtype=self._dtype, adapter=Path(adapter) if adapter else None,
                                              gradient_checkpointing=False)
            model.eval()
            self._model, self._key = model, key
            self._pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        return self._model


def _adapter_key(folder: Path) -> tuple[Any, ...]:
    """The adapter folder and its weights file's identity: a folder whose files were replaced is loaded again."""
    try:
        st = (folder / "adapter_model.safetensors").stat()
        return str(folder.resolve()), st.st_size, st.st_mtime_ns
    except OSError:
        return (str(folder),)


async def verify_swap(
    targets: Sequence[ProbeTarget],
    new: ProbeVersion,
    previous: ProbeVersion,
    reference: TrainerReference,
    *,
    swap: Callable[[], Awaitable[object]] | None = None,
    tolerance: float,
    deadline_s: float,
    tokens: int,
    backoff_s: float = 0.5,
) -> dict[str, ProbeDistances]:
    """Read every target under `previous`, run `swap`, read every target under `new`, and judge each.

    Returns:
        The distances per target (`ProbeTarget.label`), for the record.

    Raises:
        SwapNotVerified: a target failed the probe (the message names the engine, the replica and both distances),
            or could not be read before its deadline (the reason given); `swap` has run when the failure is after it.
        Whatever `swap` raises (the caller's load failed): nothing is judged.
    """
    if not targets:
        raise SwapNotVerified(f"{new.name}: no engine to probe the swap on", version=new.name, engine="?",
                              replica="?")
    before = [await _read(t, previous, new.name, tokens=tokens, deadline_s=deadline_s, backoff_s=backoff_s)
              for t in targets]
    if swap is not None:
        await swap()
    out: dict[str, ProbeDistances] = {}
    for target, (_, prev) in zip(targets, before, strict=True):
        ctx, reading = await _read(target, new, new.name, tokens=tokens, deadline_s=deadline_s, backoff_s=backoff_s,
                                   after_swap=True)
        try:
            trainer = await asyncio.to_thread(reference.logprobs, new.adapter, ctx.token_ids, reading.token_ids)
            # Only identical readings need the trainer's view of the previous version (is the update one an engine
            # can show?); scoring it every time would load the other model once more per target.
            trainer_prev = await asyncio.to_thread(reference.logprobs, previous.adapter, ctx.token_ids,
                                                   reading.token_ids) if identical(reading, prev) else None
        except Exception as exc:  # noqa: BLE001 - no reference, no verification: the swap fails, saying why
            raise SwapNotVerified(
                f"the swap to {new.name} is not verified on {target.engine} replica {target.replica}: the trainer "
                f"could not score the probe for {new.name} ({type(exc).__name__}: {exc}). {new.name} is not promoted "
                "and stays out of service", version=new.name, engine=target.engine, replica=target.replica,
                after_swap=True) from exc
        verdict = judge_swap(reading, trainer, prev, tolerance, trainer_prev)
        if not verdict.verified:
            message = (f"the swap to {new.name} is not verified on {target.engine} replica {target.replica}: "
                       f"{verdict.reason}; {describe(verdict.distances, new.name, previous.name, tolerance)}. "
                       f"{new.name} is not promoted and stays out of service")
            log.error("%s", message)
            raise SwapNotVerified(message, version=new.name, engine=target.engine, replica=target.replica,
                                  distances=verdict.distances, after_swap=True)
        log.info("swap to %s verified on %s: %s", new.name, target.label,
                 describe(verdict.distances, new.name, previous.name, tolerance))
        out[target.label] = verdict.distances
    return out


async def _read(target: ProbeTarget, version: ProbeVersion, swapping_to: str, *, tokens: int, deadline_s: float,
                backoff_s: float, after_swap: bool = False) -> tuple[PromptContext, ProbeReading]:
    """The probe prompt sampled on `target` pinned to `version`; transient failures retried until the deadline."""
    deadline = time.monotonic() + deadline_s
    attempt = 0
    while True:
        try:
            ctx = await target.client.render_prompt(list(PROBE_MESSAGES))
            gen = await target.client.generate(ctx, stop=[], max_tokens=tokens, temperature=PROBE_TEMPERATURE,
                                               seed=PROBE_SEED, served=version.served)
            return ctx, ProbeReading(tuple(gen.token_ids), tuple(gen.logprobs))
        except _TRANSIENT as exc:
            delay = min(backoff_s * 2 ** attempt, 5.0)
            attempt += 1
            if time.monotonic() + delay > deadline:
                raise _not_run(target, version, swapping_to,
                               f"it could not run within {deadline_s:g}s ({attempt} tries): {type(exc).__name__}: "
                               f"{exc}", after_swap) from exc
            log.warning("swap probe on %s (%s) failed (%s); retrying in %.1fs", target.label, version.name, exc,
                        delay)
            await asyncio.sleep(delay)
        except Exception as exc:  # noqa: BLE001 - never passed unverified: any other failure fails the swap
            raise _not_run(target, version, swapping_to, f"{type(exc).__name__}: {exc}", after_swap) from exc


def _not_run(target: ProbeTarget, version: ProbeVersion, swapping_to: str, why: str,
             after_swap: bool) -> SwapNotVerified:
    return SwapNotVerified(
        f"the swap to {swapping_to} is not verified on {target.engine} replica {target.replica}: the probe under "
        f"{version.name} failed: {why}. {swapping_to} is not promoted and stays out of service",
        version=swapping_to, engine=target.engine, replica=target.replica, after_swap=after_swap)
