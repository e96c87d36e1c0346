"""ResearchService: runs the agent for a question, writes the session turn by turn, emits typed events.

The CLI (and later the Streamlit UI and batch runner) call this; none of them contains research logic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

from agent import telemetry
from agent.approval import PlanDecision, PlanForApproval
from agent.checkpoint import open_checkpointer
from agent.clarify import ClarificationAnswer
from agent.config import AgentConfig, RunOptions
from agent.deps import AgentDeps
from agent.errors import AgentError, InputError
from agent.policy import PinnedPolicy, pinnable
from agent.protocols import PolicyClient, ReflectionBank, SearchTool, Served
from agent.report import Embed, Report, attribute_report, report_fields, unverified_report, verify_report
from agent.sequence import policy_model
from agent.run import (
    PausedRun,
    RejectedRun,
    RunResult,
    clarify_context,
    execute,
    execute_durable,
    render_prompt,
    validate_question,
)
from agent.tools.ids import CallIdFactory
from app import events as ev
from app.durable import DurableSessions, Heartbeat, LeaseLost, LeaseTiming
from app.outcomes import EventSink, ResearchPaused, ResearchRejected, RunFailedError  # re-exported here too
from store.errors import StoreError
from store.owner import current_actor
from store.records import STAGES, PromptRecord, Retrieval, SessionSource, ToolCallRecord, Trajectory, Turn
from store.session_log import SessionLog
from store.session_log.checkpoints import SessionRuns
from store.teams import Teams

_log = logging.getLogger(__name__)


def failure_note(kind: str, what: str, exc: BaseException | str, **data: Any) -> ev.Note:
    """A chat note about a failure the run went on without (issue 65): the page says its fixed sentence for `kind`
    with a short error reference, and the exception text goes to the server's log under that reference only.

    Exception text names hosts, ports, paths and adapter folders, and any signed-in person may be looking at the
    page (the chat's notes are shown to whoever runs it, admin or not); the reference leads the operator to the log
    line. `data` is what the note may show besides (a team's name, never text from the failure).
    """
    ref = secrets.token_hex(4)
    detail = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    _log.warning("%s [error %s]: %s", what, ref, detail)
    return ev.Note(kind, {**data, "error": f"error reference {ref}; the details are in the app's log",
                          "reference": ref})


def adapter_version(path: Path) -> str:
    """The version name a trained adapter carries (rubricem.json, written by training), else its folder name."""
    try:
        return str(json.loads((Path(path) / "rubricem.json").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return Path(path).name


@dataclass(frozen=True, slots=True)
class ResearchOutcome:
    """A completed run."""

    session_id: str
    trajectory: Trajectory
    report: Report
    policy_version: str
    seconds: float


REJECTED_ERROR = "the user rejected the plan"


def outcome_status(outcome: object) -> str:
    """How a run that returned ended, for its span and the finished-sessions counter: completed, paused, rejected."""
    if isinstance(outcome, ResearchPaused):
        return "paused"
    return "rejected" if isinstance(outcome, ResearchRejected) else "completed"


class _SessionRecorder:
    """Writes turns and tool calls through to the session log as they happen and forwards events."""

    def __init__(self, log: SessionLog, session_id: str, sink: EventSink, fence: Callable[[], None]) -> None:
        self.log, self.session_id, self.sink, self.fence = log, session_id, sink, fence

    def turn(self, turn: Turn) -> None:
        self.fence()  # the lease is still ours (Heartbeat.check): never append to a session another process runs
        self.log.append_turn(self.session_id, turn)
        self.sink(ev.TurnWritten(turn.stage, turn.kind, turn.text))

    def tool_call(self, call: ToolCallRecord) -> None:
        self.fence()
        self.log.append_tool_call(self.session_id, call)
        self.sink(ev.SourcesFound(call.tool, call.query, call.snippets, call.error))

    def event(self, kind: str, data: Mapping[str, Any]) -> None:
        self.sink(ev.from_agent(kind, dict(data)))

    def prompt(self, prompt: PromptRecord) -> None:
        SessionRuns(self.log).set_prompt(self.session_id, prompt)


def stage_summary(traj: Trajectory) -> list[dict[str, Any]]:
    """Per stage: turns, tokens, trainable tokens and whether the model wrote it (for --json and metrics)."""
    out = []
    for stage in STAGES:
        turns = [t for t in traj.turns if t.stage == stage]
        out.append({
            "stage": stage,
            "turns": len(turns),
            "tokens": sum(len(t.token_ids) for t in turns),
            "trainable_tokens": sum(sum(t.mask) for t in turns),
            "sampled": any(t.kind == "sampled" for t in turns),
        })
    return out


class CitationCounts(TypedDict):
    """See `citation_counts`. A TypedDict, so `**citation_counts(report)` type-checks field by field."""

    invented_citations: int


def citation_counts(report: Report) -> CitationCounts:
    """The citation counts every output of a finished session carries: `rubricem ask --json`, each batch item's
    `<id>.json` (and, copied from it by `CITATION_COUNT_FIELDS`, its row of the batch's `index.json`), and the MCP
    `research` and `get_session` results. They all take them from here, so they agree field for field, and a count
    added here reaches every one of them (the MCP results' models forbid a field they do not declare, so a new count
    there fails loudly instead of being dropped)."""
    # Cited ids no search of this session returned (issue 64): the report removed them and marked each sentence
    # left without a citation unsupported. Counted once, when the report was built (`agent.report`); never recounted.
    return CitationCounts(invented_citations=report.unknown_citations)


CITATION_COUNT_FIELDS: tuple[str, ...] = tuple(CitationCounts.__annotations__)
"""The keys `citation_counts` gives: what an output built from a written record (a batch's `index.json` row, from its
item's `<id>.json`) copies, so it has every count the record has."""


def _metrics(traj: Trajectory, report: Report, seconds: float) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3),
        "tool_calls": len(traj.tool_calls),
        "tool_errors": sum(1 for c in traj.tool_calls if c.error),
        "unknown_citations": report.unknown_citations,
        "attributed_references": len(report.references) if report.attributed else 0,
        "references": len(report.references),
        **({f"{k}_claims": v for k, v in report.support.counts().items()} if report.support else {}),
        "malformed": traj.malformed,
        "stages": stage_summary(traj),
    }


class LiveVersion(Protocol):
    """Where the live policy version is read from (store.registry.Registry via `registry_live`)."""

    def current(self, team: str | None = None) -> tuple[str, str | None]:
        """(version name, adapter folder or None for the base model): the global live version, or a team's (its
        own, else the global one). Raises StoreError for a team that no longer exists."""
        ...


@dataclass(frozen=True, slots=True)
class SessionServing:
    """Which version serves a session and why (issue 49): recorded in its metrics as `serving`."""

    policy: PolicyClient  # the session's view of the shared client, pinned to `version` (or the client itself)
    version: str
    team: str | None  # the owner's team as the session starts (or is resumed)
    warning: str | None = None  # why the team's own version could not serve it (the global one did): for the
    # session's record and the operator's log, never for the page (`failure_note`)

    def record(self) -> dict[str, Any]:
        """JSON for the session's metrics."""
        return {"version": self.version, "team": self.team, "warning": self.warning}


class ResearchService:
    """Runs research sessions against one policy, one tool set and one session log."""

    def _mark_failed(self, sid: str, message: str, seconds: float) -> None:
        """Mark a session failed; a store failure here is logged, never allowed to hide the run's own error."""
        try:
            self.log.finish(sid, "failed", error=message, metrics={"seconds": round(seconds, 3)})
        except StoreError as store_exc:
            _log.error("could not mark session %s failed: %s (run error: %s)", sid, store_exc, message)

    def __init__(
        self,
        policy: PolicyClient,
        tools: Mapping[str, SearchTool],
        log: SessionLog,
        config: AgentConfig,
        bank: ReflectionBank | None = None,
        live: LiveVersion | None = None,
        embed: Embed | None = None,
        base_adapter: Path | None = None,
        durable: DurableSessions | None = None,
        lease: LeaseTiming | None = None,
    ) -> None:
        """`embed` (texts → normalised vectors) lets an uncited answer get references matched after writing and
        every citation be checked against its passage (`config.attribute_uncited`, `config.verify_citations`);
        `base_adapter` is what the registry's `base` version serves (app.container.base_adapter: the SFT adapter);
        `lease` how this process holds the sessions it runs (issue 34: a resume never takes over a live one)."""
        self.policy, self.tools, self.log, self.config, self.bank = policy, dict(tools), log, config, bank
        self.live, self.embed = live, embed
        self.base_adapter = base_adapter
        self.durable = durable  # None: sessions are not checkpointed (no resume, no plan approval)
        self.lease = lease or LeaseTiming()
        self._swap_lock = asyncio.Lock()
        self._ready: set[tuple[str, str]] = set()  # team versions this process has loaded once (`_serving`)

    async def sync_live(self, sink: EventSink) -> None:
        """Serve the registry's live version from the next request on (the hot swap's serving side).

        vLLM: send the live adapter's name as `model` (the promoter loaded it on the server). Embedded: load the
        adapter in-process; a request in progress finishes on the old weights. A failed swap keeps the current
        version and says so; it never fails the user's run.
        """
        if self.live is None:
            return
        async with self._swap_lock:
            try:
                name, adapter = await asyncio.to_thread(self.live.current)
                if adapter is None and self.base_adapter is not None:  # `base` is the deployment's starting adapter
                    adapter, name = str(self.base_adapter), adapter_version(self.base_adapter)
                if name == self.policy.policy_version:
                    return
                set_model = getattr(self.policy, "set_model", None)
                if set_model is not None:
                    set_model(name if adapter else self.config.policy_model)
                elif adapter is None:
                    await self.policy.aunload_adapter()  # type: ignore[attr-defined]
                else:
                    await self.policy.aload_adapter(adapter, name)  # type: ignore[attr-defined]
                sink(ev.Note("policy_swapped", {"version": name}))
            except Exception as exc:  # noqa: BLE001 - keep serving the current version
                sink(failure_note("policy_swap_failed", "could not switch to the live policy version", exc))

    def _served(self, name: str, adapter: str | None) -> Served:
        """How this client is told to serve a registry version: an HTTP server by the version's adapter name (the
        base model's served name for the base version), an in-process engine by its adapter folder (`base` is the
        deployment's starting adapter, under the name `sync_live` loads it by)."""
        if hasattr(self.policy, "set_model"):
            model = name if adapter else self.config.policy_model
            return Served(version=model, model=model, adapter=adapter)
        if adapter is None and self.base_adapter is not None:
            adapter, name = str(self.base_adapter), adapter_version(self.base_adapter)
        return Served(version=name, model=name, adapter=adapter)

    async def _serving(self, sink: EventSink, owner: str) -> SessionServing:
        """The session's policy: pinned to its owner's team's version, or to the global live one (issue 49).

        `owner` is whose session it is, read now: a new session's asker, or a resumed session's owner, who may have
        left the team (or the team was removed, or moved to another version) since it started; a resume is served the
        owner's policy of today, never the old team's version (issue 65).
        A team's version whose adapter folder is gone, or that fails to load here (vLLM: on every replica; in-process:
        a trial swap), is not used: the session is served by the global live version and the warning is recorded on
        it and sent as a `team_policy_fallback` note (with an error reference only: `failure_note`). Never another
        team's version. Without a registry, or with a client that cannot be pinned per request, the shared client
        serves as it is.
        """
        team = await asyncio.to_thread(Teams(self.log).team_of, owner)
        if self.live is None or not pinnable(self.policy):
            return SessionServing(self.policy, self.policy.policy_version, team)
        name, adapter = await asyncio.to_thread(self.live.current)
        warning = None
        if team is not None:
            try:
                own = await asyncio.to_thread(self.live.current, team)
            except StoreError as exc:  # the team was removed meanwhile
                own, warning = (name, adapter), f"team {team!r} is unavailable ({exc})"
            if own != (name, adapter) and own[1] is not None:
                warning = await self._load_problem(own[0], own[1])
                if warning is None:
                    name, adapter = own
                else:
                    warning = f"team {team}'s version {own[0]} cannot serve: {warning}"
        if warning is not None:
            warning += f"; served by the global policy {name}"
            sink(failure_note("team_policy_fallback", "team policy fallback", warning, team=team))
        served = self._served(name, adapter)
        return SessionServing(PinnedPolicy(self.policy, served), served.version, team, warning)

    async def _load_problem(self, name: str, adapter: str) -> str | None:
        """Why a team version cannot be served here, or None once it is loaded (checked once per process)."""
        if not (Path(adapter) / "adapter_config.json").is_file():  # checked every time: a folder can go away
            return f"its adapter folder {adapter} is missing or incomplete"
        if (name, adapter) in self._ready:
            return None
        try:
            if hasattr(self.policy, "ensure_adapter"):  # vLLM (every replica, or none): loaded while requests run
                await self.policy.ensure_adapter(name, adapter)  # type: ignore[attr-defined]
            else:  # in-process: a trial swap; every session is pinned, so none is answered by it meanwhile
                await self.policy.aload_adapter(adapter, name)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - the session falls back to the global policy, and says why
            return f"{type(exc).__name__}: {exc}"
        self._ready.add((name, adapter))
        return None

    async def references(self, question: str, options: RunOptions, sink: EventSink) -> Retrieval:
        """Rubric-bank items for the prompt (none when injection is off or there is no bank).

        A bank failure never fails the run: the question is researched without references and a note says why.
        """
        if not options.inject_bank or self.bank is None:
            return Retrieval("none")
        try:
            return await asyncio.to_thread(lambda: self.bank.retrieve(question, mode=options.bank_mode))  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - Chroma down, model missing: research goes on without the bank
            sink(failure_note("bank_unavailable", "rubric bank unavailable, running without references", exc))
            return Retrieval("none")

    async def _attribute(self, report: Report, traj: Trajectory, sink: EventSink) -> Report:
        """Matched references for an uncited answer; an embedding failure keeps the report as written."""
        if self.embed is None or report.references or not self.config.attribute_uncited:
            return report
        try:
            return await asyncio.to_thread(attribute_report, report, traj, self.embed)
        except Exception as exc:  # noqa: BLE001 - the answer stands without matched references
            sink(failure_note("attribution_failed", "references could not be matched to the answer", exc))
            return report

    async def _verify(self, report: Report, traj: Trajectory, sink: EventSink) -> Report:
        """The support check of every cited claim (agent/support.py), which repairs the report; without the scorer
        (no embedding model, or it failed) the report is shown as written and says it is unverified. Never blocks
        the answer."""
        if not self.config.verify_citations:
            return report
        if self.embed is None:
            return unverified_report(report, traj, "no embedding model is configured") if report.references else \
                report
        try:
            return await asyncio.to_thread(verify_report, report, traj, self.embed)
        except Exception as exc:  # noqa: BLE001 - the answer stands, unverified, and says so
            sink(failure_note("support_check_failed", "citation support check unavailable", exc))
            return unverified_report(report, traj, "the support scorer is unavailable")

    def _tools(self, names: Collection[str] | None) -> dict[str, SearchTool]:
        if names is None:
            return self.tools
        unknown = sorted(set(names) - set(self.tools))
        if unknown:
            raise InputError(f"unknown search backend(s) {unknown}; configured: {sorted(self.tools)}")
        return {name: tool for name, tool in self.tools.items() if name in names}

    async def run(
        self,
        question: str,
        options: RunOptions | None = None,
        on_event: EventSink | None = None,
        tools: Collection[str] | None = None,
        source: SessionSource = "api",
    ) -> ResearchOutcome:
        """Research one question to its report (never pauses; see `start` for plan approval). Bad input raises
        InputError before anything is written.

        Args:
            tools: the configured search backends this run may use (None = all); the prompt offers only these.
            source: where the question comes from, recorded with the session; benchmark runs ("eval") and gate
                probes ("probe") are never learned from nor listed as a user's history (`store.records`).

        Raises:
            InputError: empty or over-long question, an unknown backend (nothing written).
            RunFailedError: the run failed after the session was created (session marked failed).
        """
        outcome = await self.start(question, options, on_event, tools, source, clarify=False)
        if not isinstance(outcome, ResearchOutcome):  # only a run that asked for approval can pause or be rejected
            raise RunFailedError(outcome.session_id, f"unexpected {type(outcome).__name__}")
        return outcome

    async def start(
        self,
        question: str,
        options: RunOptions | None = None,
        on_event: EventSink | None = None,
        tools: Collection[str] | None = None,
        source: SessionSource = "api",
        *,
        approve_plan: bool = False,
        clarify: bool | None = None,
    ) -> ResearchOutcome | ResearchPaused | ResearchRejected:
        """Like `run`; with `approve_plan` the session pauses after its plan (ResearchPaused) until `resume`
        answers it. With `clarify` (None: the deployment's `sessions.clarify` setting) the policy first decides
        whether the request is ambiguous, and if so the session pauses with one question (ResearchPaused with
        `question`). Both need durable sessions (InputError otherwise, nothing written; `clarify=None` is then off).
        """
        sink = on_event or (lambda e: None)
        question = validate_question(question, self.config.max_question_chars)
        if approve_plan and self.durable is None:
            raise InputError("plan approval needs durable sessions: set RUBRICEM_SESSIONS__CHECKPOINTS=true")
        if clarify and self.durable is None:
            raise InputError("clarification needs durable sessions: set RUBRICEM_SESSIONS__CHECKPOINTS=true")
        asks = bool(self.durable.clarify if clarify is None and self.durable is not None else clarify)
        opts = options or self.config.defaults
        tool_set = self._tools(tools)
        started = time.monotonic()
        began_ns = time.time_ns()  # the session's span starts here, before its id exists
        if self.live is None or not pinnable(self.policy):  # a pinned session names its version per request
            await self.sync_live(sink)
        try:
            serving = await self._serving(sink, current_actor().owner)
            # A seeded run also gets reproducible tool-call ids (they are in the token sequence).
            deps = AgentDeps(policy=serving.policy, tools=tool_set, options=opts, call_ids=CallIdFactory(opts.seed),
                             approve_plan=approve_plan)
            refs = await self.references(question, opts, sink)
            prompt = await render_prompt(question, deps, refs)
            clarify_with = clarify_context(question, deps, refs) if asks else None
            version = serving.version
            sid = self.log.create_session(question, prompt, opts.model_dump(mode="json"), version, source=source,
                                          policy_model=policy_model(deps),  # what the price table prices
                                          team=serving.team,  # the team whose version serves it, read once
                                          serving=serving.record())  # kept from the start, a fallback included
            if refs.hits:
                self.log.set_flags(sid, injected_bank_items=refs.item_ids)
        except Exception as exc:  # nothing was written: report it typed, without a session id
            sink(ev.RunFailed(None, f"{type(exc).__name__}: {exc}"))
            if isinstance(exc, AgentError | StoreError):
                raise
            raise RunFailedError(None, f"{type(exc).__name__}: {exc}") from exc
        bank_meta = {"mode": refs.mode,
                     "items": [{"id": h.item.id, "similarity": round(h.similarity, 4)} for h in refs.hits]}
        with telemetry.session_span(sid, owner=current_actor().owner, policy_version=version, question=question,
                                    source=source, start_ns=began_ns) as traced:
            beat = Heartbeat(self.log, sid, self.lease).start()  # this process holds the session while it runs
            try:
                sink(ev.SessionStarted(sid, version))
                if refs.hits:
                    sink(ev.ReferencesInjected(refs.mode, tuple(
                        ev.BankReference(h.item.id, h.item.question, round(h.similarity, 4)) for h in refs.hits)))
                deps.recorder = _SessionRecorder(self.log, sid, sink, beat.check)
                if self.durable is None:
                    result: RunResult | PausedRun | RejectedRun = await execute(sid, question, prompt, deps,
                                                                                refs.item_ids)
                    return await self._complete(sid, result, bank_meta, started, sink, version,
                                                serving.record())
                self.durable.runs.start(sid, sid)
                outcome = await self._drive(sid, question, prompt, deps, bank_meta, started, sink, version,
                                            start=True, injected=refs.item_ids, clarify_with=clarify_with,
                                            serving=serving.record())
                traced.status = outcome_status(outcome)
                return outcome
            except BaseException as exc:  # whatever stopped the run (even Ctrl-C), the session is marked failed
                traced.status = "taken_over" if beat.lost else "failed"
                self._fail(sid, exc, started, sink, beat)
                if isinstance(exc, Exception):
                    raise RunFailedError(sid, f"{type(exc).__name__}: {exc}") from exc
                raise
            finally:
                beat.stop(release=True)

    def _fail(self, sid: str, exc: BaseException, started: float, sink: EventSink, beat: Heartbeat) -> None:
        message = f"{type(exc).__name__}: {exc}"
        if not beat.lost:  # a session another process took over is its to finish, not ours to mark failed
            self._mark_failed(sid, message, time.monotonic() - started)
        sink(ev.RunFailed(sid, message))

    async def _complete(self, sid: str, result: RunResult | PausedRun | RejectedRun, bank_meta: dict[str, Any],
                        started: float, sink: EventSink, version: str,
                        serving: Mapping[str, Any] | None = None) -> ResearchOutcome:
        """Finish a session whose graph reached its end: flags, metrics, report; the session is completed."""
        if not isinstance(result, RunResult):
            raise RuntimeError(f"the run stopped early ({type(result).__name__})")
        traj, report = result.trajectory, await self._attribute(result.report, result.trajectory, sink)
        report = await self._verify(report, traj, sink)
        seconds = time.monotonic() - started
        self.log.set_flags(sid, malformed=traj.malformed, max_consecutive_tool_errors=traj.max_consecutive_tool_errors)
        metrics = _metrics(traj, report, seconds) | {"report": report_fields(report), "bank": bank_meta}
        if serving:  # which version served it, for whose team, and why not the team's own if it fell back
            metrics["serving"] = dict(serving)
        if result.clarification is not None:  # the clarify node ran: what it decided, and the user's answer
            metrics["clarification"] = dict(result.clarification)
        self.log.finish(sid, "completed", report=report.markdown, metrics=metrics)
        sink(ev.AnswerReady(sid, report.markdown))
        return ResearchOutcome(sid, traj, report, version, seconds)

    async def _drive(
        self, sid: str, question: str, prompt: PromptRecord, deps: AgentDeps, bank_meta: dict[str, Any],
        started: float, sink: EventSink, version: str, *, start: bool, injected: tuple[str, ...],
        resume_value: dict[str, Any] | None = None, clarify_with: dict[str, Any] | None = None,
        serving: Mapping[str, Any] | None = None,
    ) -> ResearchOutcome | ResearchPaused | ResearchRejected:
        """Run the session's thread until it ends or pauses; an ended session's checkpoints are pruned."""
        durable = self.durable
        assert durable is not None
        async with open_checkpointer(durable.target) as cp:
            try:
                result = await execute_durable(sid, question, prompt, deps, checkpointer=cp, thread_id=sid,
                                               start=start, resume_value=resume_value, injected_bank_items=injected,
                                               clarify_with=clarify_with)
                if isinstance(result, PausedRun):  # a clarifying question before the plan, or the plan itself
                    expires = durable.expiry()
                    if result.question is not None:
                        pause: dict[str, Any] = {"kind": "clarification", "question": result.question}
                        paused: ev.Event = ev.ClarificationRequested(sid, result.question, expires)
                    else:
                        pause = result.plan.to_dict()
                        paused = ev.PlanAwaitingApproval(sid, pause, expires)
                    durable.runs.set_state(sid, "awaiting_approval", pause=pause, expires_at=expires)
                    sink(paused)
                    return ResearchPaused(sid, result.plan, expires, question=result.question)
                if isinstance(result, RejectedRun):
                    self.log.finish(sid, "failed", error=REJECTED_ERROR,
                                    metrics={"seconds": round(time.monotonic() - started, 3), "rejected": True})
                    durable.runs.set_state(sid, "rejected", reason=REJECTED_ERROR)
                    sink(ev.RunFailed(sid, REJECTED_ERROR))
                    await self._prune(cp, sid)
                    return ResearchRejected(sid)
                if isinstance(deps.recorder, _SessionRecorder):
                    deps.recorder.fence()  # the last check before the session is finished under our name
                outcome = await self._complete(sid, result, bank_meta, started, sink, version, serving)
                durable.runs.set_state(sid, "finished")
            except LeaseLost:
                raise  # the session is another process's now: its checkpoints and run state are left to it
            except Exception as exc:
                await self._prune(cp, sid)
                with contextlib.suppress(StoreError):
                    durable.runs.set_state(sid, "finished", reason=f"{type(exc).__name__}: {exc}")
                raise
            await self._prune(cp, sid)
            return outcome

    async def _prune(self, cp: Any, sid: str) -> None:
        """Delete an ended session's checkpoints (unless kept); a failure here never fails the session."""
        if self.durable is None or self.durable.keep_checkpoints:
            return
        try:
            await cp.adelete_thread(sid)
        except Exception as exc:  # noqa: BLE001 - leftover checkpoints cost disk, not correctness
            _log.warning("could not prune the checkpoints of session %s: %s", sid, exc)

    async def resume(
        self, session_id: str, decision: PlanDecision | ClarificationAnswer | None = None,
        on_event: EventSink | None = None,
    ) -> ResearchOutcome | ResearchPaused | ResearchRejected:
        """Go on with a session cut off by a crash, or answer its pause: a paused plan (a PlanDecision) or a
        clarifying question (a ClarificationAnswer; empty text = go on without clarification).

        Raises:
            SessionNotFound: unknown id (nothing changed).
            ResumeError: the session is finished, was not run durably, is not waiting for this kind of answer, or
                another resume has just taken it over (nothing changed).
            RunFailedError: the session could not go on (checkpoint missing or unreadable, pause expired: the
                session is then marked failed and its run state says why), or the resumed run failed.
        """
        from app.durable_resume import prepare_resume

        sink = on_event or (lambda e: None)
        started = time.monotonic()
        began_ns = time.time_ns()
        plan = await prepare_resume(self, session_id, decision, sink)
        if isinstance(plan, ResearchPaused):
            return plan
        rec, deps, dropped = plan
        sink(ev.SessionResumed(session_id, dropped))
        if isinstance(decision, PlanDecision):
            sink(ev.Note("plan_decision", {"action": decision.action}))
        with telemetry.session_span(session_id, owner=rec.owner, policy_version=rec.policy_version,
                                    question=rec.question, source=rec.source, resumed=True,
                                    start_ns=began_ns) as traced:
            beat = Heartbeat(self.log, session_id, self.lease).start()  # prepare_resume took the lease: keep it
            try:
                # The owner's policy of today serves the rest (issue 65): not the old team's version once its owner
                # left the team or the team was removed; the session keeps its team (`rec.team`) for training.
                serving = await self._serving(sink, rec.owner)
                deps.policy = serving.policy
                deps.recorder = _SessionRecorder(self.log, session_id, sink, beat.check)
                traj = rec.trajectory
                bank_meta = {"mode": "resumed", "items": [{"id": i} for i in traj.injected_bank_items]}
                outcome = await self._drive(session_id, rec.question, traj.prompt, deps, bank_meta, started, sink,
                                            rec.policy_version, start=False, injected=traj.injected_bank_items,
                                            resume_value=None if decision is None else decision.to_dict(),
                                            serving=serving.record() | {"resumed": True})
                traced.status = outcome_status(outcome)
                return outcome
            except BaseException as exc:
                traced.status = "taken_over" if beat.lost else "failed"
                self._fail(session_id, exc, started, sink, beat)
                if isinstance(exc, Exception):
                    raise RunFailedError(session_id, f"{type(exc).__name__}: {exc}") from exc
                raise
            finally:
                beat.stop(release=True)
