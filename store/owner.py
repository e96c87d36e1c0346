"""Who a session is written for: the owner and their per-session learning choice, carried in a context variable.

The serving code (agent graph, research service) creates sessions without knowing who asked; the entry point that
does know (the chat page, the CLI) sets the actor around the run. A context variable follows the run into asyncio
tasks and `asyncio.to_thread`, and into `run_coroutine_threadsafe` from the thread that set it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

LOCAL = "local"  # the CLI, and the open UI on loopback
MCP = "mcp"  # the MCP server's callers by default (RUBRICEM_MCP__OWNER); no password account may take it


@dataclass(frozen=True, slots=True)
class Actor:
    """The person a session is created for; `learn=False` opts that session out of judging, training and the bank."""

    owner: str = LOCAL
    learn: bool = True


_ACTOR: ContextVar[Actor] = ContextVar("rubricem_actor", default=Actor())


def current_actor() -> Actor:
    """The actor sessions are created for in this context (`local` unless `acting_as` says otherwise)."""
    return _ACTOR.get()


@contextmanager
def acting_as(owner: str, *, learn: bool = True) -> Iterator[Actor]:
    """Create sessions in this block (and in tasks started from it) for `owner`."""
    actor = Actor(owner=owner, learn=learn)
    token = _ACTOR.set(actor)
    try:
        yield actor
    finally:
        _ACTOR.reset(token)
