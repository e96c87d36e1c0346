"""Tools served by MCP servers (stdio or streamable HTTP), offered to the model beside the built-in tools.

The servers are configuration (`AgentConfig.mcp_servers`); their tools are listed once at start and join the system
prompt's tool list with their names, descriptions and arguments. A call goes through the scaffold's own parser and
limits like any built-in tool, and its result becomes snippets (ids `{call_id}-{i}`, so the answer can cite them)
inside `<tool_output>`, never anywhere else.

Each call opens its own MCP session (connect, initialize, call, close) under the server's time limit. A server that
crashes or hangs then costs that call only, and no connection outlives the event loop that opened it (the CLI, the
UI and the batch runner each run their own loops). The price is a process start per call for stdio servers.

Only read-only tools are offered: a tool is listed to the model when its server annotates it `readOnlyHint: true`,
or when the server's `allow_side_effects` names it (and its `tools` allow-list, if any, keeps it). The model's
context holds text from the web, uploaded documents and other people's reflections, any of which can steer its calls,
so a tool that writes, sends or deletes is an explicit choice of whoever configures the server. A call to a tool that
is not allowed is refused before any server is contacted.

Everything a server sends is untrusted: descriptions are flattened and stripped of angle brackets before they reach
the system prompt; results are cut to the snippet budget, and binary, malformed or error results become an
`McpToolError` the model reads as text. Header, token and environment values are redacted from every message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.config import MCP_TOOL_NAME, McpServerConfig
from agent.errors import McpToolError, ToolConfigError
from agent.tools.web import clip
from store.records import Snippet

if TYPE_CHECKING:
    from mcp import ClientSession

_log = logging.getLogger(__name__)

Say = Callable[[str], None]

MAX_DESCRIPTION_CHARS = 300  # of the server's own tool description, in the system prompt
MAX_ARG_DESCRIPTION_CHARS = 80
MAX_LISTED_ARGS = 8
MAX_LIST_PAGES = 20  # tools/list pages read from one server (a paginator that never ends cannot hang the start)
MAX_ERROR_CHARS = 300
# Characters that are no text: C0 controls other than tab/newline/CR, DEL, replacement chars and lone surrogates.
_UNREADABLE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd\ud800-\udfff]")


@dataclass(frozen=True, slots=True)
class McpToolSpec:
    """One tool as a server listed it, with the name the model calls it by (the server's prefix + its name)."""

    server: str
    remote_name: str
    name: str
    description: str
    input_schema: Mapping[str, Any]
    read_only: bool = False  # the server annotated it readOnlyHint=true


def offerable(spec: McpToolSpec, cfg: McpServerConfig) -> bool:
    """Whether the tool may be offered and called: read-only, or its side effects allowed by the configuration."""
    return spec.read_only or spec.remote_name in cfg.allow_side_effects


# ---- talking to a server -------------------------------------------------------------------------------------------


def secrets_of(cfg: McpServerConfig) -> tuple[str, ...]:
    """Values that must never appear in a message: header, token and environment values, and the URL itself (it may
    carry a key in its query)."""
    values = [v.get_secret_value() for v in (*cfg.headers.values(), *cfg.env.values())]
    if cfg.bearer_token is not None:
        values.append(cfg.bearer_token.get_secret_value())
    if cfg.url:
        values.append(cfg.url)
    return tuple(sorted((v for v in values if v), key=len, reverse=True))  # longest first: no partial leftovers


def redact(text: str, secrets: Sequence[str]) -> str:
    """`text` with every secret value replaced by ***."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def failure_reason(exc: BaseException, secrets: Sequence[str]) -> str:
    """A short, single-line, secret-free description of why talking to a server failed."""
    from pydantic import ValidationError

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:  # anyio task groups wrap the real failure
        exc = exc.exceptions[0]
    if isinstance(exc, ValidationError):  # its text quotes what the server sent; the gist is enough
        return f"a malformed response: {exc.error_count()} field(s) do not follow the MCP schema"
    message = redact(" ".join(str(exc).split()), secrets)[:200]
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@asynccontextmanager
async def open_session(cfg: McpServerConfig) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session with one server (a fresh subprocess or HTTP session), closed on exit."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    if cfg.url is not None:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {k: v.get_secret_value() for k, v in cfg.headers.items()}
        if cfg.bearer_token is not None:
            headers["Authorization"] = f"Bearer {cfg.bearer_token.get_secret_value()}"
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(cfg.timeout_s)) as http,
            streamable_http_client(cfg.url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
        return
    assert cfg.command is not None  # McpServerConfig guarantees one transport
    params = StdioServerParameters(
        command=cfg.command, args=list(cfg.args), env={k: v.get_secret_value() for k, v in cfg.env.items()},
        cwd=cfg.cwd,
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def list_server_tools(cfg: McpServerConfig) -> list[McpToolSpec]:
    """The tools one server offers (after its allow-list), named as the model will call them.

    Raises:
        McpToolError: the server could not be reached or listed within its time limit.
    """
    import anyio
    from mcp.types import PaginatedRequestParams

    listed: list[Any] = []
    try:
        with anyio.fail_after(cfg.timeout_s):
            async with open_session(cfg) as session:
                cursor: str | None = None
                for _ in range(MAX_LIST_PAGES):
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    listed.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
    except TimeoutError as exc:
        raise McpToolError(f"the MCP server {cfg.name!r} did not list its tools within {cfg.timeout_s:g} s") from exc
    except Exception as exc:  # noqa: BLE001 - whatever the transport raised, the start goes on without the server
        reason = failure_reason(exc, secrets_of(cfg))
        raise McpToolError(f"the MCP server {cfg.name!r} could not list its tools ({reason})") from exc
    allowed = set(cfg.tools) if cfg.tools is not None else None
    specs = []
    for tool in listed:
        if allowed is not None and tool.name not in allowed:
            continue
        schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
        read_only = bool(tool.annotations is not None and tool.annotations.read_only_hint is True)
        specs.append(McpToolSpec(cfg.name, tool.name, cfg.prefix + tool.name, tool.description or "", schema,
                                 read_only))
    return specs


# ---- arguments: from the scaffold's `<call_tool name=... attr="...">text</call_tool>` to a JSON object ------------


def _types(spec: object) -> list[str]:
    """The JSON types a property schema accepts (`type`, a list of types, or `anyOf` arms as pydantic writes them)."""
    if not isinstance(spec, Mapping):
        return []
    kind = spec.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    arms = spec.get("anyOf") or spec.get("oneOf") or []
    return [k for arm in arms if isinstance(arm, Mapping) for k in _types(arm)]


def _properties(schema: Mapping[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return {str(k): v for k, v in props.items()} if isinstance(props, Mapping) else {}


def _required(schema: Mapping[str, Any]) -> list[str]:
    req = schema.get("required")
    return [str(r) for r in req] if isinstance(req, list) else []


def primary_argument(schema: Mapping[str, Any]) -> str | None:
    """The argument the text between the call tags fills: the first required string argument, else the first string
    argument (None when the tool takes no string)."""
    props = _properties(schema)
    strings = [name for name, spec in props.items() if "string" in _types(spec)]
    required = [name for name in _required(schema) if name in strings]
    return (required or strings or [None])[0]


def _coerce(tool: str, name: str, raw: str, spec: object) -> object:
    kinds = _types(spec)
    if not kinds or "string" in kinds:
        return raw
    value = raw.strip()
    try:
        if "integer" in kinds and re.fullmatch(r"[+-]?\d+", value):
            return int(value)
        if "number" in kinds:
            return float(value)
        if "boolean" in kinds and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if "array" in kinds or "object" in kinds:
            return json.loads(value)
    except ValueError:
        pass
    raise McpToolError(f'{tool}: argument {name}="{clip(raw, 40)}" must be {" or ".join(kinds)}')


def build_arguments(tool: str, text: str, attrs: Mapping[str, str], schema: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON arguments of one call.

    A body that is a JSON object is taken as the arguments; other text fills the tool's primary string argument.
    Attributes of the opening tag fill arguments of the same name, converted to the types the schema declares.

    Raises:
        McpToolError: JSON that does not parse, an attribute of the wrong type, a missing required argument.
    """
    props = _properties(schema)
    text = text.strip()
    args: dict[str, Any]
    if text.startswith("{") and text.endswith("}"):
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise McpToolError(f"{tool}: the arguments look like a JSON object but do not parse ({exc.msg})") from exc
        if not isinstance(parsed, dict):
            raise McpToolError(f"{tool}: the arguments must be a JSON object")
        args = parsed
    elif (primary := primary_argument(schema)) is not None:
        args = {primary: text}
    elif props:
        raise McpToolError(f"{tool}: write the arguments as a JSON object between the call tags "
                           f"({describe_arguments(schema)})")
    else:
        args = {}  # a tool without arguments: the text is only what the parser needs to see a call
    for name, raw in attrs.items():
        if name not in args:
            args[name] = _coerce(tool, name, raw, props.get(name))
    missing = [name for name in _required(schema) if name not in args]
    if missing:
        raise McpToolError(f"{tool}: missing required argument(s) {', '.join(missing)} ({describe_arguments(schema)})")
    return args


# ---- what the system prompt says about a tool ----------------------------------------------------------------------


def prompt_text(text: str, limit: int) -> str:
    """Server-written text made safe for the system prompt: one line, no tags (no `<` or `>`), at most `limit`."""
    return clip(_UNREADABLE.sub(" ", text).replace("<", "(").replace(">", ")"), limit)


def describe_arguments(schema: Mapping[str, Any]) -> str:
    """`q (string, required): the query; limit (integer)`-style summary of an input schema."""
    props = _properties(schema)
    if not props:
        return "no arguments"
    required = set(_required(schema))
    parts = []
    for name, spec in list(props.items())[:MAX_LISTED_ARGS]:
        kinds = "/".join(dict.fromkeys(k for k in _types(spec) if k != "null")) or "any"
        what = prompt_text(str(spec.get("description", "")) if isinstance(spec, Mapping) else "",
                           MAX_ARG_DESCRIPTION_CHARS)
        flag = ", required" if name in required else ""
        parts.append(f"{prompt_text(name, 40)} ({kinds}{flag})" + (f": {what}" if what else ""))
    more = f"; and {len(props) - MAX_LISTED_ARGS} more" if len(props) > MAX_LISTED_ARGS else ""
    return "; ".join(parts) + more


def prompt_line(spec: McpToolSpec) -> str:
    """The tool's line in the system prompt (after `- name: `): what it does, where from, how to pass arguments."""
    what = prompt_text(spec.description, MAX_DESCRIPTION_CHARS) or "a tool"
    primary = primary_argument(spec.input_schema)
    args = describe_arguments(spec.input_schema)
    if primary is not None:
        how = f"the text between the tags is {primary}; other arguments go in the opening tag or as a JSON object"
    elif _properties(spec.input_schema):
        how = "write the arguments as a JSON object between the tags"
    else:
        how = "write any short text between the tags"
    return f"{what.rstrip('.')}. (MCP server {spec.server}) Arguments: {args}; {how}."


# ---- results -----------------------------------------------------------------------------------------------------


def readable(text: str, limit: int) -> str | None:
    """The first `limit` characters as text, or None when they are mostly not text (binary sent as a string)."""
    head = text[:limit]
    bad = len(_UNREADABLE.findall(head))
    if bad > max(8, len(head) // 10):
        return None
    return _UNREADABLE.sub(" ", head)


def to_snippets(
    result: Any, spec: McpToolSpec, call_id: str, *, max_results: int, snippet_chars: int, secrets: Sequence[str]
) -> list[Snippet]:
    """Snippets from a `CallToolResult`: one per readable content item, each cut to the snippet budget.

    Raises:
        McpToolError: an error result, or content of which nothing can be read as text (images, audio, blobs).
    """
    from agent.tools.ids import snippet_id

    limit = snippet_chars * 4  # look no further into a huge item than the snippet can show
    if getattr(result, "is_error", getattr(result, "isError", False)):
        texts = [readable(t, limit) for t in (getattr(b, "text", None) for b in result.content or ()) if t]
        detail = redact(clip(" ".join(t for t in texts if t), MAX_ERROR_CHARS), secrets)
        raise McpToolError(f"{spec.name}: the MCP server reported an error" + (f": {detail}" if detail else ""))
    items: list[tuple[str, str, str]] = []  # (title, text, url)
    unreadable: list[str] = []
    default_title = f"{spec.server}: {spec.remote_name}"
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            items.append((default_title, block.text, ""))
        elif kind == "resource" and isinstance(getattr(block.resource, "text", None), str):
            items.append((str(block.resource.uri), block.resource.text, str(block.resource.uri)))
        elif kind == "resource_link":
            title = getattr(block, "title", None) or block.name
            items.append((title, block.description or title, str(block.uri)))
        else:  # image, audio, a binary resource: nothing the model can read
            source = getattr(block, "resource", block)
            unreadable.append(getattr(source, "mime_type", None) or kind or "unknown")
    if not items and getattr(result, "structured_content", None) is not None:
        items.append((default_title, json.dumps(result.structured_content, ensure_ascii=False), ""))
    snippets: list[Snippet] = []
    for title, text, url in items:
        body = readable(text, limit)
        if body is None:
            unreadable.append("binary text")
            continue
        if not body.strip():
            continue
        snippets.append(Snippet(
            id=snippet_id(call_id, len(snippets)), tool=spec.name, title=prompt_text(title, 200),
            text=clip(body, snippet_chars), url=url[:2000],
        ))
        if len(snippets) >= max_results:
            break
    if not snippets and unreadable:
        kinds = ", ".join(sorted({str(k) for k in unreadable}))
        raise McpToolError(f"{spec.name}: the MCP server returned only content that is not text ({kinds})")
    return snippets


# ---- the tool --------------------------------------------------------------------------------------------------------


class McpTool:
    """A `SearchTool` that calls one tool of one MCP server."""

    def __init__(self, spec: McpToolSpec, server: McpServerConfig, snippet_chars: int = 700) -> None:
        """Call `spec.remote_name` on `server`; snippets are cut to `snippet_chars`."""
        self.spec = spec
        self.server = server
        self.name = spec.name
        self.description = prompt_line(spec)
        self.snippet_chars = snippet_chars
        self._secrets = secrets_of(server)

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        """Run the call. Raises McpToolError for bad arguments, a failing or slow server, or unreadable results."""
        import anyio

        if not offerable(self.spec, self.server):
            raise McpToolError(f"{self.name}: refused: the tool may change things (it is not annotated read-only) "
                               f"and the MCP server {self.server.name!r} does not list it in allow_side_effects")
        arguments = build_arguments(self.name, query, attrs, self.spec.input_schema)
        server, limit = self.server.name, self.server.timeout_s
        try:
            with anyio.fail_after(limit):
                async with open_session(self.server) as session:
                    result = await session.call_tool(self.spec.remote_name, arguments)
        except TimeoutError as exc:
            raise McpToolError(f"{self.name}: the MCP server {server!r} did not answer within {limit:g} s") from exc
        except Exception as exc:  # noqa: BLE001 - any transport or protocol failure is this call's tool error
            reason = failure_reason(exc, self._secrets)
            raise McpToolError(f"{self.name}: the MCP server {server!r} failed ({reason})") from exc
        return to_snippets(result, self.spec, call_id, max_results=self.server.max_results,
                           snippet_chars=self.snippet_chars, secrets=self._secrets)


# ---- start: list every server's tools and check their names --------------------------------------------------------


def check_names(configs: Sequence[McpServerConfig], taken: Collection[str]) -> None:
    """Refuse allow-listed names that collide with `taken` or with each other, before any server is contacted.

    Raises:
        ToolConfigError: a collision (the message says how to resolve it).
    """
    seen: dict[str, str] = {}
    for cfg in configs:
        for tool in cfg.tools or ():
            _claim(cfg.prefix + tool, cfg, tool, taken, seen)


def _claim(name: str, cfg: McpServerConfig, remote: str, taken: Collection[str], seen: dict[str, str]) -> None:
    if name in taken:
        raise ToolConfigError(
            f"MCP server {cfg.name!r} offers a tool named {name!r}, which is a built-in tool's name: give the server "
            f'a prefix (e.g. "prefix": "{cfg.name}_") or leave {remote!r} out of its "tools" allow-list')
    if name in seen and seen[name] != cfg.name:
        raise ToolConfigError(
            f"MCP servers {seen[name]!r} and {cfg.name!r} both offer a tool named {name!r}: give one of them a "
            'prefix ("prefix" in its mcp_servers entry)')
    seen[name] = cfg.name


async def discover(
    configs: Sequence[McpServerConfig], taken: Collection[str], *, snippet_chars: int = 700, say: Say | None = None
) -> dict[str, McpTool]:
    """The tools of every configured server, keyed by the name the model calls them by.

    A server that cannot be listed is left out with a warning (the start goes on), and so is a tool that is neither
    annotated read-only nor named in its server's `allow_side_effects`; a tool name that collides with `taken` (the
    built-in names) or another server's tool is refused.

    Raises:
        ToolConfigError: a name collision.
    """
    def warn(message: str) -> None:
        _log.warning("%s", message)
        if say is not None:
            say(message)

    check_names(configs, taken)
    listed = await asyncio.gather(*(list_server_tools(cfg) for cfg in configs), return_exceptions=True)
    tools: dict[str, McpTool] = {}
    seen: dict[str, str] = {}
    for cfg, specs in zip(configs, listed, strict=True):
        if isinstance(specs, BaseException):
            if not isinstance(specs, McpToolError):
                raise specs
            warn(f"{specs}; its tools are not offered")
            continue
        offered = {s.remote_name for s in specs}
        for missing in sorted(set(cfg.tools or ()) - offered):
            warn(f"MCP server {cfg.name!r} has no tool named {missing!r} (listed in its allow-list)")
        for spec in specs:
            if not offerable(spec, cfg):
                warn(f"MCP server {cfg.name!r}: tool {prompt_text(spec.remote_name, 80)!r} is not offered: it is not "
                     "annotated read-only (readOnlyHint); list it in the server's allow_side_effects to offer it")
                continue
            if not MCP_TOOL_NAME.match(spec.name):
                warn(f"MCP server {cfg.name!r}: tool {prompt_text(spec.remote_name, 80)!r} is left out: its name "
                     "cannot be written in a call (letters, digits, _ . - only, at most 64 characters)")
                continue
            _claim(spec.name, cfg, spec.remote_name, taken, seen)
            tools[spec.name] = McpTool(spec, cfg, snippet_chars)
    return tools


def discover_sync(
    configs: Sequence[McpServerConfig], taken: Collection[str], *, snippet_chars: int = 700, say: Say | None = None
) -> dict[str, McpTool]:
    """`discover` from synchronous code, in a thread of its own (so it works whether or not a loop is running)."""
    if not configs:
        return {}
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp-discover") as pool:
        return pool.submit(
            asyncio.run, discover(configs, taken, snippet_chars=snippet_chars, say=say)
        ).result()
