"""Markup through the answer, in a real browser (issue 46, finding 1): a real `rubricem ui` (SQLite, embedded
Chroma, a vLLM policy URL that is never called: no model loads) shows stored sessions to Debian's Chromium, and a
local HTTP server counts what the page fetches from it.

The answer and references panels are HTML handed to Streamlit's Markdown renderer. A raw-HTML block ends at its
first blank line, so a blank line inside a model-written fenced block, or inside a non-web `Snippet.url`, would hand
the rest back to the Markdown parser, and `![x](http://...)` there would become an `<img>` every viewer fetches.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from store.config import StoreConfig
from store.doc_index import DocIndex, Document
from store.session_log import SessionLog
from tests.judge.builders import store_session, trajectory
from tests.ui.test_ui_browser import ARGS, ARTIFACTS, CHROMIUM, RUN_TIMEOUT_MS, running_ui

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed"),
]

CITED = 'Books were translated into <cite id="abcd0001-0">Latin</cite>.'


@dataclass
class Pixel:
    """A loopback HTTP server that answers every GET with a 1x1 GIF and keeps the paths it was asked for."""

    url: str
    paths: list[str] = field(default_factory=list)


_GIF = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")


@pytest.fixture
def pixel() -> Iterator[Pixel]:
    seen = Pixel("")

    class Count(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            seen.paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "image/gif")
            self.send_header("Content-Length", str(len(_GIF)))
            self.end_headers()
            self.wfile.write(_GIF)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Count)
    seen.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _crafted_sessions(data: Path, pixel: Pixel) -> dict[str, str]:
    """Two finished sessions: one whose answer holds a fenced block with a blank line before an image, one whose
    cited source has a non-web URL with a blank line before an image. Both images point at the counting server."""
    fenced = f"{CITED}\n\n```\nquoted from the page\n\n![a]({pixel.url}/answer.png)\n```"
    plain = trajectory("sess-url", answer=CITED)
    (call,) = plain.tool_calls
    (snip,) = call.snippets
    bad_url = replace(snip, url=f"file:notes\n\n![u]({pixel.url}/url.png)")
    crafted_url = replace(plain, tool_calls=(replace(call, snippets=(bad_url,)),))
    with SessionLog(data / "rubricem.sqlite3") as log:
        return {"answer": store_session(log, trajectory("sess-answer", answer=fenced)),
                "url": store_session(log, crafted_url)}


def _own_document(data: Path) -> None:
    """One document of the user's own (with a made-up vector), so the UI does not index the bundled demo corpus."""
    index = DocIndex(StoreConfig(data_dir=data))
    index.add_documents([Document(source="test:own", chunk=0, text="Haymo was a Franciscan.", title="Haymo")],
                        embeddings=[[1.0] + [0.0] * 383])


@pytest.fixture
def ui_without_model(tmp_path: Path, pixel: Pixel) -> Iterator[tuple[str, dict[str, str]]]:
    """`rubricem ui` over a data dir holding the crafted sessions; the policy is a vLLM URL nobody listens on."""
    data = tmp_path / "data"
    data.mkdir()
    _own_document(data)
    sessions = _crafted_sessions(data, pixel)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUBRICEM_")} | {
        "HF_HUB_OFFLINE": "1",
        "RUBRICEM_STORE__DATA_DIR": str(data),
        "RUBRICEM_AGENT__POLICY_BACKEND": "vllm",
        "RUBRICEM_AGENT__POLICY_BASE_URL": f"http://127.0.0.1:{_closed_port()}",
    }
    with running_ui(tmp_path, env) as url:
        yield url, sessions


def test_blank_lines_in_an_answer_or_a_source_url_make_the_browser_fetch_nothing(
        ui_without_model: tuple[str, dict[str, str]], pixel: Pixel) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, sessions = ui_without_model
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            controls: list[str] = []
            drawn: dict[str, tuple[int, str]] = {}
            for name, sid in sessions.items():
                page.goto(f"{url}/?session={sid}")
                reference = page.locator("li.ref").first
                reference.wait_for(timeout=RUN_TIMEOUT_MS)  # the first visit builds the services
                expect(page.locator("div.answer").first).to_contain_text("Books were translated into Latin")
                # Streamlit draws a fenced block through a component it loads lazily: on a busy machine the block is
                # still empty for a moment after the answer's text shows. Wait until each crafted text is drawn, so
                # the image count and the text below are read from the finished page.
                crafted = page.locator("div.answer pre").first if name == "answer" else reference
                expect(crafted).to_contain_text("quoted from the page" if name == "answer" else "file:notes")
                # The control: an image this page does load reaches the counter. The crafted panels were drawn
                # before it, so an image of theirs would have been asked for first.
                controls.append(f"/control-{name}.png")
                page.evaluate("src => { const i = new Image(); i.src = src; document.body.appendChild(i); }",
                              pixel.url + controls[-1])
                expect(page.locator(f"img[src='{pixel.url}{controls[-1]}']")).to_have_js_property("complete", True)
                page.screenshot(path=str(ARTIFACTS / f"markup-{name}.png"), full_page=True)
                images = page.locator("img[src$='/answer.png'], img[src$='/url.png']").count()
                drawn[name] = (images, page.locator("div.answer").first.inner_text() + reference.inner_text())
        finally:
            browser.close()
    assert pixel.paths == controls  # nothing but the controls was fetched, from either page
    assert [images for images, _ in drawn.values()] == [0, 0]
    # ... and the crafted text is drawn whole, as text: the fenced block as code, the URL in the references
    assert f"quoted from the page\n\n![a]({pixel.url}/answer.png)" in drawn["answer"][1]
    assert f"![u]({pixel.url}/url.png)" in drawn["url"][1]
