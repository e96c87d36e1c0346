"""The agent as an MCP server (the SDK's MCPServer): `research`, `search_bank` and `get_session`.

Each tool calls the services the CLI uses (ResearchService, the rubric bank, the session log), so an MCP client gets
the same reports and references as `rubricem ask`; a `research` call is logged with source `api`.

Who a caller is (issue 34): every MCP caller acts as one scoped identity, `RUBRICEM_MCP__OWNER` (default `mcp`). The
sessions `research` creates are owned by it, and `get_session` opens only that identity's sessions: anyone else's id
gets the same "no session" answer as a missing one (`store.people.ScopedStore`), so the CLI's (`local`) and the UI
users' history stay private. `search_bank` returns only items reflected from that identity's own sessions
(issue 65): its answer is a function of the caller's own data, so no guess at someone else's question (exact,
paraphrased or wrong) can be told apart by it. Other people's reflections reach research prompts as strategy text
only (`RubricBank.retrieve`); here they are never read.

Over HTTP: only an exact bind of 127.0.0.1, localhost or ::1 may run without a token (other local processes can
reach it; web pages cannot, see below); any other address, 127.0.0.2 included, needs a bearer token
(`RUBRICEM_MCP__TOKEN`) of at least MIN_TOKEN_CHARS characters, compared in constant time. DNS-rebinding protection
is always set explicitly: the Host header must name the bind address (or `RUBRICEM_MCP__ALLOWED_HOSTS`) and port, so a
browser page cannot reach a local server through a name it controls. At most `RUBRICEM_MCP__MAX_CONCURRENT_RUNS`
research runs go at once; a call over the limit is refused at once (an MCP client's call would otherwise wait minutes
with no answer).

Over HTTP the server also answers `GET /metrics` for Prometheus (`mount_metrics`, issue 36), under the same two rules
as the MCP endpoint: the token when one is set, and the Host check.
"""

# No `from __future__ import annotations`: the SDK reads the tool functions' annotations as real types.
import asyncio
import hmac
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from agent.config import FormatLabel, RunOptions
from agent.errors import InputError
from agent.report import Report, stored_report
from app import events as ev
from app.container import Services
from app.hostcheck import MIN_SECRET_CHARS, HostRuleError, host_rule, is_open_host
from app.service import RunFailedError, citation_counts
from store.errors import SessionNotFound
from store.owner import MCP, acting_as
from store.people import ScopedStore, Viewer
from store.records import SessionRecord, Snippet
from store.rubric_bank import coarse_similarity
from store.users import check_user_id

_log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "rubricem is a deep-research agent. `research` plans, searches its document index (and any configured search "
    "tools), reviews the evidence against a rubric it writes itself, and answers with a Markdown report whose [n] "
    "markers point to numbered references; it takes minutes. `get_session` reads one of this server's past "
    "sessions back; `search_bank` searches the rubric bank of reflections on earlier questions."
)


MCP_OWNER = MCP  # the default identity of MCP callers: not `local`, which owns the CLI's (and open UI's) sessions
MIN_TOKEN_CHARS = MIN_SECRET_CHARS
MAX_BANK_K = 10  # search_bank hits per call: enough to browse, too few to page through the whole bank quickly


class McpAccessError(HostRuleError):
    """The HTTP transport would be reachable by others without a (strong enough) token, or its allowed Host names
    cannot be derived from the bind address."""


# ---- typed records at the boundary ---------------------------------------------------------------------------------


class ResearchOptions(BaseModel):
    """Per-call options of `research`; anything unset takes the server's defaults."""

    model_config = {"extra": "forbid"}

    format: FormatLabel | None = Field(default=None, description="exact_answer, short_form or long_form.")
    max_tool_calls: int | None = Field(default=None, ge=0, le=50, description="Tool-call budget.")
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    seed: int | None = Field(default=None, description="Sampling seed (reproducible where the backend allows).")
    wall_clock_s: float | None = Field(default=None, gt=0, le=3600, description="Hard time limit, seconds.")
    inject_bank: bool | None = Field(default=None, description="Use rubric-bank reflections in the prompt.")
    question_first: bool | None = Field(
        default=None, description="The first search is the question itself, made by the agent (default: on).")
    tools: list[str] | None = Field(default=None, description="Which configured search tools to use (default: all).")


class Reference(BaseModel):
    """One numbered reference of a report: what `[n]` points to."""

    number: int
    id: str = Field(description="The snippet id the answer cited.")
    title: str
    url: str
    tool: str
    text: str


class ClaimCheck(BaseModel):
    """One cited sentence of the answer, checked against the passages (agent/support.py)."""

    text: str = Field(description="The sentence, without its markers.")
    status: Literal["supported", "reattributed", "unsupported"] = Field(
        description="supported: a cited passage supports it; reattributed: another retrieved passage did and is "
        "cited instead; unsupported: none did, the citation was removed and the sentence is marked.")
    score: float = Field(description="Support in [0, 1] (MiniLM similarity and word overlap).")
    cited: list[str] = Field(description="Snippet ids the model cited for it.")
    cites: list[str] = Field(description="Snippet ids it cites in the report.")


class CitationSupport(BaseModel):
    """The support check of the report's citations."""

    verified: bool = Field(description="False: the scorer was unavailable and the report is shown as written.")
    note: str
    claims: list[ClaimCheck]


def citation_support(report: Report) -> CitationSupport | None:
    """The report's support check for MCP callers (None: the session was not checked)."""
    c = report.support
    if c is None:
        return None
    return CitationSupport(verified=c.verified, note=c.note, claims=[
        ClaimCheck(text=x.text, status=x.status, score=x.score, cited=list(x.cited), cites=list(x.kept))
        for x in c.claims])


class ResearchResult(BaseModel):
    """A finished research session."""

    # Forbid undeclared fields: the citation counts come in as `**citation_counts(report)`, and a count added there
    # without a field here must fail (a test runs this path) rather than vanish from what MCP callers get.
    model_config = {"extra": "forbid"}

    session_id: str
    report: str = Field(description="The answer as Markdown with [n] markers and a references section.")
    references: list[Reference]
    matched_after_writing: bool = Field(description="The model cited nothing; [n] were matched to passages after.")
    support: CitationSupport | None = Field(default=None, description="Each cited sentence, checked.")
    invented_citations: int = Field(
        description="Cited ids no search of the session returned: removed from the report, and each sentence left "
        "without a citation is marked *(unsupported)*. The same count as `rubricem ask --json`.")
    policy_version: str
    tool_calls: int


class BankHit(BaseModel):
    """One of the caller's own rubric-bank items, similar to the query."""

    id: str
    question: str = Field(description="The question of the caller's own session the item reflects on.")
    similarity: float
    score: float = Field(description="The reflection judge's score in [0, 1].")
    rubrics: str
    takeaways: str
    created_at: str


class BankSearchResult(BaseModel):
    """The bank items most similar to a query, best first."""

    hits: list[BankHit]


class ToolCallSummary(BaseModel):
    """One tool call of a session."""

    tool: str
    query: str
    results: int
    error: str | None


class TurnText(BaseModel):
    """One turn of a session's assistant sequence."""

    stage: str
    kind: str
    text: str


class SessionResult(BaseModel):
    """A logged research session."""

    # Forbid undeclared fields, as `ResearchResult` does: the citation counts come in as `**citation_counts(report)`.
    model_config = {"extra": "forbid"}

    session_id: str
    question: str
    status: Literal["running", "completed", "failed"]
    source: str
    created_at: str
    finished_at: str | None
    policy_version: str
    report: str | None
    error: str | None
    references: list[Reference]
    support: CitationSupport | None = Field(default=None, description="Each cited sentence, checked.")
    invented_citations: int | None = Field(
        default=None, description="Cited ids no search of the session returned, as in `research`'s result (None: "
        "the session has no report).")
    tool_calls: list[ToolCallSummary]
    turns: list[TurnText] | None = Field(default=None, description="Only when include_turns is set.")


def references(report: Report) -> list[Reference]:
    """The report's references, numbered as its [n] markers."""
    return [_reference(n, s) for n, s in enumerate(report.references, start=1)]


def _reference(n: int, s: Snippet) -> Reference:
    return Reference(number=n, id=s.id, title=s.title, url=s.url, tool=s.tool, text=s.text)


def session_result(record: SessionRecord, include_turns: bool) -> SessionResult:
    """What `get_session` returns for a logged session."""
    report = stored_report(record) if record.status == "completed" else None
    traj = record.trajectory
    return SessionResult(
        session_id=record.session_id, question=record.question, status=record.status, source=record.source,
        created_at=record.created_at, finished_at=record.finished_at, policy_version=record.policy_version,
        report=record.report, error=record.error, references=references(report) if report else [],
        support=citation_support(report) if report else None,
        **(citation_counts(report) if report else {}),  # invented_citations: what `research` gives, from one place
        tool_calls=[ToolCallSummary(tool=c.tool, query=c.query, results=len(c.snippets), error=c.error)
                    for c in traj.tool_calls],
        turns=[TurnText(stage=t.stage, kind=t.kind, text=t.text) for t in traj.turns] if include_turns else None,
    )


# ---- progress ------------------------------------------------------------------------------------------------------


def progress_message(event: ev.Event) -> str | None:
    """The progress line an event is worth (None: not shown)."""
    match event:
        case ev.SessionStarted(session_id=sid):
            return f"session {sid} started"
        case ev.StageStarted(stage="research", final=True):
            return "research: last turn, without tools"
        case ev.StageStarted(stage="research", turn=n):
            return f"research: turn {n}"
        case ev.StageStarted(stage=stage):
            return stage
        case ev.SearchIssued(tool=tool, query=query):
            return f"{tool}: {' '.join(query.split())[:100]}"
        case ev.AnswerReady():
            return "done"
    return None


class ProgressPump:
    """Sends a run's events as MCP progress notifications, in order, from one task.

    The service's event sink is synchronous; this queues the messages and one task awaits the sends. A client that
    asked for no progress (or went away) costs nothing: the SDK skips the send, and failures are ignored.
    """

    def __init__(self, ctx: Context, also: Callable[[ev.Event], None] | None = None) -> None:
        self.ctx, self.also = ctx, also
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._pump())

    def __call__(self, event: ev.Event) -> None:
        if self.also is not None:
            self.also(event)
        message = progress_message(event)
        if message is not None:
            self.queue.put_nowait(message)

    async def _pump(self) -> None:
        n = 0
        while (message := await self.queue.get()) is not None:
            n += 1
            try:
                await self.ctx.report_progress(n, None, message)
            except Exception as exc:  # noqa: BLE001 - progress is a courtesy; the run goes on
                _log.debug("progress notification not sent: %s", exc)

    async def close(self) -> None:
        """Send what is queued, then stop (at once, if the call itself is being cancelled)."""
        self.queue.put_nowait(None)
        try:
            await self.task
        except asyncio.CancelledError:
            self.task.cancel()
            raise


# ---- the server ----------------------------------------------------------------------------------------------------


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve HTTP without a token off the exact loopback binds, or with a token too short to be a secret.

    Raises:
        McpAccessError: a bracketed host, no token off 127.0.0.1/localhost/::1, or a token under MIN_TOKEN_CHARS.
    """
    if host.strip().startswith("["):
        raise McpAccessError(f"rubricem mcp binds an address, not a URL host: write {host.strip().strip('[]')} "
                             f"instead of {host.strip()} (RUBRICEM_MCP__HOST or --host).")
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise McpAccessError(
            f"RUBRICEM_MCP__TOKEN is {len(token)} characters; it needs at least {MIN_TOKEN_CHARS} so it cannot be "
            "guessed. Generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`.")
    if not token and not is_open_host(host):
        raise McpAccessError(
            f"rubricem mcp will not serve HTTP on {host} without a token: anyone who can reach it could run research "
            "and read the MCP identity's sessions. Set RUBRICEM_MCP__TOKEN (at least "
            f"{MIN_TOKEN_CHARS} characters; clients send it as `Authorization: Bearer ...`), or bind 127.0.0.1.")


def transport_security(host: str, port: int, extra_hosts: Sequence[str] = ()) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding protection, set explicitly for every bind (the SDK turns it on by itself only for the
    three loopback names, and not at all elsewhere), from the rule every endpoint shares (`app.hostcheck.host_rule`):
    the Host header must be the bind address (for a loopback bind, any loopback name) or one of `extra_hosts`, at
    `port` unless the entry names its own; an Origin, when sent, must be one of those hosts over http or https.

    Raises:
        McpAccessError: a wildcard bind (0.0.0.0, ::) with no `extra_hosts`: the names clients use are unknown.
    """
    try:
        rule = host_rule(host, port, extra_hosts, who="rubricem mcp", setting="RUBRICEM_MCP__ALLOWED_HOSTS")
    except HostRuleError as exc:
        raise McpAccessError(str(exc)) from None
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=list(rule.hosts),
                                     allowed_origins=list(rule.origins))


class RunSlots:
    """At most `limit` research runs at once (each holds the policy for minutes); a call over it is refused at once
    with a message, rather than left waiting, so a client is never stuck without an answer."""

    def __init__(self, limit: int) -> None:
        self.limit, self.active = limit, 0

    @contextmanager
    def take(self) -> Iterator[None]:
        """Hold one slot for the block (all on the event loop's thread, so a plain counter is enough).

        Raises:
            ToolError: all slots are taken.
        """
        if self.active >= self.limit:
            raise ToolError(
                f"busy: {self.active} research run(s) already in progress, the most this server runs at once "
                f"(RUBRICEM_MCP__MAX_CONCURRENT_RUNS={self.limit}); try again when one has finished.")
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1


class StaticTokenVerifier:
    """The SDK's TokenVerifier for one shared bearer token (constant-time comparison)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    async def verify_token(self, token: str) -> AccessToken | None:
        """The access for a matching token, None otherwise."""
        if hmac.compare_digest(token.encode(), self._token):
            return AccessToken(token="***", client_id="rubricem-mcp-client", scopes=[])
        return None


def mount_metrics(app: MCPServer, registry: CollectorRegistry, *, token: str | None,
                  security: TransportSecuritySettings | None, path: str = "/metrics") -> None:
    """Answer `GET path` (default /metrics) on the HTTP transport with the Prometheus text of `registry`.

    The decision (SECURITY.md): with a token set, /metrics asks for the same bearer token as the MCP endpoint
    (Prometheus sends it with `authorization: {credentials_file: ...}` in its scrape config). The numbers are not
    secret in themselves, but they tell who can reach the port how much research is going on, when, with which tools
    and which policy version, and one rule for the whole port is easier to get right than two. Without a token (the
    server then binds only loopback: `check_bind`) it is open, like the MCP endpoint. The DNS-rebinding check
    (`security`, the Host and Origin headers) applies too, so a web page cannot read it through a name it controls.

    The SDK's custom routes bypass its auth and Host checks, so this route does both itself. The registry is read on
    a worker thread: a scrape queries the store, and must not stall the event loop that runs research.
    """
    guard = TransportSecurityMiddleware(security) if security is not None else None
    verifier = StaticTokenVerifier(token) if token else None

    @app.custom_route(path, methods=["GET"], include_in_schema=False)
    async def metrics(request: Request) -> Response:
        if guard is not None and (refused := await guard.validate_request(request, is_post=False)) is not None:
            return refused
        if verifier is not None:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or await verifier.verify_token(given.strip()) is None:
                return Response("a bearer token is required\n", status_code=401,
                                headers={"WWW-Authenticate": 'Bearer realm="rubricem-metrics"'})
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = await asyncio.to_thread(encoder, registry)
        return Response(body, media_type=content_type)


def build_server(
    services: Services, *, token: str | None = None, base_url: str | None = None,
    on_event: Callable[[ev.Event], None] | None = None, owner: str = MCP_OWNER, max_concurrent_runs: int = 1,
) -> MCPServer:
    """The MCP server over `services`.

    Args:
        token: require this bearer token (HTTP); `base_url` (e.g. http://127.0.0.1:8765/mcp) is then the resource
            URL the SDK's auth metadata names.
        on_event: also receives every research event (e.g. stderr progress for the operator).
        owner: the identity every caller acts as: it owns the sessions `research` creates, and is the only owner
            whose sessions `get_session` opens and whose bank items `search_bank` returns.
        max_concurrent_runs: research runs at once; a call over it is refused (ToolError "busy").
    """
    auth: dict[str, Any] = {}
    if token:
        url = base_url or "http://127.0.0.1/mcp"
        auth = {"auth": AuthSettings(issuer_url=url, resource_server_url=url, validate_token_resource=False),
                "token_verifier": StaticTokenVerifier(token)}
    app: MCPServer = MCPServer("rubricem", instructions=INSTRUCTIONS, **auth)
    defaults = services.settings.agent.defaults
    owner = check_user_id(owner)  # stored as a user id is (stripped; e-mails lower-cased), so the filter matches
    scoped = ScopedStore(services.log, Viewer(owner))  # never an admin: the caller sees its own sessions only
    slots = RunSlots(max_concurrent_runs)

    @app.tool(annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True))
    async def research(
        question: str, ctx: Context, options: ResearchOptions | None = None
    ) -> Annotated[CallToolResult, ResearchResult]:
        """Research a question: plan, search, review the evidence against a self-written rubric, and answer with a
        Markdown report whose [n] markers point to numbered references. Takes minutes; progress is reported per
        stage. Returns the report, its references and the session id (for get_session)."""
        opts = options or ResearchOptions()
        chosen = opts.model_dump(exclude_none=True, exclude={"tools"})
        try:
            run_options = RunOptions.model_validate(defaults.model_dump() | chosen)
        except ValidationError as exc:
            raise ToolError(f"invalid options: {exc.errors(include_input=False)}") from exc
        with slots.take():
            pump = ProgressPump(ctx, on_event)
            try:
                with acting_as(owner):  # the session is the MCP identity's, not the CLI's `local`
                    outcome = await services.research.run(question, run_options, on_event=pump, tools=opts.tools,
                                                          source="api")
            except InputError as exc:
                raise ToolError(str(exc)) from exc
            except RunFailedError as exc:
                where = f"; session {exc.session_id} is marked failed" if exc.session_id else ""
                raise ToolError(f"the research run failed ({exc}){where}") from exc
            finally:
                await pump.close()
        report = outcome.report
        result = ResearchResult(
            session_id=outcome.session_id, report=report.markdown, references=references(report),
            matched_after_writing=report.attributed, support=citation_support(report),
            **citation_counts(report),  # invented_citations: what `ask --json` and batch records carry, from one place
            policy_version=outcome.policy_version,
            tool_calls=len(outcome.trajectory.tool_calls),
        )
        text = f"{report.markdown.rstrip()}\n\n(session {outcome.session_id})"
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content=result.model_dump(mode="json"))

    def _owns(session_id: str) -> bool:
        """Whether the MCP identity owns this session (a deleted or someone else's session: no)."""
        try:
            scoped.owner_of(session_id)
        except SessionNotFound:
            return False
        return True

    @app.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def search_bank(
        query: str,
        k: Annotated[int, Field(ge=1, le=MAX_BANK_K, description=f"Hits to return, 1 to {MAX_BANK_K}.")] = 5,
        min_similarity: Annotated[float, Field(ge=0.0, le=1.0, description="Cosine similarity floor, 0 to 1.")] = 0.0,
    ) -> BankSearchResult:
        """Search your own reflections in the rubric bank: the rubrics and takeaways the agent wrote on this
        server's earlier, judged sessions, most similar question first, similarities rounded down to 0.1. Only this
        server's own items are returned; other people's reflections are never shown here."""
        if not query.strip():
            raise ToolError("the query is empty")
        hits = await asyncio.to_thread(services.bank.search_own, query, k, owner)
        out: list[BankHit] = []
        for h in hits:
            similarity = coarse_similarity(h.similarity)  # the 0.1 grid callers know; the floor compares with it
            if similarity < min_similarity:
                break  # best first: nothing after it is above the floor either
            if not _owns(h.item.session_id):  # checked again against the scoped store, whatever the bank was given
                continue
            out.append(BankHit(id=h.item.id, question=h.item.question, similarity=similarity, score=h.item.score,
                               rubrics=h.item.rubrics, takeaways=h.item.takeaways, created_at=h.item.created_at))
        return BankSearchResult(hits=out)

    @app.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def get_session(session_id: str, include_turns: bool = False) -> SessionResult:
        """A research session this server ran: question, status, report with its references, tool calls and (with
        include_turns) every turn of the plan, research, review and answer. Other people's sessions are not
        found."""
        try:
            record = scoped.get(session_id.strip())  # a short read, on the loop's thread like the run's writes
        except SessionNotFound as exc:
            raise ToolError(f"no session with id {session_id!r}") from exc
        return session_result(record, include_turns)

    return app
