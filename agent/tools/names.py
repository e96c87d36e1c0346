"""Tool names and their aliases: pure data and string functions, no tool imported.

Separate from `agent.tools.registry` (which builds the tools, and so imports the search index, HTTP clients and
Chroma) so that parsing a trajectory (`learning.sft`, `agent.nodes.tools`) costs no heavy import.
"""

from __future__ import annotations

from collections.abc import Mapping

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


def normalise_tool_name(name: str) -> str:
    """Lower case, surrounding space and quotes removed, "-" and inner spaces as "_"."""
    return "_".join(name.strip().strip("\"'").lower().replace("-", " ").split())


def resolve_tool_name(name: str, tools: Mapping[str, object]) -> str | None:
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
