"""What operators see (issue 36): OpenTelemetry spans and Prometheus instruments, recorded at the same points.

Every instrumented point (a session, a stage, a policy call, a tool call, a judge call, a retrain cycle and its
phases) goes through one context manager here, which opens a span and observes the matching metric. The rest of the
code never imports OpenTelemetry or prometheus_client itself.

- **Traces** are off and free until `configure_tracing` is given an OTLP endpoint (the app passes the standard
  `OTEL_EXPORTER_OTLP_ENDPOINT`). Without it the OpenTelemetry API hands out non-recording spans and no exporter,
  thread or connection exists. With it, spans are batched in memory and exported by a background thread; a trace
  backend that is down or slow never slows a session: a full queue drops spans and the exporter's failures are logged
  as warnings, never raised.
- **Span attributes** follow the GenAI semantic conventions where they fit (`gen_ai.operation.name`,
  `gen_ai.request.model`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
  `gen_ai.response.finish_reasons`, `gen_ai.tool.name`); the rest are `rubricem.*`. Nothing secret or personal: the
  owner is a hash, and question text only when `record_question_text` is set.
- **Metrics** are process-local Prometheus instruments in prometheus_client's default registry (always on: an
  increment costs well under a microsecond). A process that serves them (the scheduler, the MCP HTTP server) exposes
  the registry; gauges that belong to the store (sessions by status, the live version) are collected at scrape time
  by the app layer.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode
from prometheus_client import Counter, Histogram

log = logging.getLogger(__name__)

TRACER_NAME = "rubricem"
SERVICE_NAME = "rubricem"

# --- metrics (prometheus_client's default registry) ------------------------------------------------------------------

# Buckets from 10 ms to 10 min: a stage of the embedded model on 2 cores takes seconds to minutes, a tool call
# milliseconds to seconds.
_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

STAGE_SECONDS = Histogram("rubricem_stage_seconds", "Wall time of one stage step (one graph node call).",
                          ["stage"], buckets=_SECONDS)
POLICY_SECONDS = Histogram("rubricem_policy_call_seconds", "Wall time of one policy generation call.", ["stage"],
                           buckets=_SECONDS)
POLICY_TOKENS = Counter("rubricem_policy_tokens", "Policy tokens: prompt tokens read and tokens sampled.",
                        ["stage", "kind"])
TOOL_SECONDS = Histogram("rubricem_tool_seconds", "Wall time of one tool call.", ["tool"], buckets=_SECONDS)
TOOL_CALLS = Counter("rubricem_tool_calls", "Tool calls made.", ["tool"])
TOOL_ERRORS = Counter("rubricem_tool_errors", "Tool calls that ended in an error.", ["tool"])
JUDGE_SECONDS = Histogram("rubricem_judge_call_seconds", "Wall time of one judge request (with its repair retry).",
                          ["call"], buckets=_SECONDS)
JUDGE_FAILURES = Counter("rubricem_judge_failures", "Judge requests that gave no usable answer.", ["call", "reason"])
JUDGE_TOKENS = Counter("rubricem_judge_tokens", "Judge tokens billed: prompt and completion.", ["kind"])
SESSIONS_FINISHED = Counter("rubricem_sessions_finished", "Research sessions this process finished, by outcome.",
                            ["status"])
CYCLES = Counter("rubricem_retrain_cycles", "Retrain cycles this process ran, by outcome.", ["outcome"])
CYCLE_PHASE_SECONDS = Histogram("rubricem_retrain_phase_seconds", "Wall time of one retrain-cycle phase.",
                                ["phase"], buckets=_SECONDS + (1800, 3600, 7200))


# --- tracing configuration -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TracingOptions:
    """How spans are exported; built by the app from its settings (this layer never reads the environment)."""

    endpoint: str  # OTLP base URL, e.g. http://collector:4318 (http/protobuf) or http://collector:4317 (grpc)
    protocol: str = "http/protobuf"  # or "grpc"
    headers: Mapping[str, str] = field(default_factory=dict)
    service_name: str = SERVICE_NAME
    export_timeout_s: float = 5.0  # one export attempt (retries included) gives up after this
    max_queue_size: int = 4096  # spans held for export; beyond this new spans are dropped
    record_question_text: bool = False


@dataclass
class _State:
    provider: Any = None  # the SDK TracerProvider this module installed, or None (tracing off)
    record_question_text: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


_state = _State()


def tracing_enabled() -> bool:
    """Whether this process exports spans."""
    return _state.provider is not None


def configure_tracing(options: TracingOptions | None) -> bool:
    """Install an OTLP-exporting tracer provider once per process; None (no endpoint) leaves tracing off.

    Returns whether tracing is on. A second call is a no-op (OpenTelemetry's global provider can be set once).
    An exporter package that is missing is a warning and tracing stays off; it never stops the application.
    """
    if options is None or not options.endpoint.strip():
        return False
    with _state.lock:
        if _state.provider is not None:
            return True
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            exporter = _exporter(options)
        except ImportError as exc:
            log.warning("tracing is off: the OTLP exporter for %s is not installed (%s)", options.protocol, exc)
            return False
        provider = TracerProvider(resource=Resource.create({"service.name": options.service_name}))
        provider.add_span_processor(BatchSpanProcessor(
            exporter, max_queue_size=options.max_queue_size, schedule_delay_millis=1000,
            export_timeout_millis=int(options.export_timeout_s * 1000)))
        trace.set_tracer_provider(provider)
        _state.provider = provider
        _state.record_question_text = options.record_question_text
        log.info("tracing: exporting spans by OTLP (%s) to %s", options.protocol, options.endpoint)
        return True


def _exporter(options: TracingOptions) -> Any:
    base = options.endpoint.rstrip("/")
    headers = dict(options.headers)
    if options.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=base, headers=headers or None, timeout=options.export_timeout_s,
                            insecure=base.startswith("http://"))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    # The standard variable is a base URL: the signal path is appended, as the SDK does for the env variable.
    url = base if base.endswith("/v1/traces") else f"{base}/v1/traces"
    return HttpExporter(endpoint=url, headers=headers or None, timeout=options.export_timeout_s)


def flush_traces(timeout_s: float = 2.0) -> bool:
    """Export what is queued, waiting at most `timeout_s` (short-lived commands call it before exiting)."""
    provider = _state.provider
    if provider is None:
        return True
    try:
        return bool(provider.force_flush(timeout_millis=int(timeout_s * 1000)))
    except Exception as exc:  # noqa: BLE001 - a dead backend must never fail the command
        log.warning("tracing: flushing spans failed, they are dropped (%s)", exc)
        return False


def owner_hash(owner: str) -> str:
    """The owner as it appears in spans: 16 hex digits of a SHA-256, never the name or e-mail itself."""
    return hashlib.sha256(f"rubricem-owner:{owner}".encode()).hexdigest()[:16]


# --- spans ----------------------------------------------------------------------------------------------------------


def _tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def _clean(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """OpenTelemetry accepts str, bool, int, float and sequences of them; None values are left out."""
    out: dict[str, Any] = {}
    for k, v in attrs.items():
        if v is None:
            continue
        out[k] = v if isinstance(v, str | bool | int | float | tuple | list) else str(v)
    return out


@contextmanager
def span(name: str, attrs: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A span named `name` around the block; an exception marks it as an error and propagates."""
    with _tracer().start_as_current_span(name, attributes=_clean(attrs or {}),
                                         record_exception=True, set_status_on_exception=True) as s:
        yield s


def set_attrs(s: Span, attrs: Mapping[str, Any]) -> None:
    """Add attributes to a span (a no-op on a non-recording one)."""
    if s.is_recording():
        s.set_attributes(_clean(attrs))


def mark_error(s: Span, message: str) -> None:
    """Mark a span as failed without an exception (a tool that returned an error)."""
    if s.is_recording():
        s.set_status(Status(StatusCode.ERROR, message[:200]))


def question_attrs(question: str) -> dict[str, Any]:
    """The question's attributes: its length always, its text only when the settings allow it."""
    attrs: dict[str, Any] = {"rubricem.question.chars": len(question)}
    if _state.record_question_text:
        attrs["rubricem.question.text"] = question
    return attrs


# --- the instrumented points: one span and its metrics each ---------------------------------------------------------


class _Timer:
    """Wall time of a block, for the histograms (perf_counter: monotonic and fine-grained)."""

    def __init__(self) -> None:
        import time

        self._now = time.perf_counter
        self.start = self._now()

    def seconds(self) -> float:
        return self._now() - self.start


@contextmanager
def session_span(session_id: str, *, owner: str, policy_version: str, question: str,
                 source: str = "") -> Iterator[Span]:
    """The root span of one research session (its stages, policy and tool calls are children)."""
    attrs = {"rubricem.session.id": session_id, "rubricem.owner.hash": owner_hash(owner),
             "rubricem.policy.version": policy_version, "rubricem.session.source": source or None,
             **question_attrs(question)}
    with span("research_session", attrs) as s:
        yield s


def session_finished(status: str) -> None:
    """Count a finished session (completed / failed / rejected ...)."""
    SESSIONS_FINISHED.labels(status=status).inc()


@contextmanager
def stage_span(stage: str) -> Iterator[Span]:
    """One stage step (one graph node call)."""
    t = _Timer()
    try:
        with span(f"stage {stage}", {"rubricem.stage": stage}) as s:
            yield s
    finally:
        STAGE_SECONDS.labels(stage=stage).observe(t.seconds())


@dataclass
class PolicyCall:
    """What a policy call span learns after the call; `finish` records it."""

    span: Span
    stage: str

    def finish(self, *, output_tokens: int, finish_reason: str | None) -> None:
        POLICY_TOKENS.labels(stage=self.stage, kind="sampled").inc(output_tokens)
        set_attrs(self.span, {"gen_ai.usage.output_tokens": output_tokens,
                              "gen_ai.response.finish_reasons": [finish_reason] if finish_reason else None})


@contextmanager
def policy_call(*, stage: str, model: str, input_tokens: int, max_tokens: int,
                temperature: float | None = None, policy_version: str = "") -> Iterator[PolicyCall]:
    """One generation call of the policy (GenAI convention: "text_completion {model}")."""
    POLICY_TOKENS.labels(stage=stage, kind="prompt").inc(input_tokens)
    attrs = {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": model,
             "gen_ai.usage.input_tokens": input_tokens, "gen_ai.request.max_tokens": max_tokens,
             "gen_ai.request.temperature": temperature, "rubricem.stage": stage,
             "rubricem.policy.version": policy_version or None}
    t = _Timer()
    try:
        with span(f"text_completion {model}", attrs) as s:
            yield PolicyCall(s, stage)
    finally:
        POLICY_SECONDS.labels(stage=stage).observe(t.seconds())


@dataclass
class ToolCall:
    """A tool call span; `failed` marks a tool error (the call returned, with an error)."""

    span: Span
    tool: str
    error: str | None = None

    def failed(self, message: str) -> None:
        self.error = message
        mark_error(self.span, message)
        set_attrs(self.span, {"error.type": "tool_error"})

    def results(self, n: int) -> None:
        set_attrs(self.span, {"rubricem.tool.results": n})


@contextmanager
def tool_call(tool: str, *, call_id: str = "", source: str = "builtin") -> Iterator[ToolCall]:
    """One tool call (GenAI convention: "execute_tool {name}"); `source` is builtin or mcp."""
    TOOL_CALLS.labels(tool=tool).inc()
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id or None,
             "rubricem.tool.source": source}
    t = _Timer()
    handle: ToolCall | None = None
    try:
        with span(f"execute_tool {tool}", attrs) as s:
            handle = ToolCall(s, tool)
            yield handle
    except BaseException:
        TOOL_ERRORS.labels(tool=tool).inc()
        raise
    else:
        if handle is not None and handle.error is not None:
            TOOL_ERRORS.labels(tool=tool).inc()
    finally:
        TOOL_SECONDS.labels(tool=tool).observe(t.seconds())


@dataclass
class JudgeCall:
    """A judge request span: `usage` records the tokens billed, `failed` a request with no usable answer."""

    span: Span
    call: str

    def usage(self, *, prompt_tokens: int, completion_tokens: int, cached: bool = False) -> None:
        if not cached:
            JUDGE_TOKENS.labels(kind="prompt").inc(prompt_tokens)
            JUDGE_TOKENS.labels(kind="completion").inc(completion_tokens)
        set_attrs(self.span, {"gen_ai.usage.input_tokens": prompt_tokens,
                              "gen_ai.usage.output_tokens": completion_tokens, "rubricem.judge.cached": cached})

    def failed(self, reason: str) -> None:
        JUDGE_FAILURES.labels(call=self.call, reason=reason).inc()
        mark_error(self.span, reason)
        set_attrs(self.span, {"error.type": reason})


@contextmanager
def judge_call(call: str, *, model: str, kind: str = "llm") -> Iterator[JudgeCall]:
    """One judge request (GenAI convention: "chat {model}"); `call` names it (stage_scoring, rubric_generation...)."""
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "rubricem.judge.call": call,
             "rubricem.judge.kind": kind}
    t = _Timer()
    handle: JudgeCall | None = None
    try:
        with span(f"chat {model}", attrs) as s:
            handle = JudgeCall(s, call)
            yield handle
    except BaseException as exc:
        if handle is not None:
            handle.failed(type(exc).__name__)
        raise
    finally:
        JUDGE_SECONDS.labels(call=call).observe(t.seconds())


@contextmanager
def cycle_span(cycle_id: str, *, parent_version: str = "") -> Iterator[Span]:
    """One retrain cycle; its phases (judge, train, gate, promote) are children. The caller counts the outcome."""
    with span("retrain_cycle", {"rubricem.cycle.id": cycle_id,
                                "rubricem.policy.version": parent_version or None}) as s:
        yield s


def cycle_finished(outcome: str) -> None:
    """Count a finished retrain cycle by outcome (promoted, rejected, skipped, failed)."""
    CYCLES.labels(outcome=outcome).inc()


@contextmanager
def phase_span(phase: str) -> Iterator[Span]:
    """One phase of a retrain cycle."""
    t = _Timer()
    try:
        with span(f"retrain {phase}", {"rubricem.cycle.phase": phase}) as s:
            yield s
    finally:
        CYCLE_PHASE_SECONDS.labels(phase=phase).observe(t.seconds())
