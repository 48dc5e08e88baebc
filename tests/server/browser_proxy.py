"""A forwarding proxy for the console's browser tests that can play a server dying: in front of a live server, it
passes every request through, or, when told, breaks the chat stream after its first frame (a chunked body with
no end, as when the process behind it is killed) or drops connections unanswered (a server that is down)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

HOP_BY_HOP = {"connection", "transfer-encoding", "content-length", "content-encoding", "keep-alive"}


class FaultyProxy:
    def __init__(self, target: str) -> None:
        self.target = target
        self.mode = "pass"
        """pass | break-stream (chat completions only) | down (every request)."""
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                proxy.forward(self)

            def do_POST(self) -> None:
                proxy.forward(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FaultyProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def forward(self, handler: BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        if self.mode == "down":
            return  # the connection closes with no answer
        length = int(handler.headers.get("content-length") or 0)
        body = handler.rfile.read(length) if length else None
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in HOP_BY_HOP | {"accept-encoding"}}
        cut = self.mode == "break-stream" and handler.path == "/v1/chat/completions"
        with httpx.stream(handler.command, self.target + handler.path, content=body, headers=headers, timeout=60) as r:
            handler.send_response(r.status_code)
            for name, value in r.headers.multi_items():
                if name.lower() not in HOP_BY_HOP:
                    handler.send_header(name, value)
            handler.send_header("Transfer-Encoding", "chunked")
            handler.send_header("Connection", "close")
            handler.end_headers()
            for data in r.iter_raw():
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                handler.wfile.flush()
                if cut:
                    return  # no terminating chunk: the browser sees the stream break
            handler.wfile.write(b"0\r\n\r\n")
