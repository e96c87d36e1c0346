"""Agent error hierarchy.

    AgentError
    ├── InputError            bad user input (empty or over-long question, ...)
    ├── PolicyError           the policy server failed
    │   ├── PolicyTimeout
    │   ├── PolicyUnavailable connection refused / 5xx after retries
    │   ├── PolicyRateLimited 429 after retries
    │   ├── PolicyRequestError 4xx other than 429 (bad request, unknown model)
    │   ├── ContextTooLong    the prompt no longer fits the model's context
    │   └── ReplicaError      a step every vLLM replica must do (load an adapter, list models) failed on some
    ├── ToolError             a tool failed; the graph turns it into <tool_output> text for the model
    │   ├── SearchError       a search backend timed out, answered 5xx or malformed JSON
    │   ├── UnsafeURLError    browse_webpage refused a URL (SSRF guard)
    │   └── McpToolError      an MCP server was down, slow, answered an error or unreadable content
    ├── ToolConfigError       the tool settings cannot work (a tool name taken twice, an unusable MCP entry)
    ├── IngestError           a file given to `rubricem ingest` could not be read; nothing was changed
    └── BudgetExceeded        the wall-clock limit of a run was hit

A *tool* failure is shown to the model and the run continues. A *system* failure (PolicyError, store errors)
propagates to the service, which marks the session failed so it is never trained on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class AgentError(Exception):
    """Base of every error raised by the agent package."""


class InputError(AgentError):
    """The user's input is unusable (and nothing was changed)."""


class PolicyError(AgentError):
    """The policy server could not produce a generation."""


class PolicyTimeout(PolicyError):
    """The policy server did not answer in time (after retries)."""


class PolicyUnavailable(PolicyError):
    """The policy server refused the connection or answered 5xx (after retries)."""


class PolicyRateLimited(PolicyError):
    """The policy server kept answering 429 (after retries)."""


class PolicyRequestError(PolicyError):
    """The policy server rejected the request (4xx other than 429): a bug or a misconfiguration, not retried."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class ContextTooLong(PolicyError):
    """The prompt plus the assistant sequence no longer fits the model's context window."""


class ReplicaError(PolicyError):
    """An operation that needs every policy replica (loading or unloading an adapter, listing the served models,
    sleep/wake) failed on some of them (`agent.policy.replicas.ReplicaSet`).

    `failures` maps each failed replica, named by its URL without credentials, to why it failed; `undone` names the
    replicas an adapter load was taken back from (unloaded again) because another replica failed it. Messages never
    hold an API key or URL credentials.
    """

    def __init__(self, message: str, failures: Mapping[str, str], undone: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.failures = dict(failures)
        self.undone = tuple(undone)


class ToolError(AgentError):
    """A tool failed; the message is shown to the model inside <tool_output>."""


class SearchError(ToolError):
    """A search backend timed out, answered an error status or returned an unreadable body."""


class UnsafeURLError(ToolError):
    """A URL was refused by the SSRF guard (scheme, private/loopback/metadata address, redirect, size)."""


class McpToolError(ToolError):
    """A tool served by an MCP server failed: unreachable, too slow, an error result or content it cannot read."""


class ToolConfigError(AgentError):
    """The configured tools cannot be offered as they are (the message says what to change); raised at start."""


class IngestError(AgentError):
    """A file could not be ingested into the local document index; the index was left unchanged."""


class BudgetExceeded(AgentError):
    """The run's wall-clock limit was reached."""
