"""Which tools the model is offered (each web tool only when configured) and how tool-name aliases resolve."""

from __future__ import annotations

from agent.config import AgentConfig
from agent.protocols import SearchTool
from agent.tools.browse import BrowseWebpage
from agent.tools.local_search import LocalSearch
from agent.tools.names import BUILTIN_TOOL_NAMES, TOOL_ALIASES, normalise_tool_name, resolve_tool_name
from agent.tools.searxng import SearxngSearch
from agent.tools.semantic_scholar import SnippetSearch
from agent.tools.serper import GoogleSearch
from agent.tools.web import WebPageFetcher
from store.doc_index import DocIndex

__all__ = ["BUILTIN_TOOL_NAMES", "TOOL_ALIASES", "build_tools", "normalise_tool_name", "resolve_tool_name"]


def build_tools(
    cfg: AgentConfig, index: DocIndex | None, *, browse_allow_hosts: frozenset[str] = frozenset()
) -> dict[str, SearchTool]:
    """Fresh tool instances for one agent, keyed by canonical name.

    local_search needs an index; google_search a Serper key; snippet_search `s2_enabled`; web_search a SearXNG
    URL; browse_webpage `browse_enabled` (opening URLs within `browse_scope`). `browse_allow_hosts` exempts hosts
    from the SSRF address check and is meant for tests against 127.0.0.1 only.
    """
    n, chars, timeout = cfg.search_results, cfg.snippet_chars, cfg.tool_timeout_s
    tools: dict[str, SearchTool] = {}
    if index is not None:
        tools["local_search"] = LocalSearch(index, k=cfg.local_search_k, snippet_chars=chars)
    if cfg.serper_api_key is not None and cfg.serper_api_key.get_secret_value():
        tools["google_search"] = GoogleSearch(
            cfg.serper_api_key.get_secret_value(), url=cfg.serper_url, results=n, snippet_chars=chars, timeout_s=timeout
        )
    if cfg.s2_enabled:
        key = cfg.s2_api_key.get_secret_value() if cfg.s2_api_key is not None else None
        tools["snippet_search"] = SnippetSearch(
            key or None, url=cfg.s2_url, results=n, snippet_chars=chars, timeout_s=timeout
        )
    if cfg.searxng_url:
        tools["web_search"] = SearxngSearch(cfg.searxng_url, results=n, snippet_chars=chars, timeout_s=timeout)
    if cfg.browse_enabled:
        fetcher = WebPageFetcher(
            timeout_s=cfg.tool_timeout_s,
            max_bytes=cfg.browse_max_bytes,
            max_redirects=cfg.browse_max_redirects,
            allow_hosts=browse_allow_hosts,
        )
        tools["browse_webpage"] = BrowseWebpage(fetcher, url_scope=cfg.browse_scope)
    return tools
