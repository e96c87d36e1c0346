"""What operators see (issue 36): OpenTelemetry spans and Prometheus instruments, recorded at the same points.

Every instrumented point (a session, a stage, a policy call, a tool call, a judge call, a retrain cycle and its
phases) goes through one context manager here, which opens a span and observes the matching metric. The rest of the
code never imports OpenTelemetry or prometheus_client itself.

- **Traces** are off and free until `configure_tracing` is given an OTLP endpoint (the app passes the standard
  `OTEL_EXPORTER_OTLP_ENDPOINT`). Without it the OpenTelemetry API hands out non-recording spans and no exporter,
  thread or connection exists. With it, spans are batched in memory and exported by a background thread; a trace
  backend that is down or slow never slows a session: a full queue drops spans and the exporter's failures are logged
  as warnings (once a minute), never raised, and at exit the last spans get 2 s (`shutdown_tracing`).
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

import atexit
import hashlib
import logging
import queue
import threading
import time
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
    exit_timeout_s: float = 2.0  # at process exit, the last spans get this long; then they are dropped


# How often a backend that keeps failing is reported (our warning and the exporter's own error line).
_REPORT_EVERY_S = 60.0
_EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                     "opentelemetry.exporter.otlp.proto.grpc.exporter", "opentelemetry.exporter.otlp.common.http")


@dataclass
class _State:
    provider: Any = None  # the SDK TracerProvider this module installed, or None (tracing off)
    processor: Any = None  # its BatchSpanProcessor
    exporter: _DroppingExporter | None = None
    exit_timeout_s: float = 2.0
    record_question_text: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class _DroppingExporter:
    """Wraps the OTLP exporter: a failed export is dropped and said as a warning, at most once a minute with the count
    dropped since, so a dead backend never floods the log.

    The inner export runs on a thread of its own, started with tracing, and the batch processor's thread waits for it
    at most the export timeout, or until the process's exit budget is spent (`close`): a request a hanging backend
    never answers cannot hold the exit for longer than the budget. (The SDK's own shutdown waits up to 30 s and takes
    no limit; a thread cannot be started at exit from Python 3.12 on, so this one exists from the start.)
    """

    def __init__(self, inner: Any, endpoint: str, wait_s: float) -> None:
        self.inner, self.endpoint, self.wait_s = inner, endpoint, wait_s
        self.dropped = 0  # spans dropped since the last warning
        self.dropped_at_exit = 0  # spans the exit budget cut off
        self._warned_at: float | None = None
        self._exit_by: float | None = None  # monotonic deadline once the process exits
        self._cond = threading.Condition()
        self._jobs: queue.SimpleQueue[tuple[Any, list[Any]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._work, name="rubricem-trace-export", daemon=True).start()

    def _work(self) -> None:
        from opentelemetry.sdk.trace.export import SpanExportResult

        while (job := self._jobs.get()) is not None:
            spans, box = job
            try:
                result = self.inner.export(spans)
            except Exception as exc:  # noqa: BLE001 - an exporter bug must not end the export thread
                log.debug("tracing: the exporter raised %s", exc)
                result = SpanExportResult.FAILURE
            with self._cond:
                box.append(result)
                self._cond.notify_all()

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        box: list[Any] = []
        with self._cond:
            if self._exit_by is None or time.monotonic() < self._exit_by:
                self._jobs.put((list(spans), box))
                limit = time.monotonic() + self.wait_s
                while not box:
                    left = min(limit, self._exit_by or limit) - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            exiting = self._exit_by is not None
        if box and box[0] == SpanExportResult.SUCCESS:
            return box[0]
        if exiting:
            self.dropped_at_exit += len(spans)
        else:
            self._dropped(len(spans))
        return SpanExportResult.FAILURE

    def _dropped(self, n: int) -> None:
        self.dropped += n
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= _REPORT_EVERY_S:
            log.warning("tracing: %d span(s) could not be exported to %s and were dropped (the trace backend is "
                        "down or slow; research goes on)", self.dropped, self.endpoint)
            self._warned_at, self.dropped = now, 0

    def close(self, budget_s: float) -> None:
        """From now on, exports end within `budget_s` (the process is exiting)."""
        with self._cond:
            self._exit_by = time.monotonic() + budget_s
            self._cond.notify_all()

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        self._jobs.put(None)
        try:
            self.inner.shutdown()  # also ends the inner exporter's retries
        except Exception as exc:  # noqa: BLE001 - shutting down never fails the process
            log.debug("tracing: exporter shutdown failed: %s", exc)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # the exporter holds nothing; the batch processor holds the queue


class _OncePerInterval(logging.Filter):
    """Lets one record of a logger through per interval (the OTLP exporter logs an error for every failed batch)."""

    def __init__(self, every_s: float) -> None:
        super().__init__()
        self.every_s, self._last = every_s, -every_s

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return False
        self._last = now
        return True


_state = _State()


def tracing_enabled() -> bool:
    """Whether this process exports spans."""
    return _state.provider is not None


def configure_tracing(options: TracingOptions | None) -> bool:
    """Install an OTLP-exporting tracer provider once per process; None (no endpoint) leaves tracing off.

    Returns whether tracing is on. A second call is a no-op (OpenTelemetry's global provider can be set once).
    An exporter package that is missing is a warning and tracing stays off; it never stops the application.
    Without an endpoint nothing is imported or started: no SDK, no exporter, no thread.

    With one, spans are queued in memory (at most `max_queue_size`, then new ones are dropped) and exported in
    batches by the SDK's background thread, each export giving up after `export_timeout_s`; a failed batch is dropped
    with a warning. At process exit the queue gets `exit_timeout_s` to leave (`shutdown_tracing`), so a short command
    sends its spans and a dead backend delays the exit by that much at most.
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

            exporter = _DroppingExporter(_exporter(options), options.endpoint, options.export_timeout_s + 1.0)
        except ImportError as exc:
            log.warning("tracing is off: the OTLP exporter for %s is not installed (%s)", options.protocol, exc)
            return False
        for name in _EXPORTER_LOGGERS:  # its retry chatter off; one error line a minute (ours says how many dropped)
            logger = logging.getLogger(name)
            logger.setLevel(logging.ERROR)
            logger.addFilter(_OncePerInterval(_REPORT_EVERY_S))
        # shutdown_on_exit=False: the SDK's own exit hook would wait up to 30 s for a backend that is down.
        provider = TracerProvider(resource=Resource.create({"service.name": options.service_name}),
                                  shutdown_on_exit=False)
        processor = BatchSpanProcessor(exporter, max_queue_size=options.max_queue_size, schedule_delay_millis=1000,
                                       export_timeout_millis=int(options.export_timeout_s * 1000))
        provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
        _state.provider, _state.processor, _state.exporter = provider, processor, exporter
        _state.exit_timeout_s = options.exit_timeout_s
        _state.record_question_text = options.record_question_text
        atexit.register(shutdown_tracing)
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
    """Export what is queued, waiting at most `timeout_s` (the SDK's own flush would wait for the exporter's
    timeout and retries); False when the backend did not take it in time (the export goes on in the background)."""
    provider = _state.provider
    if provider is None:
        return True
    done: list[bool] = []

    def flush() -> None:
        try:
            done.append(bool(provider.force_flush()))
        except Exception as exc:  # noqa: BLE001 - a dead backend must never fail the command
            log.warning("tracing: flushing spans failed, they are dropped (%s)", exc)
            done.append(False)

    worker = threading.Thread(target=flush, name="rubricem-trace-flush", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return bool(done and done[0])


def shutdown_tracing(timeout_s: float | None = None) -> None:
    """Send the last spans and stop exporting, within `timeout_s` (default: the options' `exit_timeout_s`); what the
    backend has not taken by then is dropped with a warning. Registered to run at process exit."""
    processor, exporter = _state.processor, _state.exporter
    if processor is None or exporter is None:
        return
    _state.processor = None
    exporter.close(_state.exit_timeout_s if timeout_s is None else timeout_s)
    try:
        processor.shutdown()  # exports the queue through `exporter`, which now ends within the budget
    except Exception as exc:  # noqa: BLE001 - exiting never fails on tracing
        log.warning("tracing: could not send the last spans (%s); they are dropped", exc)
        return
    if exporter.dropped_at_exit:
        log.warning("tracing: the trace backend did not take the last %d span(s) within %.1f s; they are dropped",
                    exporter.dropped_at_exit, _state.exit_timeout_s if timeout_s is None else timeout_s)


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
def span(name: str, attrs: Mapping[str, Any] | None = None, *, start_ns: int | None = None) -> Iterator[Span]:
    """A span named `name` around the block (begun at `start_ns`, epoch nanoseconds, when given). An exception marks
    it as an error with the exception's type only (`error.type`): messages and tracebacks can quote a question, a
    URL or a server's answer, and spans hold nothing personal or secret."""
    with _tracer().start_as_current_span(name, attributes=_clean(attrs or {}), start_time=start_ns,
                                         record_exception=False, set_status_on_exception=False) as s:
        try:
            yield s
        except BaseException as exc:
            if s.is_recording() and not _errored(s):  # a reason marked inside the block (mark_error) stands
                s.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                s.set_attribute("error.type", type(exc).__name__)
            raise


def _errored(s: Span) -> bool:
    status = getattr(s, "status", None)  # the SDK's span has it; the API's non-recording one does not
    return status is not None and status.status_code is StatusCode.ERROR


def set_attrs(s: Span, attrs: Mapping[str, Any]) -> None:
    """Add attributes to a span (a no-op on a non-recording one)."""
    if s.is_recording():
        s.set_attributes(_clean(attrs))


def mark_error(s: Span, reason: str) -> None:
    """Mark a span as failed without an exception; `reason` is a short fixed word (never a message with data in it)."""
    if s.is_recording():
        s.set_status(Status(StatusCode.ERROR, reason[:200]))
        s.set_attribute("error.type", reason[:200])


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
        self.start = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.start


@dataclass
class SessionSpan:
    """A session's root span; `status` says how the run ended when it did not raise (completed by default)."""

    span: Span
    status: str | None = None

    def annotate(self, attrs: Mapping[str, Any]) -> None:
        set_attrs(self.span, attrs)


# A session that is only paused (plan approval, a clarifying question) is not finished: its resume is; nor is one
# another process took over (its lease was lost): that process finishes it.
_NOT_FINISHED = frozenset({"paused", "taken_over"})


@contextmanager
def session_span(session_id: str, *, owner: str, policy_version: str, question: str, source: str = "",
                 resumed: bool = False, start_ns: int | None = None) -> Iterator[SessionSpan]:
    """The root span of one research session (its stages, policy and tool calls are children); begun at `start_ns`
    when given (the run's start, before the session id existed). At the end it counts the session as finished
    (`session_finished`) with the handle's `status`: "completed" unless set, "failed" on an exception unless set,
    and nothing for "paused" or "taken_over"."""
    attrs = {"rubricem.session.id": session_id, "rubricem.owner.hash": owner_hash(owner),
             "rubricem.policy.version": policy_version, "rubricem.session.source": source or None,
             "rubricem.session.resumed": resumed or None, **question_attrs(question)}
    handle: SessionSpan | None = None
    try:
        with span("research_session", attrs, start_ns=start_ns) as s:
            handle = SessionSpan(s)
            try:
                yield handle
            except BaseException:
                handle.status = handle.status or "failed"
                raise
            finally:
                set_attrs(s, {"rubricem.session.status": handle.status or "completed"})
    finally:
        status = (handle.status if handle is not None else None) or "completed"
        if status not in _NOT_FINISHED:
            session_finished(status)


@contextmanager
def _observed(name: str, attrs: Mapping[str, Any], seconds: Any) -> Iterator[Span]:
    """A span around the block whose wall time the histogram child `seconds` observes, even when the block raises."""
    t = _Timer()
    try:
        with span(name, attrs) as s:
            yield s
    finally:
        seconds.observe(t.seconds())


def session_finished(status: str) -> None:
    """Count a finished session (completed / failed / rejected ...)."""
    SESSIONS_FINISHED.labels(status=status).inc()


@contextmanager
def stage_span(stage: str) -> Iterator[Span]:
    """One stage step (one graph node call)."""
    with _observed(f"stage {stage}", {"rubricem.stage": stage}, STAGE_SECONDS.labels(stage=stage)) as s:
        yield s


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
        """The tool answered with an error; the span says only "tool_error" (the message can quote the query)."""
        self.error = message
        mark_error(self.span, "tool_error")

    def results(self, n: int) -> None:
        set_attrs(self.span, {"rubricem.tool.results": n})

    def call_id(self, call_id: str) -> None:
        set_attrs(self.span, {"gen_ai.tool.call.id": call_id})


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
    reason: str | None = None  # why it failed, once `failed` was called

    def usage(self, *, prompt_tokens: int, completion_tokens: int, cached: bool = False) -> None:
        if not cached:
            JUDGE_TOKENS.labels(kind="prompt").inc(prompt_tokens)
            JUDGE_TOKENS.labels(kind="completion").inc(completion_tokens)
        set_attrs(self.span, {"gen_ai.usage.input_tokens": prompt_tokens,
                              "gen_ai.usage.output_tokens": completion_tokens, "rubricem.judge.cached": cached})

    def finish_reasons(self, reasons: list[str]) -> None:
        """The answers' finish reasons, in order (two with the repair request)."""
        if reasons:
            set_attrs(self.span, {"gen_ai.response.finish_reasons": reasons})

    def repaired(self) -> None:
        set_attrs(self.span, {"rubricem.judge.repaired": True})

    def failed(self, reason: str) -> None:
        """No usable answer: `reason` is a short word (invalid, rejected, unavailable); counted once."""
        if self.reason is not None:
            return
        self.reason = reason
        JUDGE_FAILURES.labels(call=self.call, reason=reason).inc()
        mark_error(self.span, reason)


@contextmanager
def judge_call(call: str, *, model: str, kind: str = "llm") -> Iterator[JudgeCall]:
    """One judge request (GenAI convention: "chat {model}"); `call` names it (stage_scoring, rubric_generation...).
    An exception the caller did not mark with `failed` is counted with its type's name as the reason."""
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "rubricem.judge.call": call,
             "rubricem.judge.kind": kind}
    t = _Timer()
    try:
        with span(f"chat {model}", attrs) as s:
            handle = JudgeCall(s, call)
            try:
                yield handle
            except BaseException as exc:
                handle.failed(type(exc).__name__)
                raise
    finally:
        JUDGE_SECONDS.labels(call=call).observe(t.seconds())


@contextmanager
def judge_group_span(*, kind: str, model: str, sessions: list[str]) -> Iterator[Span]:
    """One judge's pass over a group of sessions of one question (their judge calls are children); the session ids
    link it to the sessions' own traces."""
    with span("judge_group", {"rubricem.judge.kind": kind, "gen_ai.request.model": model or None,
                              "rubricem.session.ids": list(sessions)}) as s:
        yield s


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
    with _observed(f"retrain {phase}", {"rubricem.cycle.phase": phase},
                   CYCLE_PHASE_SECONDS.labels(phase=phase)) as s:
        yield s
