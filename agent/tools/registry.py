"""Which tools the model is offered (each web tool only when configured) and how tool-name aliases resolve."""

from __future__ import annotations

from collections.abc import Mapping

from agent.config import AgentConfig
from agent.protocols import SearchTool
from agent.tools.browse import BrowseWebpage
from agent.tools.local_search import LocalSearch
from agent.tools.searxng import SearxngSearch
from agent.tools.semantic_scholar import SnippetSearch
from agent.tools.serper import GoogleSearch
from agent.tools.web import WebPageFetcher
from store.doc_index import DocIndex

BUILTIN_TOOL_NAMES = frozenset({"local_search", "google_search", "snippet_search", "web_search", "browse_webpage"})
"""Names only the built-in tools may carry, configured or not (an MCP tool by one of these names is refused)."""

TOOL_ALIASES: Mapping[str, tuple[str, ...]] = {
    # alias (normalised: lower case, "-" and " " as "_") -> canonical names, first available wins
    "google_web_search": ("google_search", "web_search"),
    "google": ("google_search", "web_search"),
    "search": ("google_search", "web_search", "local_search"),
    "web_search": ("web_search", "google_search"),
    "searxng": ("web_search",),
    "scholar_search": ("snippet_search",),
    "semantic_scholar": ("snippet_search",),
    "paper_search": ("snippet_search",),
    "snippet": ("snippet_search",),
    "browse": ("browse_webpage",),
    "web_browse": ("browse_webpage",),
    "browse_url": ("browse_webpage",),
    "open_url": ("browse_webpage",),
    "fetch_url": ("browse_webpage",),
    "search_local": ("local_search",),
    "local": ("local_search",),
    "document_search": ("local_search",),
    "retrieve": ("local_search",),
}


def build_tools(
    cfg: AgentConfig, index: DocIndex | None, *, browse_allow_hosts: frozenset[str] = frozenset()
) -> dict[str, SearchTool]:
    """Fresh tool instances for one agent, keyed by canonical name.

    local_search needs an index; google_search a Serper key; snippet_search `s2_enabled`; web_search a SearXNG
    URL; browse_webpage `browse_enabled`. `browse_allow_hosts` exempts hosts from the SSRF address check and is
    meant for tests against 127.0.0.1 only.
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
        tools["browse_webpage"] = BrowseWebpage(fetcher)
    return tools


def normalise_tool_name(name: str) -> str:
    """Lower case, surrounding space and quotes removed, "-" and inner spaces as "_"."""
    return "_".join(name.strip().strip("\"'").lower().replace("-", " ").split())


def resolve_tool_name(name: str, tools: Mapping[str, SearchTool]) -> str | None:
    """The canonical name of an available tool that `name` refers to, or None if it names none of them."""
    if name in tools:
        return name
    key = normalise_tool_name(name)
    if key in tools:
        return key
    for candidate in TOOL_ALIASES.get(key, ()):
        if candidate in tools:
            return candidate
    return None
