"""Which URLs `browse_webpage` may open in a run: by default only those already seen in it.

The model's context holds text written by others: web pages, search results, ingested documents, MCP results and
other people's reflections from the rubric bank. Any of it can tell the model to "read" a URL that carries the
context in its query (`https://attacker/?q=<what the model just read>`), and a fetch of that URL is the leak. With
the default scope `"seen"` a URL is fetched only when it appeared in the question or in an earlier tool result of the
same run (a search hit's link, a page's text): a planted link can still be followed, but no URL the model composes
can carry new data out. `AgentConfig.browse_scope = "any"` lifts the limit (the SSRF guard applies either way).

Pure string functions (no HTTP client imported), so the tools node stays light.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import SplitResult, urlsplit

from store.records import ToolCallRecord

BrowseScope = Literal["seen", "any"]

_URL = re.compile(r"(?:https?://|www\.)[^\s<>\"'`]+", re.IGNORECASE)
_TRAILING = ".,;:!?)]}'\""  # sentence punctuation that ends a URL written in prose
_DEFAULT_PORTS = {80, 443}

REFUSED = ("browse_webpage opens only URLs that appeared in the question or in earlier tool output of this run "
           "(search results, pages read before): search first, then browse one of the result URLs exactly as given")


@runtime_checkable
class UrlScoped(Protocol):
    """A tool that opens URLs and says which ones it may open (`browse_webpage`)."""

    url_scope: BrowseScope


def _parse(text: str) -> tuple[tuple[str, str, str], SplitResult] | None:
    """The key of a URL as written (see url_key) and its split form (a bare domain taken as https)."""
    value = html.unescape(text.strip().strip("<>\"'` ")).rstrip(_TRAILING)
    if "://" not in value:
        value = "https://" + value
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        return None
    where = f"{host}:{port}" if port is not None and port not in _DEFAULT_PORTS else host
    return (where, parts.path.rstrip("/"), parts.query), parts


def url_key(text: str) -> tuple[str, str, str] | None:
    """(host[:port], path without trailing slash, query) of a URL as written, or None when it names no host.

    The scheme is not part of the key (a bare domain is browsed as https, a result may say http), nor is the
    fragment (it never reaches the server). The query is: it is where leaked text would travel.
    """
    parsed = _parse(text)
    return None if parsed is None else parsed[0]


def approved_url(text: str) -> str | None:
    """The URL that is fetched once `text` passed the "seen" check: rebuilt from the very parts the check compared
    (host, port, path, query), so nothing the comparison ignored (trailing punctuation, entities, extra slashes, a
    fragment) can ride along to the server. None when `text` names no host."""
    parsed = _parse(text)
    if parsed is None:
        return None
    (where, path, query), parts = parsed
    scheme = parts.scheme.lower() if parts.scheme.lower() in ("http", "https") else "https"
    slash = "/" if parts.path.endswith("/") else ""
    return f"{scheme}://{where}{path}{slash}" + (f"?{query}" if query else "")


def urls_in(texts: Iterable[str]) -> frozenset[tuple[str, str, str]]:
    """The keys of every URL written in `texts`."""
    keys = set()
    for text in texts:
        for match in _URL.finditer(text or ""):
            if (key := url_key(match.group(0))) is not None:
                keys.add(key)
    return frozenset(keys)


def seen_urls(question: str, calls: Iterable[ToolCallRecord]) -> frozenset[tuple[str, str, str]]:
    """URLs a run has seen so far: in its question, and in its tool results (links, titles and texts)."""
    texts = [question]
    for call in calls:
        for s in call.snippets:
            texts += [s.url, s.title, s.text]
    return urls_in(texts)


def browse_refusal(query: str, seen: frozenset[tuple[str, str, str]]) -> str | None:
    """Why the URL in `query` may not be opened under the "seen" scope (None: it may; a query that names no URL is
    left to the tool, which says what to write)."""
    if not query.strip():
        return None
    key = url_key(query)
    return None if key is not None and key in seen else REFUSED
