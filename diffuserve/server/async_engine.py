"""The bridge between the asyncio HTTP handlers and the engine, which is not thread-safe.

One engine-loop thread owns the `LLMEngine`: it takes add/abort commands from a queue, steps while work
remains, and hands every request's outputs to the event loop (as copies: the engine keeps updating its own
output objects in place). A handler submits the engine requests of one HTTP request and reads them back from
one `OutputStream`; closing the stream early (client gone) aborts whatever is unfinished, which frees its pages.

Owns backpressure too: the requests accepted but not yet scheduled for their first step are counted, and past
`max_waiting_requests` a submission is refused (`QueueFullError`). If the loop itself crashes (not a step: the
engine fails a step's requests on its own) every open request is failed and the engine is marked dead.
Knows nothing of HTTP or of the OpenAI protocol.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from diffuserve.engine.outputs import RequestOutput
from diffuserve.engine.stats import EngineStats
from diffuserve.sampling_params import SamplingParams
from diffuserve.server.output_stream import OutputStream

if TYPE_CHECKING:
    from diffuserve.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


class QueueFullError(Exception):
    """Too many requests are waiting to be scheduled."""


class EngineDeadError(Exception):
    """The engine loop has stopped (crashed or shut down); no request can be served."""


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams


class EngineObserver(Protocol):
    """Told, on the engine-loop thread, what happens to requests (the server's metrics implement it)."""

    def request_added(self, request: EngineRequest, arrival_time: float) -> None: ...

    def request_output(self, output: RequestOutput, now: float) -> None: ...

    def request_aborted(self, request_id: str) -> None: ...

    def engine_stats(self, stats: EngineStats) -> None: ...


@dataclass(frozen=True)
class _Add:
    requests: list[EngineRequest]
    stream: OutputStream
    arrival_time: float


@dataclass(frozen=True)
class _Abort:
    request_id: str


_STOP = None


class AsyncEngine:
    """Runs `engine` on its own thread; `submit` / `OutputStream` / `abort` are called from the event loop."""

    def __init__(self, engine: LLMEngine, max_waiting_requests: int, observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.observer = observer
        self.num_unstarted = 0
        self.dead_reason: str | None = None
        self._commands: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self._routes: dict[str, OutputStream] = {}  # engine-loop thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- event-loop side -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="diffuserve-engine-loop", daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._commands.put(_STOP)
            self._thread.join(timeout_s)

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and self._thread is not None and self._thread.is_alive()

    async def submit(self, requests: list[EngineRequest]) -> OutputStream:
        """Queues the requests; returns once the engine accepted them all (ValueError if it rejected one,
        in which case none is kept). Raises QueueFullError or EngineDeadError without queueing anything."""
        if not self.is_alive:
            raise EngineDeadError(self.dead_reason or "the engine loop is not running")
        if self.num_unstarted + len(requests) > self.max_waiting_requests:
            raise QueueFullError(f"{self.num_unstarted} requests are waiting")
        stream = OutputStream(self, [r.request_id for r in requests])
        self.num_unstarted += len(requests)
        self._commands.put(_Add(requests, stream, time.monotonic()))
        if self.dead_reason is not None:  # died between the check and the put: nobody will read the command
            stream.set_accepted(EngineDeadError(self.dead_reason))
        accepted = False
        try:
            await stream.wait_accepted()
            accepted = True
        finally:
            if not accepted:
                stream.close()
        return stream

    def abort(self, request_id: str) -> None:
        self._commands.put(_Abort(request_id))

    # ---- engine-loop thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._serve_once():
                pass
            self._fail_all("the server is shutting down")
        except Exception as e:  # the engine-loop boundary: log, fail every open request, mark the engine dead
            logger.exception("engine loop crashed; failing %d open requests", len(self._routes))
            self._fail_all(f"engine loop crashed: {type(e).__name__}: {e}")

    def _serve_once(self) -> bool:
        """Applies the queued commands, runs one step if there is work; False when told to stop."""
        for command in self._drain(block=not self.engine.has_unfinished_requests()):
            if command is _STOP:
                return False
            if isinstance(command, _Add):
                self._add(command)
            else:
                self._abort(command.request_id)
        if self.engine.has_unfinished_requests():
            outputs = self.engine.step()
            now = time.monotonic()
            for output in outputs:
                self._deliver(output, now)
        if self.observer is not None:
            self.observer.engine_stats(self.engine.stats())
        return True

    def _drain(self, block: bool) -> Iterator[_Add | _Abort | None]:
        if block:
            yield self._commands.get()
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, command: _Add) -> None:
        added: list[str] = []
        try:
            for request in command.requests:
                self.engine.add_request(request.request_id, request.prompt_token_ids, request.params)
                added.append(request.request_id)
        except ValueError as e:
            for request_id in added:
                self.engine.abort_request(request_id)
            self._to_loop(command.stream.set_accepted, e)
            return
        for request in command.requests:
            self._routes[request.request_id] = command.stream
            if self.observer is not None:
                self.observer.request_added(request, command.arrival_time)
        self._to_loop(command.stream.set_accepted, None)

    def _abort(self, request_id: str) -> None:
        if self._routes.pop(request_id, None) is not None:
            self.engine.abort_request(request_id)
            if self.observer is not None:
                self.observer.request_aborted(request_id)

    def _deliver(self, output: RequestOutput, now: float) -> None:
        stream = self._routes.get(output.request_id)
        if stream is None:
            return  # aborted while the step ran
        if output.finished:
            del self._routes[output.request_id]
        if self.observer is not None:
            self.observer.request_output(output, now)
        self._to_loop(stream.put, _copy(output))

    def _fail_all(self, reason: str) -> None:
        self.dead_reason = reason
        streams = set(self._routes.values())
        self._routes.clear()
        for command in self._drain(block=False):
            if isinstance(command, _Add):
                streams.add(command.stream)
        for stream in streams:
            self._to_loop(stream.put, EngineDeadError(reason))

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        assert self._loop is not None, "AsyncEngine.start() was not called"
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            logger.debug("event loop closed; dropping a message for %s", callback)


def _copy(output: RequestOutput) -> RequestOutput:
    """A snapshot the engine will not mutate (it updates its CompletionOutput objects in place every step)."""
    return dataclasses.replace(
        output,
        outputs=[dataclasses.replace(o) for o in output.outputs],
        metrics=dataclasses.replace(output.metrics),
        new_token_counts=list(output.new_token_counts),
    )
