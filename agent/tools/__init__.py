"""The agent's tools: local document search, web and paper search APIs, guarded page browsing and MCP servers' tools.

Names are imported on first use (PEP 562), so importing one light submodule (the tool names, say) does not
load Chroma, the HTTP clients and the MCP SDK.
"""

from typing import TYPE_CHECKING

from store.lazy import lazy_exports

if TYPE_CHECKING:
    from agent.tools.browse import BrowseWebpage
    from agent.tools.ids import CallIdFactory, CounterCallIds, is_snippet_id, snippet_id
    from agent.tools.local_search import LocalSearch
    from agent.tools.mcp_client import McpTool
    from agent.tools.names import BUILTIN_TOOL_NAMES, TOOL_ALIASES, resolve_tool_name
    from agent.tools.registry import build_tools
    from agent.tools.searxng import SearxngSearch
    from agent.tools.semantic_scholar import SnippetSearch
    from agent.tools.serper import GoogleSearch
    from agent.tools.web import WebPageFetcher, check_url

_EXPORTS: dict[str, str] = {
    "BrowseWebpage": "agent.tools.browse",
    "CallIdFactory": "agent.tools.ids",
    "CounterCallIds": "agent.tools.ids",
    "is_snippet_id": "agent.tools.ids",
    "snippet_id": "agent.tools.ids",
    "LocalSearch": "agent.tools.local_search",
    "McpTool": "agent.tools.mcp_client",
    "BUILTIN_TOOL_NAMES": "agent.tools.names",
    "TOOL_ALIASES": "agent.tools.names",
    "build_tools": "agent.tools.registry",
    "resolve_tool_name": "agent.tools.names",
    "SearxngSearch": "agent.tools.searxng",
    "SnippetSearch": "agent.tools.semantic_scholar",
    "GoogleSearch": "agent.tools.serper",
    "WebPageFetcher": "agent.tools.web",
    "check_url": "agent.tools.web",
}

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "TOOL_ALIASES",
    "BrowseWebpage",
    "CallIdFactory",
    "CounterCallIds",
    "GoogleSearch",
    "LocalSearch",
    "McpTool",
    "SearxngSearch",
    "SnippetSearch",
    "WebPageFetcher",
    "build_tools",
    "check_url",
    "is_snippet_id",
    "resolve_tool_name",
    "snippet_id",
]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
