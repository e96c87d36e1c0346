"""`PinnedPolicy`: one session's view of a policy client that several sessions share, pinned to one version.

Why (issue 49, adapters per team): the shared client's current version is global (`set_model` on the HTTP clients,
`aload_adapter` on the in-process engine). With sessions of several teams running at once, switching it for one
session would let another session's tokens be sampled from the wrong adapter. A view never switches it: it passes its
`Served` with every generate call, and the shared client answers that one request by that version (HTTP: sent as
`model`; in-process: swapped in under the model lock for the call, `learning.engines.client.EmbeddedClient`). The
view is what goes into `AgentDeps.policy` for one session; the graph cannot tell it from a client.

What it delegates: `render_prompt` and `tokenize` go to the shared client unchanged (every version of one policy
shares the base model's tokenizer and chat template), and so do a few read-only attributes (`tokenizer`, `decode`,
`eos_token_ids`, ...). What it refuses, with an AttributeError that says why: whatever changes the shared client's
version (`set_model`, `aload_adapter`, ...), and calls that would run unpinned on whatever version happens to be
loaded (`generate_group`, `score`), so that `getattr(policy, "generate_group", None)` is None and callers fall back to
pinned `generate` calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from agent.protocols import ChatMessage, Generation, PromptContext, Served, SharedPolicyClient

# Read-only attributes of the shared client a session may look at; none of them depends on the loaded version.
_DELEGATED = frozenset({"tokenizer", "decode", "eos_token_ids", "engine", "threads", "busy", "replica_urls", "health"})
# What would change the version the shared client serves to every other session.
_MUTATING = frozenset({"set_model", "aload_adapter", "aunload_adapter", "load_adapter", "unload_adapter",
                       "load_lora_adapter", "unload_lora_adapter", "ensure_adapter", "sleep", "wake_up"})
# What the in-process engines answer with whatever version is loaded: unpinned, so not offered by a view.
_UNPINNED = frozenset({"generate_group", "score"})


def pinnable(client: object) -> bool:
    """Whether a client can answer one request by a given version (its `generate` takes `served`)."""
    try:
        return "served" in inspect.signature(client.generate).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):  # no generate, or no signature to read: not shown to take it
        return False


class PinnedPolicy:
    """A `PolicyClient` for one session: every request of it is answered by `served`'s version (module docstring).

    `model` is the served model name only when the shared client has one (the HTTP clients): the in-process clients
    have none, and `agent.sequence.policy_model` reads a missing `model` as "embedded" for spans and prices.
    """

    __slots__ = ("_inner", "_served")

    def __init__(self, inner: SharedPolicyClient, served: Served) -> None:
        """Wrap `inner` (not copied, not owned) for one session served by `served`.

        Raises:
            TypeError: `inner.generate` takes no `served` argument, so it could not be pinned (a client from
                before issue 49, or a test double); failing here beats answering by the wrong version later.
        """
        if not pinnable(inner):
            raise TypeError(f"{type(inner).__name__}.generate takes no `served` argument: it cannot be pinned to a "
                            "version per request")
        self._inner = inner
        self._served = served

    def __repr__(self) -> str:
        return f"PinnedPolicy({self._served.version!r} on {type(self._inner).__name__})"

    @property
    def served(self) -> Served:
        """The version every request of this view is answered by."""
        return self._served

    @property
    def inner(self) -> SharedPolicyClient:
        """The shared client (owned by whoever built it, not by this view)."""
        return self._inner

    @property
    def policy_version(self) -> str:
        """The registry version recorded on the session: the pinned one, whatever the shared client serves now."""
        return self._served.version

    @property
    def model(self) -> str:
        """The name the server is sent as `model` for this session; absent (AttributeError) for in-process clients."""
        if not hasattr(self._inner, "model"):
            raise AttributeError("model")  # `__getattr__` is asked next and says why
        return self._served.model

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:
        """The shared client's chat template: every version shares the base model's."""
        return await self._inner.render_prompt(messages)

    async def tokenize(self, text: str) -> tuple[int, ...]:
        """The shared client's tokenizer: every version shares the base model's."""
        return await self._inner.tokenize(text)

    async def generate(
        self,
        context: PromptContext,
        *,
        stop: Sequence[str],
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
    ) -> Generation:
        """Sample on the shared client, answered by the pinned version (`SharedPolicyClient.generate`).

        Raises:
            As the shared client's `generate`; an in-process engine that cannot load the pinned adapter raises
            `AdapterLoadError` and keeps the weights it had.
        """
        return await self._inner.generate(context, stop=stop, max_tokens=max_tokens, temperature=temperature,
                                          seed=seed, served=self._served)

    async def aclose(self) -> None:
        """Nothing: the shared client serves other sessions and is closed by its owner (the service), not a view."""

    def __getattr__(self, name: str) -> Any:
        """Read-only attributes of the shared client; a clear AttributeError for what a view must not offer."""
        if name.startswith("_"):
            raise AttributeError(name)  # never reached for the slots once set; guards copies made without __init__
        if name == "model":  # the property found no `model` on the shared client
            raise AttributeError(f"{type(self._inner).__name__} has no served model name (an in-process policy)")
        if name in _MUTATING:
            raise AttributeError(f"a PinnedPolicy cannot {name}: it would change the version the shared client "
                                 "serves to every session; do it on the shared client (its owner does), or pin "
                                 "another version with a new view")
        if name in _UNPINNED:
            raise AttributeError(f"a PinnedPolicy does not offer {name}: the shared client would answer it with "
                                 "whatever version is loaded, not the pinned one; use generate")
        if name in _DELEGATED:
            return getattr(self._inner, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (only {', '.join(sorted(_DELEGATED))} "
                             "are read from the shared client)")
