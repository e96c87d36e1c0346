"""The agent's tools: local document search, web and paper search APIs, guarded page browsing and MCP servers' tools."""

from agent.tools.browse import BrowseWebpage
from agent.tools.ids import CallIdFactory, CounterCallIds, is_snippet_id, snippet_id
from agent.tools.local_search import LocalSearch
from agent.tools.mcp_client import McpTool
from agent.tools.registry import BUILTIN_TOOL_NAMES, TOOL_ALIASES, build_tools, resolve_tool_name
from agent.tools.searxng import SearxngSearch
from agent.tools.semantic_scholar import SnippetSearch
from agent.tools.serper import GoogleSearch
from agent.tools.web import WebPageFetcher, check_url

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
