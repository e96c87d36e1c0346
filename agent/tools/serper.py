"""`google_search`: Google results through the Serper API (API_FACTS §8); the key travels only in a header."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agent.errors import SearchError
from agent.tools.ids import snippet_id
from agent.tools.web import clip, request_json, require_query
from store.records import Snippet

_LOCALE = re.compile(r"^[a-zA-Z]{2}([-_][a-zA-Z]{2,4})?$")


class GoogleSearch:
    """Serper web search: the answer box (if any) and the organic results, as snippets."""

    name = "google_search"
    description = 'Google web search; argument: a query; optional gl="us" (country) and hl="en" (language).'

    def __init__(
        self,
        api_key: str,
        *,
        url: str = "https://google.serper.dev/search",
        results: int = 5,
        snippet_chars: int = 700,
        timeout_s: float = 20.0,
    ) -> None:
        """Configure the endpoint, the key (sent as X-API-KEY) and how many results to keep."""
        self._api_key = api_key
        self.url = url
        self.results = results
        self.snippet_chars = snippet_chars
        self.timeout_s = timeout_s

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        """Run one search. Raises SearchError on bad attributes, timeouts, error statuses or malformed bodies."""
        body: dict[str, Any] = {"q": require_query(self.name, query), "num": max(10, self.results)}
        for key in ("gl", "hl"):
            value = attrs.get(key)
            if value is not None:
                if not _LOCALE.match(value.strip()):
                    raise SearchError(f'{self.name}: {key} must be a short code such as "us" or "en"')
                body[key] = value.strip().lower()
        data = await request_json(
            self.name,
            "POST",
            self.url,
            timeout_s=self.timeout_s,
            json_body=body,
            headers={"X-API-KEY": self._api_key, "Content-Type": "application/json"},
            secrets=[self._api_key],
        )
        return self._snippets(data, call_id)

    def _snippets(self, data: Any, call_id: str) -> list[Snippet]:
        if not isinstance(data, dict) or not isinstance(data.get("organic"), list):
            raise SearchError(f"{self.name}: the search service returned an unexpected response")
        items: list[tuple[str, str, str]] = []  # (title, text, url)
        box = data.get("answerBox")
        if isinstance(box, dict):
            text = _text(box.get("answer")) or _text(box.get("snippet"))
            if text:
                items.append((_text(box.get("title")) or "Answer box", text, _text(box.get("link"))))
        for result in data["organic"]:
            if not isinstance(result, dict):
                continue
            title, text, link = _text(result.get("title")), _text(result.get("snippet")), _text(result.get("link"))
            date = _text(result.get("date"))
            if title or text:
                items.append((title, f"{date} · {text}" if date and text else text or title, link))
            if len(items) >= self.results:
                break
        return [
            Snippet(id=snippet_id(call_id, i), tool=self.name, title=t, text=clip(x, self.snippet_chars), url=u)
            for i, (t, x, u) in enumerate(items[: self.results])
        ]


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""
