"""The OpenAI legacy-completions shapes both servers speak: `generate` argument checks, choice and logprobs parsing,
and building the normalised `Generation`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from agent.errors import PolicyUnavailable
from agent.protocols import Generation
from store.records import FinishReason, TokenSource

_FINISH_REASONS: Mapping[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "length",  # vLLM's repetition detector cut it: a limit, not the model's own end
    "error": "error",
}


def check_generate_args(stop: Sequence[str], max_tokens: int, temperature: float) -> tuple[str, ...]:
    """Validate the arguments every `PolicyClient.generate` takes; return the stop strings as a tuple.

    Raises:
        TypeError: `stop` is a single string. ValueError: an empty stop string, `max_tokens` < 1, or a negative or
            non-finite temperature.
    """
    if isinstance(stop, str):
        raise TypeError("stop must be a sequence of strings, not a single string")
    stops = tuple(stop)
    if any(not isinstance(s, str) or not s for s in stops):
        raise ValueError("stop strings must be non-empty strings")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, not {max_tokens!r}")
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, not {temperature!r}")
    return stops


def smallest_spelling_prefix(pieces: Sequence[str], text: str) -> int | None:
    """The smallest k with `"".join(pieces[:k]) == text`, or None when no prefix of the pieces spells `text`."""
    if text == "":
        return 0
    acc = ""
    for k, piece in enumerate(pieces, start=1):
        acc += piece
        if acc == text:
            return k
        if len(acc) >= len(text):
            return None
    return None


def parse_finish_reason(value: object) -> FinishReason:
    return _FINISH_REASONS.get(str(value), "error") if value is not None else "error"


def drop_suffix(text: str, suffix: str) -> str:
    return text[: len(text) - len(suffix)] if suffix and text.endswith(suffix) else text


def first_choice(data: Mapping[str, Any]) -> Mapping[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise PolicyUnavailable("completion response has no choices")
    return choices[0]


def legacy_logprobs(obj: object) -> tuple[list[str] | None, list[float] | None]:
    """`tokens` and `token_logprobs` of an OpenAI legacy logprobs object, or (None, None) when unusable."""
    if not isinstance(obj, dict):
        return None, None
    tokens = obj.get("tokens")
    values = obj.get("token_logprobs")
    if not isinstance(tokens, list) or not isinstance(values, list) or len(tokens) != len(values):
        return None, None
    if not all(isinstance(t, str) for t in tokens) or not all(isinstance(v, (int, float)) for v in values):
        return None, None
    return list(tokens), [float(v) for v in values]


def make_generation(
    text: str,
    ids: Sequence[int],
    logprobs: Sequence[float],
    finish: FinishReason,
    stop: str | None,
    version: str,
    source: TokenSource,
) -> Generation:
    return Generation(
        text=text,
        token_ids=tuple(ids),
        logprobs=tuple(logprobs) if len(logprobs) == len(ids) else (),
        finish_reason=finish,
        stop=stop,
        policy_version=version,
        token_source=source,
    )
