"""Serper, Semantic Scholar and SearXNG tools against a local server speaking each API's documented format."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest
from tools_support import LocalServer, Reply, free_port

from agent.errors import SearchError, ToolError
from agent.protocols import SearchTool
from agent.tools import GoogleSearch, SearxngSearch, SnippetSearch
from store.records import Snippet

SECRET = "sk-test-3f9a1c7e5b"
CALL = "0a1b2c3d"


def run(tool: SearchTool, query: str, attrs: dict[str, str] | None = None) -> Sequence[Snippet]:
    return asyncio.run(tool(query, attrs or {}, CALL))


# ---- Serper -------------------------------------------------------------------------------------------------------

SERPER_OK = {
    "searchParameters": {"q": "grpo", "gl": "us", "hl": "en", "num": 10, "type": "search", "engine": "google"},
    "answerBox": {"title": "GRPO", "answer": "Group Relative Policy Optimization", "link": "https://a.example/grpo"},
    "knowledgeGraph": {"title": "GRPO", "type": "Algorithm", "description": "An RL algorithm."},
    "organic": [
        {
            "title": "DeepSeekMath paper",
            "link": "https://arxiv.org/abs/2402.03300",
            "snippet": "We introduce GRPO, a variant of PPO.",
            "position": 1,
            "date": "Feb 5, 2024",
            "sitelinks": [{"title": "PDF", "link": "https://arxiv.org/pdf/2402.03300"}],
        },
        {"title": "GRPO explained", "link": "https://b.example/grpo", "snippet": "A blog post.", "position": 2},
        {"title": "Third", "link": "https://c.example/", "snippet": "x " * 1000, "position": 3},
    ],
    "peopleAlsoAsk": [{"question": "What is GRPO?", "snippet": "…", "title": "Q", "link": "https://q.example"}],
    "relatedSearches": [{"query": "grpo vs ppo"}],
    "credits": 1,
}


def serper(server: LocalServer, **kw: object) -> GoogleSearch:
    opts: dict[str, object] = {"url": f"{server.root}/search", "results": 5, "snippet_chars": 120, "timeout_s": 5.0}
    opts.update(kw)
    return GoogleSearch(SECRET, **opts)  # type: ignore[arg-type]


def test_serper_request_and_snippets(server: LocalServer) -> None:
    server.route("/search", Reply.json(SERPER_OK))
    snippets = run(serper(server), "  group relative   policy optimization ", {"gl": "DE", "hl": "de"})
    req = server.requests[-1]
    assert req.method == "POST"
    assert req.headers["x-api-key"] == SECRET
    assert req.headers["content-type"] == "application/json"
    assert req.json() == {"q": "group relative policy optimization", "num": 10, "gl": "de", "hl": "de"}
    assert [s.id for s in snippets] == [f"{CALL}-{i}" for i in range(4)]
    assert {s.tool for s in snippets} == {"google_search"}
    assert snippets[0].text == "Group Relative Policy Optimization"
    assert snippets[1].title == "DeepSeekMath paper"
    assert snippets[1].url == "https://arxiv.org/abs/2402.03300"
    assert snippets[1].text == "Feb 5, 2024 · We introduce GRPO, a variant of PPO."
    assert len(snippets[3].text) <= 120 and snippets[3].text.endswith("…")


def test_serper_keeps_at_most_results(server: LocalServer) -> None:
    server.route("/search", Reply.json(SERPER_OK))
    assert len(run(serper(server, results=2), "grpo")) == 2


def test_serper_minimal_response(server: LocalServer) -> None:
    server.route("/search", Reply.json({"searchParameters": {"q": "x"}, "organic": []}))
    assert run(serper(server), "x") == []


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (Reply.json({"message": "Internal error"}, status=500), "HTTP 500"),
        (Reply.json({"message": "slow down"}, status=429), "HTTP 429"),
        (Reply(200, b"<html>not json</html>", {"Content-Type": "text/html"}), "not JSON"),
        (Reply.json({"searchParameters": {}}), "unexpected response"),
        (Reply.json(["a", "list"]), "unexpected response"),
        (Reply(200, b'{"organic": [', {"Content-Type": "application/json"}), "not JSON"),
    ],
)
def test_serper_failures_are_tool_errors(server: LocalServer, reply: Reply, match: str) -> None:
    server.route("/search", reply)
    with pytest.raises(SearchError, match=match):
        run(serper(server), "q")


def test_serper_error_never_echoes_the_key(server: LocalServer) -> None:
    server.route("/search", Reply.json({"message": f"Invalid API key {SECRET}"}, status=403))
    with pytest.raises(SearchError) as info:
        run(serper(server), "q")
    assert SECRET not in str(info.value)
    assert "HTTP 403" in str(info.value) and "***" in str(info.value)


def test_serper_timeout(server: LocalServer) -> None:
    answer = threading.Event()  # the server answers only after the test: the client's timeout is certain to fire
    server.route("/search", Reply(200, b"{}", {"Content-Type": "application/json"}, hold=answer))
    try:
        with pytest.raises(SearchError, match="timed out after 0.3 s"):
            run(serper(server, timeout_s=0.3), "q")
    finally:
        answer.set()


def test_serper_unreachable(server: LocalServer) -> None:
    tool = GoogleSearch(SECRET, url=f"http://127.0.0.1:{free_port()}/search", timeout_s=2.0)
    with pytest.raises(SearchError, match="could not reach") as info:
        run(tool, "q")
    assert SECRET not in str(info.value)


def test_serper_huge_body(server: LocalServer) -> None:
    body = b"[" + b'"x",' * 2_000_000 + b'"x"]'  # ~8 MB
    server.route("/search", Reply(200, body, {"Content-Type": "application/json"}))
    with pytest.raises(SearchError, match="more than"):
        run(serper(server), "q")


@pytest.mark.parametrize("attrs", [{"gl": "united states"}, {"hl": "e"}, {"gl": "<script>"}])
def test_serper_bad_attrs(server: LocalServer, attrs: dict[str, str]) -> None:
    with pytest.raises(SearchError):
        run(serper(server), "q", attrs)
    assert server.requests == []


@pytest.mark.parametrize("query", ["", "   ", "\n\t", "x" * 2001])
def test_empty_or_huge_query_is_refused_before_any_request(server: LocalServer, query: str) -> None:
    with pytest.raises(ToolError):
        run(serper(server), query)
    assert server.requests == []


# ---- Semantic Scholar snippet search -------------------------------------------------------------------------------

S2_OK = {
    "data": [
        {
            "score": 0.56,
            "snippet": {
                "text": "We propose stage-structured rewards for research agents.",
                "snippetKind": "body",
                "section": "Conclusion",
                "snippetOffset": {"start": 24506, "end": 25694},
                "annotations": {
                    "sentences": [{"start": 0, "end": 57}],
                    "refMentions": [{"start": 3, "end": 10, "matchedPaperCorpusId": "7377848"}],
                },
            },
            "paper": {
                "corpusId": "19170988",
                "title": "A Paper on Rubrics",
                "authors": ["A. Author", "B. Author"],
                "openAccessInfo": {"license": "CCBY", "status": "HYBRID", "disclaimer": "…"},
            },
        },
        {"score": 0.4, "snippet": {"text": "Second passage.", "snippetKind": "abstract"}, "paper": {"corpusId": "42"}},
        {"score": 0.3, "snippet": {"text": "", "snippetKind": "title"}, "paper": {"corpusId": "43", "title": "Empty"}},
    ],
    "retrievalVersion": "v1",
}


def s2(server: LocalServer, key: str | None = SECRET) -> SnippetSearch:
    return SnippetSearch(key, url=f"{server.root}/graph/v1/snippet/search", results=5, timeout_s=5.0)


def test_s2_request_and_snippets(server: LocalServer) -> None:
    server.route("/graph/v1/snippet/search", Reply.json(S2_OK))
    attrs = {"limit": "3", "year": "2020-2024", "fieldsOfStudy": "computer science, Medicine"}
    snippets = run(s2(server), "rubric rewards", attrs)
    req = server.requests[-1]
    assert req.method == "GET"
    assert req.headers["x-api-key"] == SECRET
    assert req.query == {
        "query": ["rubric rewards"],
        "limit": ["3"],
        "year": ["2020-2024"],
        "fieldsOfStudy": ["Computer Science,Medicine"],
    }
    assert [s.id for s in snippets] == [f"{CALL}-0", f"{CALL}-1"]  # the empty snippet is skipped
    assert snippets[0].title == "A Paper on Rubrics"
    assert snippets[0].url == "https://api.semanticscholar.org/CorpusId:19170988"
    assert snippets[0].tool == "snippet_search"
    assert snippets[1].title == "" and snippets[1].text == "Second passage."


def test_s2_without_key_sends_no_key_header(server: LocalServer) -> None:
    server.route("/graph/v1/snippet/search", Reply.json({"data": []}))
    assert run(s2(server, key=None), "q") == []
    assert "x-api-key" not in server.requests[-1].headers
    assert server.requests[-1].query["limit"] == ["5"]


def test_s2_error_body_is_shown(server: LocalServer) -> None:
    server.route("/graph/v1/snippet/search", Reply.json({"error": "Unrecognized field: foo"}, status=400))
    with pytest.raises(SearchError, match="HTTP 400: Unrecognized field: foo"):
        run(s2(server), "q")


@pytest.mark.parametrize(
    "attrs",
    [{"limit": "0"}, {"limit": "many"}, {"limit": "51"}, {"year": "last year"}, {"year": "20-21"},
     {"fieldsOfStudy": "Astrology"}],
)  # fmt: skip
def test_s2_bad_attrs(server: LocalServer, attrs: dict[str, str]) -> None:
    with pytest.raises(SearchError):
        run(s2(server), "q", attrs)
    assert server.requests == []


def test_s2_5xx(server: LocalServer) -> None:
    server.route("/graph/v1/snippet/search", Reply(503, b"upstream down", {"Content-Type": "text/plain"}))
    with pytest.raises(SearchError, match="HTTP 503"):
        run(s2(server), "q")


# ---- SearXNG ------------------------------------------------------------------------------------------------------

SEARX_OK = {
    "query": "rubric",
    "results": [
        {
            "url": "https://en.wikipedia.org/wiki/Rubric",
            "title": "Rubric - Wikipedia",
            "content": "A rubric is a scoring guide.",
            "engine": "duckduckgo",
            "engines": ["duckduckgo", "brave"],
            "positions": [1, 2],
            "score": 2.5,
            "category": "general",
            "template": "default.html",
            "parsed_url": ["https", "en.wikipedia.org", "/wiki/Rubric", "", "", ""],
            "thumbnail": "",
            "img_src": "",
            "publishedDate": None,
        },
        {"url": "https://b.example/", "title": "No content", "content": ""},
        {"url": "https://c.example/", "title": "", "content": ""},
    ],
    "answers": [],
    "corrections": [],
    "infoboxes": [],
    "suggestions": ["rubric meaning"],
    "unresponsive_engines": [["google", "timeout"]],
}


def searx(server: LocalServer) -> SearxngSearch:
    return SearxngSearch(server.root + "/", results=5, timeout_s=5.0)


def test_searxng_request_and_snippets(server: LocalServer) -> None:
    server.route("/search", Reply.json(SEARX_OK))
    snippets = run(searx(server), "rubric", {"time_range": "Year", "language": "en-US"})
    assert server.requests[-1].query == {
        "q": ["rubric"],
        "format": ["json"],
        "time_range": ["year"],
        "language": ["en-US"],
    }
    assert [(s.id, s.title, s.url) for s in snippets] == [
        (f"{CALL}-0", "Rubric - Wikipedia", "https://en.wikipedia.org/wiki/Rubric"),
        (f"{CALL}-1", "No content", "https://b.example/"),
    ]
    assert snippets[0].text == "A rubric is a scoring guide." and snippets[0].tool == "web_search"


def test_searxng_json_disabled_403(server: LocalServer) -> None:
    server.route("/search", Reply(403, b"Forbidden", {"Content-Type": "text/html"}))
    with pytest.raises(SearchError, match="does not allow JSON output"):
        run(searx(server), "q")


def test_searxng_bad_time_range(server: LocalServer) -> None:
    with pytest.raises(SearchError, match="time_range"):
        run(searx(server), "q", {"time_range": "decade"})
