"""`snippet_search`: passages from scientific papers through the Semantic Scholar snippet search API (API_FACTS §8)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from agent.errors import SearchError
from agent.tools.ids import snippet_id
from agent.tools.web import clip, request_json, require_query
from store.records import Snippet

MAX_LIMIT = 50  # the API allows 1000; more than this would flood the model's context
_YEAR = re.compile(r"^(\d{4}|\d{4}-\d{4}|\d{4}-|-\d{4})$")
FIELDS_OF_STUDY = (
    "Computer Science", "Medicine", "Chemistry", "Biology", "Materials Science", "Physics", "Geology", "Psychology",
    "Art", "History", "Geography", "Sociology", "Business", "Political Science", "Economics", "Philosophy",
    "Mathematics", "Engineering", "Environmental Science", "Agricultural and Food Sciences", "Education", "Law",
    "Linguistics",
)  # fmt: skip
_FIELDS_BY_KEY = {f.lower(): f for f in FIELDS_OF_STUDY}


class SnippetSearch:
    """Semantic Scholar snippet search; each snippet is a passage with its paper's title."""

    name = "snippet_search"
    description = (
        'Search passages of scientific papers (Semantic Scholar); argument: a query; optional limit="5", '
        'year="2020-2024", fieldsOfStudy="Computer Science,Medicine".'
    )

    def __init__(
        self,
        api_key: str | None = None,
        *,
        url: str = "https://api.semanticscholar.org/graph/v1/snippet/search",
        results: int = 5,
        snippet_chars: int = 700,
        timeout_s: float = 20.0,
    ) -> None:
        """Configure the endpoint, the optional key (sent as x-api-key) and the default number of results."""
        self._api_key = api_key
        self.url = url
        self.results = results
        self.snippet_chars = snippet_chars
        self.timeout_s = timeout_s

    async def __call__(self, query: str, attrs: Mapping[str, str], call_id: str) -> Sequence[Snippet]:
        """Run one search. Raises SearchError on bad attributes, timeouts, error statuses or malformed bodies."""
        params = self._params(require_query(self.name, query), attrs)
        headers = {"x-api-key": self._api_key} if self._api_key else {}
        data = await request_json(
            self.name,
            "GET",
            self.url,
            timeout_s=self.timeout_s,
            params=params,
            headers=headers,
            secrets=[self._api_key] if self._api_key else [],
        )
        return self._snippets(data, call_id, int(params["limit"]))

    def _params(self, query: str, attrs: Mapping[str, str]) -> dict[str, str | int]:
        params: dict[str, str | int] = {"query": query, "limit": self.results}
        if (limit := attrs.get("limit")) is not None:
            if not limit.strip().isdigit() or not 1 <= int(limit) <= MAX_LIMIT:
                raise SearchError(f"{self.name}: limit must be a whole number from 1 to {MAX_LIMIT}")
            params["limit"] = int(limit)
        if (year := attrs.get("year")) is not None:
            if not _YEAR.match(year.strip()):
                raise SearchError(f'{self.name}: year must look like "2024", "2020-2024", "2019-" or "-2015"')
            params["year"] = year.strip()
        fields = attrs.get("fieldsOfStudy", attrs.get("fields_of_study"))
        if fields is not None:
            chosen = []
            for part in (p.strip() for p in fields.split(",")):
                if part.lower() not in _FIELDS_BY_KEY:
                    raise SearchError(f"{self.name}: unknown field of study {part!r}; use e.g. Computer Science")
                chosen.append(_FIELDS_BY_KEY[part.lower()])
            params["fieldsOfStudy"] = ",".join(chosen)
        return params

    def _snippets(self, data: Any, call_id: str, limit: int) -> list[Snippet]:
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise SearchError(f"{self.name}: the search service returned an unexpected response")
        out: list[Snippet] = []
        for item in data["data"]:
            snippet = item.get("snippet") if isinstance(item, dict) else None
            paper = item.get("paper") if isinstance(item, dict) else None
            text = snippet.get("text") if isinstance(snippet, dict) else None
            if not isinstance(text, str) or not text.strip():
                continue
            paper = paper if isinstance(paper, dict) else {}
            title = paper.get("title") if isinstance(paper.get("title"), str) else ""
            corpus_id = paper.get("corpusId")
            url = f"https://api.semanticscholar.org/CorpusId:{corpus_id}" if corpus_id not in (None, "") else ""
            out.append(
                Snippet(
                    id=snippet_id(call_id, len(out)),
                    tool=self.name,
                    title=str(title).strip(),
                    text=clip(text, self.snippet_chars),
                    url=url,
                )
            )
            if len(out) >= limit:
                break
        return out
