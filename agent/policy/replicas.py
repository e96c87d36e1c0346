"""`ReplicaSet`: one policy served by several vLLM replicas (the same base model, tokenizer and served name on each),
behind the same `PolicyClient` protocol as one `VLLMPolicyClient`.

Why it is shaped this way:

* **Serving spreads sessions, not turns.** Every turn of a session re-sends the whole token sequence, and vLLM's
  prefix cache lives in each replica. So a session stays on the replica that rendered its prompt: `render_prompt`
  picks the next replica round-robin and pins it in a context variable; the graph's later requests (which run in
  that task or in tasks copied from it) start from the pinned replica. Calls made outside a pinned context are
  round-robin per call. Any replica can answer any request (the token ids travel with it), so the pin is only a
  cache hint, never a correctness condition.
* **Failover before anything was returned.** A request that fails on a replica as a whole (connection refused,
  5xx, timeout, 429, or 404 because that replica does not serve the requested adapter and could not be given it
  again: each replica's client first loads an adapter it lost in a restart from its folder, `VLLMPolicyClient`) is
  sent to the next replica; nothing the caller received is ever re-sampled, since a
  generation is returned whole or not at all. The replica that failed is *cooled down*: tried last, not skipped,
  for `cooldown_s`, so a replica that comes back is used again without a health-check loop, and a set whose
  replicas are all cooling down still tries them all. Each replica's own client does not retry (`max_retries=0`):
  the set retries, on another replica first, with `max_retries` rounds over all of them and a jittered backoff
  between rounds. Errors that would fail on any replica (a 400, `ContextTooLong`, bad arguments) are raised at once.
* **Adapters are all or nothing.** Promotion must not leave some replicas serving a version the others lack, so
  `ensure_adapter` loads on every replica concurrently, checks that each one's `/v1/models` lists the adapter from
  the same folder, and if any replica fails it unloads the adapter again where this call loaded it (never where it
  was already served: a rollback target stays loaded) and raises `ReplicaError` naming each failed replica. The
  caller flips `live` only after it returns.
* **Names without secrets.** Replicas are named by their URL without user:password, query or fragment
  (`redact_url`); the API key and URL credentials are blanked from every message and log line this module writes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from os import PathLike, fspath
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote, urlsplit

from agent.errors import (
    PolicyError,
    PolicyRateLimited,
    PolicyRequestError,
    PolicyTimeout,
    PolicyUnavailable,
    ReplicaError,
)
from agent.policy.vllm import VLLM_RUNTIME_LORA_ENV, VLLMPolicyClient
from agent.protocols import ChatMessage, Generation, PromptContext, Served
from agent.retry import jittered_backoff

if TYPE_CHECKING:
    from agent.config import AgentConfig

log = logging.getLogger("agent.policy")

T = TypeVar("T")

# Failures after which the same request may succeed on another replica (and, later, on this one).
_TRANSIENT = (PolicyUnavailable, PolicyTimeout, PolicyRateLimited)

# (id of the ReplicaSet, index of the replica) a session's requests start from; set by `render_prompt`.
_PINNED: ContextVar[tuple[int, int] | None] = ContextVar("rubricem_policy_replica", default=None)
_SET_IDS = itertools.count(1)


def redact_url(url: str) -> str:
    """`scheme://host[:port][/path]` of a URL: no user:password, query or fragment (safe in logs and errors)."""
    parts = urlsplit(url.strip())
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"


def _url_secrets(url: str) -> list[str]:
    """The credentials written into a URL (`user:password@`), as written and decoded."""
    userinfo = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
    password = userinfo.partition(":")[2]
    return [s for s in {userinfo, password, unquote(password)} if s]


@dataclass
class _Replica:
    """One replica: its safe name, its client and its cool-down."""

    url: str  # redact_url of the configured URL
    raw_url: str
    client: VLLMPolicyClient
    down_until: float = 0.0  # time.monotonic() until which it is tried last
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class _LoadOutcome:
    index: int
    loaded: bool = False  # this call loaded the adapter there
    error: PolicyError | None = None
    maybe_loaded: bool = False  # the load may have happened although it failed (answered 200 then unlisted; timeout)


class ReplicaSet:
    """`PolicyClient` over several vLLM replicas of one policy; see the module docstring for the design.

    Besides the protocol it has what the promoter uses: `ensure_adapter` (all or nothing, verified),
    `unload_lora_adapter`, `list_models` (what every replica serves), `listed` (per replica), `aload_adapter`,
    `aunload_adapter`, `set_model`, and `sleep`/`wake_up`/`is_sleeping` applied to every replica.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 4,
        cooldown_s: float = 30.0,
        backoff_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        """One client per replica (no request is made).

        Args:
            base_urls: the replicas' server roots (no /v1), each once.
            model: the served base model or adapter alias sent as `model` (the same on every replica).
            api_key: sent to every replica as `Authorization: Bearer`; never logged.
            timeout_s: per-request timeout of each replica.
            max_retries: rounds over all replicas after the first, when every one failed transiently.
            cooldown_s: how long a replica that failed is tried last.
            backoff_s, backoff_max_s: jittered backoff between rounds.
        """
        if not base_urls:
            raise ValueError("a ReplicaSet needs at least one base URL")
        if cooldown_s <= 0 or max_retries < 0:
            raise ValueError("cooldown_s must be > 0 and max_retries >= 0")
        labels = [redact_url(u) for u in base_urls]
        if len(set(labels)) != len(labels):
            raise ValueError("each policy replica URL must be listed once")
        self._replicas = [
            _Replica(label, url, VLLMPolicyClient(url, model, api_key=api_key, timeout_s=timeout_s, max_retries=0,
                                                  backoff_s=backoff_s, backoff_max_s=backoff_max_s))
            for label, url in zip(labels, base_urls, strict=True)
        ]
        self._base = model
        self._model = model
        self._max_retries = int(max_retries)
        self._cooldown_s = float(cooldown_s)
        self._backoff_s = float(backoff_s)
        self._backoff_max_s = float(backoff_max_s)
        self._id = next(_SET_IDS)
        self._turn = itertools.count()
        secrets = [api_key or ""] + [s for u in base_urls for s in _url_secrets(u)]
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)  # longest first: no partial leftovers

    @classmethod
    def from_config(cls, config: AgentConfig) -> ReplicaSet:
        """A set over the agent settings' policy URLs (`policy_base_urls`)."""
        key = config.policy_api_key.get_secret_value() if config.policy_api_key is not None else None
        return cls(config.policy_urls, config.policy_model, api_key=key, timeout_s=config.policy_timeout_s,
                   max_retries=config.policy_max_retries, cooldown_s=config.policy_replica_cooldown_s)

    # -- what the set is serving ---------------------------------------------------------------------------------------

    @property
    def policy_version(self) -> str:
        """The alias sent as `model` on every replica; it names the version that answers the next request."""
        return self._model

    @property
    def model(self) -> str:
        """The served model/adapter alias."""
        return self._model

    @property
    def replica_urls(self) -> tuple[str, ...]:
        """The replicas, by URL without credentials, in configured order."""
        return tuple(r.url for r in self._replicas)

    def replica_clients(self) -> tuple[tuple[str, VLLMPolicyClient], ...]:
        """Each replica's URL (without credentials) and its own client, in configured order: for checks that must
        reach every replica (the swap probe, issue 63), never for serving (that is `generate`'s failover)."""
        return tuple((r.url, r.client) for r in self._replicas)

    def health(self) -> dict[str, str | None]:
        """Each replica's last failure while it is cooling down (tried last), None when it is healthy."""
        now = time.monotonic()
        return {r.url: (r.last_error if r.down_until > now else None) for r in self._replicas}

    def set_model(self, alias: str) -> None:
        """Switch the alias every replica is sent from the next request on (requests in flight keep theirs)."""
        if not alias:
            raise ValueError("alias must not be empty")
        for r in self._replicas:
            r.client.set_model(alias)
        self._model = alias

    # -- the PolicyClient protocol: spread and fail over ---------------------------------------------------------------

    async def render_prompt(self, messages: Sequence[ChatMessage]) -> PromptContext:
        """Render on the next replica round-robin; the session's later requests start from that replica."""
        return await self._serve("render_prompt", lambda c: c.render_prompt(messages), start=self._next(), pin=True)

    async def tokenize(self, text: str) -> tuple[int, ...]:
        """Tokenize on the session's replica (any replica: they share one tokenizer)."""
        return await self._serve("tokenize", lambda c: c.tokenize(text))

    async def generate(
        self,
        context: PromptContext,
        *,
        stop: Sequence[str],
        max_tokens: int,
        temperature: float,
        seed: int | None = None,
        served: Served | None = None,
    ) -> Generation:
        """Sample on the session's replica, or on another one if it fails before answering.

        `served` pins the request to one version on whichever replica answers it (`VLLMPolicyClient.generate`); a
        replica that lacks that adapter answers 404 and the request fails over like any other 404.

        Raises:
            As `VLLMPolicyClient.generate`; when no replica could answer, the error of the last failure, naming each
            replica and why it failed.
        """
        return await self._serve("generate", lambda c: c.generate(
            context, stop=stop, max_tokens=max_tokens, temperature=temperature, seed=seed, served=served))

    async def aclose(self) -> None:
        """Close every replica's connection pool. Idempotent."""
        await asyncio.gather(*(r.client.aclose() for r in self._replicas))

    def _next(self) -> int:
        return next(self._turn) % len(self._replicas)

    def _start(self) -> int:
        pinned = _PINNED.get()
        if pinned is not None and pinned[0] == self._id and pinned[1] < len(self._replicas):
            return pinned[1]
        return self._next()

    def _order(self, start: int) -> list[int]:
        """Replicas from `start` around the ring: healthy ones first, then those cooling down."""
        n = len(self._replicas)
        ring = [(start + k) % n for k in range(n)]
        now = time.monotonic()
        return ([i for i in ring if self._replicas[i].down_until <= now]
                + [i for i in ring if self._replicas[i].down_until > now])

    async def _serve(self, what: str, call: Callable[[VLLMPolicyClient], Awaitable[T]], *, start: int | None = None,
                     pin: bool = False) -> T:
        first = self._start() if start is None else start
        failures: dict[str, str] = {}
        last: PolicyError | None = None
        for attempt in range(self._max_retries + 1):
            transient = False
            for index in self._order(first):
                replica = self._replicas[index]
                try:
                    result = await call(replica.client)
                except _TRANSIENT as exc:
                    transient, last = True, exc
                except PolicyRequestError as exc:
                    if exc.status_code != 404:  # a bad request fails on every replica alike
                        raise
                    last = exc  # that replica does not serve the alias (restarted without its adapters?)
                else:
                    self._mark_up(replica)
                    if pin:
                        _PINNED.set((self._id, index))
                    return result
                failures[replica.url] = self._mark_down(replica, last)
            if not transient or attempt == self._max_retries:
                break
            delay = jittered_backoff(attempt, self._backoff_s, self._backoff_max_s)
            log.warning("policy %s failed on every replica; round %d in %.2fs", what, attempt + 2, delay)
            await asyncio.sleep(delay)
        assert last is not None
        detail = "; ".join(f"{url}: {reason}" for url, reason in failures.items())
        message = f"{what}: no policy replica could answer ({detail})"
        if isinstance(last, PolicyRequestError):
            raise PolicyRequestError(message, status_code=last.status_code)
        raise type(last)(message)

    def _mark_down(self, replica: _Replica, exc: BaseException | None) -> str:
        reason = self._scrub(f"{type(exc).__name__}: {exc}")
        if replica.down_until <= time.monotonic():
            log.warning("policy replica %s failed (%s); tried last for %.0fs", replica.url, reason, self._cooldown_s)
        replica.down_until = time.monotonic() + self._cooldown_s
        replica.last_error = reason
        return reason

    def _mark_up(self, replica: _Replica) -> None:
        if replica.last_error is not None:
            log.info("policy replica %s answers again", replica.url)
        replica.down_until, replica.last_error = 0.0, None

    def _scrub(self, text: str) -> str:
        for r in self._replicas:
            text = text.replace(r.raw_url.rstrip("/"), r.url)
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    # -- every replica: adapters, models, sleep ------------------------------------------------------------------------

    async def _each(self, call: Callable[[VLLMPolicyClient], Awaitable[T]]) -> tuple[dict[int, T], dict[int, str]]:
        """Run `call` on every replica concurrently: (results, reasons of the failures), by replica index."""

        async def one(index: int) -> tuple[int, Any, PolicyError | None]:
            try:
                return index, await call(self._replicas[index].client), None
            except PolicyError as exc:
                return index, None, exc

        done = await asyncio.gather(*(one(i) for i in range(len(self._replicas))))
        results = {i: value for i, value, exc in done if exc is None}
        failed = {i: self._failure(i, exc) for i, _, exc in done if exc is not None}
        return results, failed

    def _failure(self, index: int, exc: PolicyError) -> str:
        """Why replica `index` failed (scrubbed). Management failures never cool a replica down: a replica that could
        not load an adapter may serve perfectly well, and serving finds a dead one on its own."""
        return self._scrub(f"{type(exc).__name__}: {exc}")

    def _named(self, failed: Mapping[int, str]) -> dict[str, str]:
        return {self._replicas[i].url: reason for i, reason in sorted(failed.items())}

    async def listed(self) -> dict[str, list[str]]:
        """What each replica serves (`GET /v1/models`): base model first, then its adapters, by replica URL.

        Raises:
            ReplicaError: a replica could not be listed (named, with why).
        """
        results, failed = await self._each(lambda c: c.list_models())
        if failed:
            raise ReplicaError(f"GET /v1/models failed on {_describe(self._named(failed))}", self._named(failed))
        return {self._replicas[i].url: results[i] for i in sorted(results)}

    async def list_models(self) -> list[str]:
        """The names every replica serves, in the first replica's order.

        Raises:
            ReplicaError: a replica could not be listed.
        """
        per_replica = list((await self.listed()).values())
        return [m for m in per_replica[0] if all(m in names for names in per_replica[1:])]

    async def ensure_adapter(self, name: str, path: str | PathLike[str]) -> bool:
        """Serve adapter `name` from folder `path` on every replica, or on none: see the module docstring.

        A replica that already lists `name` from `path` is left as it is. Returns whether any replica loaded it now.

        Raises:
            ValueError: an empty name or path.
            ReplicaError: some replica could not load it or does not list it afterwards; `failures` names each one
                and why, `undone` the replicas it was unloaded from again. No replica serves it newly afterwards.
        """
        lora_path = fspath(path)
        if not name or not lora_path:
            raise ValueError("ensure_adapter needs a non-empty adapter name and path")
        outcomes = await asyncio.gather(*(self._load_one(i, name, lora_path) for i in range(len(self._replicas))))
        failed = {o.index: self._failure(o.index, o.error) for o in outcomes if o.error is not None}
        if not failed:
            loaded = [self._replicas[o.index].url for o in outcomes if o.loaded]
            if loaded:
                log.info("LoRA adapter %s loaded on %s", name, ", ".join(loaded))
            return bool(loaded)
        undo = [o.index for o in outcomes if o.loaded or o.maybe_loaded]
        undone, not_undone = await self._take_back(name, undo)
        failures = self._named(failed)
        message = f"adapter {name!r} could not be served by every policy replica: {_describe(failures)}"
        if undone:
            message += f"; unloaded it again from {', '.join(undone)}"
        if not_undone:
            message += f"; could not unload it from {_describe(not_undone)}"
        log.warning("%s", message)
        raise ReplicaError(message, failures, undone)

    async def _load_one(self, index: int, name: str, lora_path: str) -> _LoadOutcome:
        client = self._replicas[index].client
        step = "check"  # check → load → verify: how far this replica got
        try:
            if await client.served_root(name) == lora_path:
                client.remember_adapter(name, lora_path)  # loaded again from there if the replica restarts
                return _LoadOutcome(index)
            step = "load"
            try:
                await client.load_lora_adapter(name, lora_path)
            except PolicyRequestError as exc:
                if exc.status_code == 400 and await client.served_root(name) == lora_path:
                    client.remember_adapter(name, lora_path)
                    return _LoadOutcome(index)  # a concurrent publisher loaded it first
                raise
            step = "verify"
            if await client.served_root(name) != lora_path:
                raise PolicyUnavailable(f"the load answered 200, but /v1/models does not list {name!r} from "
                                        f"{lora_path}")
            return _LoadOutcome(index, loaded=True)
        except PolicyError as exc:
            # The adapter may be there now if the load answered 200 (then was not listed) or timed out.
            maybe = step == "verify" or (step == "load" and isinstance(exc, PolicyTimeout))
            return _LoadOutcome(index, error=exc, maybe_loaded=maybe)

    async def _take_back(self, name: str, indexes: Sequence[int]) -> tuple[list[str], dict[str, str]]:
        """Unload `name` from the given replicas: (where it was unloaded, where that failed and why)."""

        async def one(index: int) -> tuple[int, bool, str | None]:
            try:
                await self._replicas[index].client.unload_lora_adapter(name)
                return index, True, None
            except PolicyRequestError as exc:
                if exc.status_code == 404 and VLLM_RUNTIME_LORA_ENV not in str(exc):
                    return index, False, None  # it was never loaded there
                return index, False, self._scrub(f"{type(exc).__name__}: {exc}")
            except PolicyError as exc:
                return index, False, self._scrub(f"{type(exc).__name__}: {exc}")

        done = await asyncio.gather(*(one(i) for i in indexes))
        undone = [self._replicas[i].url for i, ok, _ in done if ok]
        failed = {self._replicas[i].url: why for i, _, why in done if why is not None}
        return undone, failed

    async def unload_lora_adapter(self, name: str) -> None:
        """Remove adapter `name` from every replica that has it (a replica without it is fine).

        Raises:
            ValueError: an empty name.
            ReplicaError: some replica could not unload it (named); the others did.
        """
        if not name:
            raise ValueError("unload_lora_adapter needs a non-empty adapter name")
        undone, failed = await self._take_back(name, range(len(self._replicas)))
        if undone:
            log.info("LoRA adapter %s unloaded from %s", name, ", ".join(undone))
        if failed:
            raise ReplicaError(f"adapter {name!r} could not be unloaded from {_describe(failed)}", failed)

    async def aload_adapter(self, path: str | PathLike[str], version: str) -> None:
        """Publish `version`: serve it from `path` on every replica (all or nothing), then send it from now on.

        Raises:
            As `ensure_adapter`; on failure the set keeps sending the previous version.
        """
        await self.ensure_adapter(version, path)
        self.set_model(version)

    async def aunload_adapter(self) -> None:
        """Go back to the base model: send it from now on, then unload the adapter from every replica.

        Raises:
            ReplicaError: some replica kept the adapter (named); the set stays on the base model, which every
                replica serves.
        """
        current = self._model
        if current == self._base:
            return
        self.set_model(self._base)
        await self.unload_lora_adapter(current)

    async def sleep(self, level: int = 1, mode: str = "wait") -> None:
        """Put every replica to sleep (`VLLMPolicyClient.sleep`), e.g. for training on their GPUs.

        Raises:
            ValueError: a level or mode vLLM does not know.
            ReplicaError: some replica did not go to sleep (named).
        """
        await self._on_all(f"POST /sleep?level={level}", lambda c: c.sleep(level=level, mode=mode))

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Wake every replica (`VLLMPolicyClient.wake_up`).

        Raises:
            ReplicaError: some replica did not wake (named).
        """
        await self._on_all("POST /wake_up", lambda c: c.wake_up(tags))

    async def is_sleeping(self) -> bool:
        """Whether any replica is asleep or paused.

        Raises:
            ReplicaError: some replica could not be asked (named).
        """
        return any((await self._on_all("GET /is_sleeping", lambda c: c.is_sleeping())).values())

    async def _on_all(self, what: str, call: Callable[[VLLMPolicyClient], Awaitable[T]]) -> dict[int, T]:
        results, failed = await self._each(call)
        if failed:
            raise ReplicaError(f"{what} failed on {_describe(self._named(failed))}", self._named(failed))
        return results


def _describe(failures: Mapping[str, str]) -> str:
    return "; ".join(f"{url} ({reason})" for url, reason in failures.items())
