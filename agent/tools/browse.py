"""`browse_webpage`: fetch one URL through the SSRF-guarded fetcher and return its main text (trafilatura)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from agent.errors import SearchError
from agent.tools.ids import snippet_id
from agent.tools.scope import BrowseScope
from agent.tools.web import FetchedPage, WebPageFetcher, clip
from store.records import Snippet

DEFAULT_PAGE_CHARS = 4000
"""Page text kept per call: about 600-700 words, enough for a section and small next to the context window."""


class BrowseWebpage:
    """Fetch a page and return its main text as one snippet (id `{call_id}-0`)."""

    name = "browse_webpage"
    description = "Read a web page; argument: its URL (http or https). Returns the page's main text."

    def __init__(self, fetcher: WebPageFetcher, max_chars: int = DEFAULT_PAGE_CHARS,
                 url_scope: BrowseScope = "seen") -> None:
        """Use `fetcher` (which owns the SSRF guard and its caps); keep at most `max_chars` of text.

        `url_scope` ("seen": only URLs the run has already seen; "any") is enforced by the tools node, which knows
        the run (agent/tools/scope.py); a direct call fetches whatever it is given.
        """
        self.fetcher = fetcher
        self.max_chars = max_chars
        self.url_scope: BrowseScope = url_scope

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        """Fetch the URL in `query`. Raises UnsafeURLError for refused URLs, SearchError for fetch failures."""
        url = query.strip().strip("<>\"'` ")
        if not url:
            raise SearchError(f"{self.name}: give the URL to read between the call_tool tags")
        if "://" not in url:
            url = "https://" + url  # models often write bare domains
        page = await self.fetcher.fetch(url)
        title, text = await asyncio.to_thread(extract_page, page)  # parsing HTML is CPU work
        if not text.strip():
            raise SearchError(f"{self.name}: the page has no readable text")
        return [
            Snippet(
                id=snippet_id(call_id, 0), tool=self.name, title=title, text=clip(text, self.max_chars), url=page.url
            )
        ]


def extract_page(page: FetchedPage) -> tuple[str, str]:
    """Title and main text of a fetched page.

    Uses trafilatura's main-text extraction, all visible text for pages too small for it, or the body itself for
    text/plain.
    """
    import trafilatura  # lazy: only browsing needs lxml

    if page.content_type == "text/plain":
        return page.url, page.body.decode(page.encoding or "utf-8", errors="replace")
    html: str | bytes = page.body.decode(page.encoding, errors="replace") if page.encoding else page.body
    text = trafilatura.extract(html, url=page.url, include_comments=False, include_tables=True, favor_recall=True)
    if not text or not text.strip():
        text = trafilatura.html2txt(html)
    meta = trafilatura.extract_metadata(html, default_url=page.url)
    title = meta.title if meta is not None and meta.title else page.url
    return title, text or ""
