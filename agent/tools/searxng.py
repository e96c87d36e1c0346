"""`web_search`: web results from a self-hosted SearXNG instance's JSON API (API_FACTS §8); free, no key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.errors import SearchError
from agent.tools.ids import snippet_id
from agent.tools.web import ServiceStatusError, clip, request_json, require_query
from store.records import Snippet

TIME_RANGES = frozenset({"day", "week", "month", "year"})


class SearxngSearch:
    """SearXNG metasearch; the instance must allow `format=json` (settings.yml search.formats)."""

    name = "web_search"
    description = 'Web search (SearXNG); argument: a query; optional time_range="year" and language="en".'

    def __init__(self, base_url: str, *, results: int = 5, snippet_chars: int = 700, timeout_s: float = 20.0) -> None:
        """Configure the instance root (e.g. http://127.0.0.1:8888) and how many results to keep."""
        self.url = base_url.rstrip("/") + "/search"
        self.results = results
        self.snippet_chars = snippet_chars
        self.timeout_s = timeout_s

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        """Run one search. Raises SearchError on bad attributes, timeouts, error statuses or malformed bodies."""
        params: dict[str, str | int] = {"q": require_query(self.name, query), "format": "json"}
        if (time_range := attrs.get("time_range")) is not None:
            if time_range.strip().lower() not in TIME_RANGES:
                raise SearchError(f"{self.name}: time_range must be one of day, week, month, year")
            params["time_range"] = time_range.strip().lower()
        if (language := attrs.get("language")) is not None:
            if not 2 <= len(language.strip()) <= 10 or not language.strip().replace("-", "").isalpha():
                raise SearchError(f'{self.name}: language must be a code such as "en" or "en-US"')
            params["language"] = language.strip()
        try:
            data = await request_json(self.name, "GET", self.url, timeout_s=self.timeout_s, params=params)
        except ServiceStatusError as exc:
            if exc.status_code == 403:  # JSON output is off by default in SearXNG's settings.yml
                raise ServiceStatusError(
                    f"{self.name}: the SearXNG instance does not allow JSON output", exc.status_code
                ) from exc
            raise
        return self._snippets(data, call_id)

    def _snippets(self, data: Any, call_id: str) -> list[Snippet]:
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise SearchError(f"{self.name}: the search service returned an unexpected response")
        out: list[Snippet] = []
        for result in data["results"]:
            if not isinstance(result, dict):
                continue
            title, content, url = (_text(result.get(key)) for key in ("title", "content", "url"))
            if not (title or content):
                continue
            out.append(
                Snippet(
                    id=snippet_id(call_id, len(out)),
                    tool=self.name,
                    title=title,
                    text=clip(content or title, self.snippet_chars),
                    url=url,
                )
            )
            if len(out) >= self.results:
                break
        return out


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""
