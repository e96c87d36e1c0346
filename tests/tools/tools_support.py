"""Test support for the tool tests: a scriptable threaded HTTP server on 127.0.0.1 and its request/reply types."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from agent.ingest import load_demo_corpus
from store.doc_index import Document
from tests.servers import free_port

__all__ = ["LocalServer", "Reply", "Request", "assemble_pdf", "free_port", "make_pdf", "sample_passages"]


@dataclass(frozen=True)
class Request:
    """What the local server received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> object:
        """The body parsed as JSON."""
        return json.loads(self.body)


@dataclass
class Reply:
    """What a route answers. `chunks` (if given) is streamed instead of `body`, `delay_s` passes before any byte.

    `hold`: no byte is sent until this event is set, so a client's timeout fires first whatever the machine's load
    (set it when the test ends, e.g. in a `finally`).
    """

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Iterable[bytes] | None = None
    chunk_delay_s: float = 0.0
    delay_s: float = 0.0
    hold: threading.Event | None = None

    @staticmethod
    def json(obj: object, status: int = 200) -> Reply:
        """A JSON reply."""
        return Reply(status, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    @staticmethod
    def html(text: str, status: int = 200) -> Reply:
        """An HTML reply."""
        return Reply(status, text.encode(), {"Content-Type": "text/html; charset=utf-8"})


Handler = Callable[[Request], Reply]


class LocalServer:
    """A threaded stdlib HTTP server on 127.0.0.1 whose routes the tests set; records every request."""

    def __init__(self) -> None:
        """Start serving on a free port in a daemon thread."""
        self.routes: dict[str, Handler] = {}
        self.requests: list[Request] = []
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep test output clean

            def _serve(self) -> None:
                split = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                req = Request(
                    method=self.command,
                    path=split.path,
                    query=parse_qs(split.query),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=self.rfile.read(length) if length else b"",
                )
                server.requests.append(req)
                handler = server.routes.get(split.path)
                reply = handler(req) if handler else Reply(404, b"not found", {"Content-Type": "text/plain"})
                time.sleep(reply.delay_s)
                if reply.hold is not None:
                    reply.hold.wait()
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    if reply.chunks is None:
                        if "Content-Length" not in reply.headers:
                            self.send_header("Content-Length", str(len(reply.body)))
                        self.end_headers()
                        self.wfile.write(reply.body)
                        return
                    self.send_header("Connection", "close")  # body ends when the connection closes
                    self.end_headers()
                    for chunk in reply.chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        time.sleep(reply.chunk_delay_s)
                    self.close_connection = True
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (size or time cap): that is what the test wanted

            do_GET = _serve
            do_POST = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def root(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT."""
        return f"http://127.0.0.1:{self.port}"

    def route(self, path: str, handler: Handler | Reply) -> None:
        """Answer `path` with a handler function or a fixed reply."""
        self.routes[path] = handler if callable(handler) else (lambda _req, r=handler: r)

    def close(self) -> None:
        """Stop serving."""
        self._httpd.shutdown()
        self._httpd.server_close()


def make_pdf(lines: list[str], title: str = "") -> bytes:
    """A minimal valid one-page PDF showing `lines` in Helvetica (hand-built: no PDF writer needed)."""

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    ops = ["BT", "/F1 11 Tf", "72 740 Td", "14 TL"] + [f"({esc(line)}) Tj T*" for line in lines] + ["ET"]
    stream = "\n".join(ops).encode("latin-1") if lines else b""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>"
        ),
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Title (" + esc(title).encode("latin-1") + b") >>",
    ]
    return assemble_pdf(objects, info=6)


def assemble_pdf(objects: list[bytes], info: int | None = None) -> bytes:
    """A PDF file of `objects` (numbered from 1, the catalog first) with its cross-reference table and trailer;
    `info` names the document-information object, if any."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    info_ref = b" /Info %d 0 R" % info if info is not None else b""
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, info_ref, xref)
    return bytes(out)


def sample_passages(n: int = 40) -> list[Document]:
    """The first `n` MuSiQue passages of the bundled demo corpus, under a test source name."""
    docs = load_demo_corpus(["musique_train_corpus.json"])[:n]
    return [Document(source="test:musique", chunk=d.chunk, text=d.text, title=d.title) for d in docs]
