"""503 while the model loads: `diffuserve serve` binds its port before it loads the model (so that a busy port fails
at once), and from then until uvicorn takes the socket over, `LoadingResponder` listens on it and answers every
HTTP request, `/health` included, with 503 and an OpenAI-shaped error (`code: "loading"`, `Retry-After`), then
closes the connection. Gateways and Kubernetes probes see a worker that is starting, not one that is gone.

A thread of its own, standard library only; it never touches the socket's mode, so uvicorn gets it as it was
(bound, listening). Knows nothing of the app or the engine.
"""

from __future__ import annotations

import json
import select
import socket
import threading

RETRY_AFTER_S = 5
_HEADER_END = b"\r\n\r\n"
_MAX_HEADER_BYTES = 65536


def loading_response() -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": "the model is loading; retry shortly",
                "type": "server_error",
                "param": None,
                "code": "loading",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: {RETRY_AFTER_S}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class LoadingResponder:
    """`start()`: `sock` listens and answers 503 until `stop()` (which may be called more than once)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="loading-503", daemon=True)

    def start(self) -> LoadingResponder:
        self._sock.listen()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._sock], [], [], 0.1)
            if not ready:
                continue
            try:
                connection, _ = self._sock.accept()
            except OSError:  # the client went away between select and accept
                continue
            with connection:
                _answer(connection)


def _answer(connection: socket.socket) -> None:
    """Reads the request head (a body, if any, is not read: the connection closes) and sends the 503."""
    connection.settimeout(2.0)
    received = b""
    try:
        while _HEADER_END not in received and len(received) < _MAX_HEADER_BYTES:
            chunk = connection.recv(4096)
            if not chunk:
                return
            received += chunk
        connection.sendall(loading_response())
    except OSError:
        return
