"""browse_webpage against real local pages; call/snippet ids; the tool registry and its aliases."""

from __future__ import annotations

import asyncio
import re

import pytest
from pydantic import SecretStr
from tools_support import LocalServer, Reply, free_port

from agent.config import AgentConfig
from agent.errors import SearchError, ToolError, UnsafeURLError
from agent.protocols import SearchTool
from agent.tools import (
    BrowseWebpage,
    CallIdFactory,
    CounterCallIds,
    WebPageFetcher,
    build_tools,
    is_snippet_id,
    resolve_tool_name,
    snippet_id,
)
from store.config import StoreConfig
from store.doc_index import DocIndex

ARTICLE = """<!doctype html><html><head><title>Zebra facts</title></head><body>
<nav><a href="/">Home</a> <a href="/about">About</a> <a href="/shop">Shop</a></nav>
<article><h1>The plains zebra</h1>
<p>The plains zebra is the most common and geographically widespread species of zebra. It ranges from the south of
Ethiopia through East Africa to as far south as Botswana and eastern South Africa.</p>
<p>Plains zebras are highly social and usually form small harems consisting of a single stallion, several mares and
their recent offspring. Groups may come together to form large herds.</p>
</article><footer>Copyright 2024 Zebra Fan Club. All rights reserved.</footer></body></html>"""


def browse(**kw: object) -> BrowseWebpage:
    fetcher = WebPageFetcher(allow_hosts=frozenset({"127.0.0.1"}), timeout_s=5.0, max_bytes=200_000)
    return BrowseWebpage(fetcher, **kw)  # type: ignore[arg-type]


def test_browse_returns_main_text(server: LocalServer) -> None:
    server.route("/zebra", Reply.html(ARTICLE))
    [snip] = asyncio.run(browse()(f"{server.root}/zebra", {}, "cafe0001"))
    assert snip.id == "cafe0001-0"
    assert snip.tool == "browse_webpage"
    assert snip.url == f"{server.root}/zebra"
    assert "harems consisting of a single stallion" in snip.text
    assert "Shop" not in snip.text  # navigation removed by main-text extraction
    assert snip.title in {"Zebra facts", "The plains zebra"}


def test_browse_caps_text_and_reads_plain_text(server: LocalServer) -> None:
    server.route("/notes.txt", Reply(200, ("word " * 5000).encode(), {"Content-Type": "text/plain"}))
    [snip] = asyncio.run(browse(max_chars=300)(f"<{server.root}/notes.txt>", {}, "cafe0002"))
    assert len(snip.text) <= 300 and snip.text.startswith("word word")


def test_browse_follows_redirect_and_reports_final_url(server: LocalServer) -> None:
    server.route("/old", Reply(301, headers={"Location": "/zebra"}))
    server.route("/zebra", Reply.html(ARTICLE))
    [snip] = asyncio.run(browse()(f"{server.root}/old", {}, "cafe0003"))
    assert snip.url == f"{server.root}/zebra"


@pytest.mark.parametrize(
    ("reply", "error", "match"),
    [
        (Reply(404, b"nope", {"Content-Type": "text/html"}), SearchError, "HTTP 404"),
        (Reply(500, b"boom", {"Content-Type": "text/html"}), SearchError, "HTTP 500"),
        (Reply(200, b"\x89PNG\r\n\x1a\n", {"Content-Type": "image/png"}), SearchError, "image/png"),
        (Reply.html("<html><body></body></html>"), SearchError, "no readable text"),
        (Reply(200, b"<p>" + b"z" * 300_000, {"Content-Type": "text/html"}), UnsafeURLError, "larger than"),
    ],
)
def test_browse_failures_are_tool_errors(server: LocalServer, reply: Reply, error: type[ToolError], match: str) -> None:
    server.route("/p", reply)
    with pytest.raises(error, match=match):
        asyncio.run(browse()(f"{server.root}/p", {}, "cafe0004"))


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://169.254.169.254/", "ftp://x.example/", "", "  "])
def test_browse_refuses_bad_urls(url: str) -> None:
    with pytest.raises(ToolError):
        asyncio.run(BrowseWebpage(WebPageFetcher())(url, {}, "cafe0005"))


def test_browse_unreachable_port_is_a_tool_error() -> None:
    with pytest.raises(SearchError, match="could not fetch"):
        asyncio.run(browse()(f"http://127.0.0.1:{free_port()}/", {}, "cafe0006"))


# ---- ids --------------------------------------------------------------------------------------------------------


def test_call_ids_are_8_hex_and_unique() -> None:
    ids = CallIdFactory()
    issued = [ids() for _ in range(2000)]
    assert all(re.fullmatch(r"[0-9a-f]{8}", i) for i in issued)
    assert len(set(issued)) == len(issued)


def test_seeded_and_counter_ids_are_reproducible() -> None:
    a, b = CallIdFactory(seed=7), CallIdFactory(seed=7)
    assert [a() for _ in range(5)] == [b() for _ in range(5)]
    c = CounterCallIds()
    assert [c(), c(), c()] == ["00000000", "00000001", "00000002"]
    assert c.issued == frozenset({"00000000", "00000001", "00000002"})


def test_snippet_ids() -> None:
    assert snippet_id("a1b2c3d4", 0) == "a1b2c3d4-0"
    assert is_snippet_id("a1b2c3d4-12") and not is_snippet_id("a1b2c3d4-01") and not is_snippet_id("S_123")
    with pytest.raises(ValueError):
        snippet_id("XYZ", 0)
    with pytest.raises(ValueError):
        snippet_id("a1b2c3d4", -1)


# ---- registry ---------------------------------------------------------------------------------------------------


def test_build_tools_offers_only_configured_tools(tmp_path: object) -> None:
    assert build_tools(AgentConfig(), None) == {}
    cfg = AgentConfig(
        serper_api_key=SecretStr("k"), s2_enabled=True, searxng_url="http://127.0.0.1:1", browse_enabled=True
    )
    tools = build_tools(cfg, None)
    assert sorted(tools) == ["browse_webpage", "google_search", "snippet_search", "web_search"]
    for name, tool in tools.items():
        assert isinstance(tool, SearchTool)
        assert tool.name == name and tool.description and "\n" not in tool.description
    assert "google_search" not in build_tools(AgentConfig(serper_api_key=SecretStr("")), None)
    assert build_tools(cfg, None)["google_search"] is not tools["google_search"]  # fresh instances per call


def test_build_tools_with_index(store_config: StoreConfig) -> None:
    tools = build_tools(AgentConfig(local_search_k=3), DocIndex(store_config))
    assert list(tools) == ["local_search"]
    assert tools["local_search"].k == 3  # type: ignore[attr-defined]


def test_resolve_tool_name_aliases() -> None:
    cfg = AgentConfig(serper_api_key=SecretStr("k"), s2_enabled=True, browse_enabled=True)
    tools = build_tools(cfg, None)
    assert resolve_tool_name("google_search", tools) == "google_search"
    assert resolve_tool_name("google_web_search", tools) == "google_search"
    assert resolve_tool_name("search", tools) == "google_search"
    assert resolve_tool_name("Scholar_Search", tools) == "snippet_search"
    assert resolve_tool_name("browse", tools) == "browse_webpage"
    assert resolve_tool_name("web-browse", tools) == "browse_webpage"
    assert resolve_tool_name(" Google_Search ", tools) == "google_search"
    assert resolve_tool_name("search_local", tools) is None  # no index configured
    assert resolve_tool_name("rm -rf", tools) is None
    assert resolve_tool_name("", tools) is None
    searx_only = build_tools(AgentConfig(searxng_url="http://127.0.0.1:1"), None)
    assert resolve_tool_name("search", searx_only) == "web_search"
    assert resolve_tool_name("google_search", searx_only) is None
