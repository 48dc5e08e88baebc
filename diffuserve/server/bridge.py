"""The async bridge between the asyncio HTTP handlers and the engine, which is not thread-safe.

One engine-loop thread owns the `LLMEngine` (`AsyncEngine`): it takes add/abort commands from a queue, steps
while work remains, and hands every request's outputs to the event loop (as copies: the engine keeps updating its
own output objects in place). A whole (non-streamed) response's requests ask the engine for their finished output
only (`RequestOutputKind.FINAL_ONLY`): the engine neither detokenizes nor snapshots them while they run, and the
loop hands over nothing but the news that each started. A handler submits the engine requests of one HTTP request
and reads them back from one `OutputStream` (output_stream.py), which keeps only the latest (cumulative) output per
request; closing the stream early (client gone) aborts whatever is unfinished, which frees its pages. The observer
(the server's metrics) sees every output, and every step's progress of the final-only requests.

Owns backpressure too: the sequences (a request with n completions is n sequences) accepted but not yet
scheduled for their first step are counted, and past `max_waiting_requests` a submission is refused
(`QueueFullError`). If the loop itself crashes (not a step: the
engine fails a step's requests on its own), or the ranks of a multi-process engine fail (a worker died: checked
after every step and every RANKS_CHECK_S while idle), every open request is failed and the engine is marked dead.
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

from diffuserve.core.outputs import CompletionOutput, RequestOutput, RequestProgress
from diffuserve.engine.engine_stats import EngineStats
from diffuserve.sampling_params import RequestOutputKind, SamplingParams
from diffuserve.server.output_stream import OutputStream

if TYPE_CHECKING:
    from diffuserve.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)
RANKS_CHECK_S = 1.0
"""How often an idle engine loop checks that its worker ranks are alive."""


class QueueFullError(Exception):
    """Too many requests are waiting to be scheduled."""


class EngineDeadError(Exception):
    """The engine loop has stopped (crashed or shut down); no request can be served."""


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    lora_name: str | None = None
    """The loaded LoRA adapter it runs with (None: the base model)."""


class EngineObserver(Protocol):
    """Told, on the engine-loop thread, what happens to requests (the server's metrics implement it)."""

    def request_added(self, request: EngineRequest, arrival_time: float) -> None: ...

    def request_output(self, output: RequestOutput, now: float) -> None: ...

    def request_progress(self, progress: RequestProgress, now: float) -> None:
        """A step ran a request that takes its finished output only, without an output."""

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


@dataclass(frozen=True)
class _Call:
    """`fn(engine)` on the engine-loop thread, its result or error set on `future`; `when_idle`: once no request
    is in flight, new requests held back meanwhile (a weight update: running requests finish on the old weights,
    later ones start on the new)."""

    fn: Callable[[LLMEngine], object]
    future: asyncio.Future[object]
    when_idle: bool


_STOP = None


class AsyncEngine:
    """Runs `engine` on its own thread; `submit` / `OutputStream` / `abort` are called from the event loop."""

    def __init__(self, engine: LLMEngine, max_waiting_requests: int, observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.observer = observer
        self.num_unstarted = 0
        self.dead_reason: str | None = None
        self._commands: queue.SimpleQueue[_Add | _Abort | _Call | None] = queue.SimpleQueue()
        self._held: list[_Add | _Call] = []  # behind a call waiting for idle (engine-loop thread only)
        self._routes: dict[str, OutputStream] = {}  # engine-loop thread only
        self._unstarted_final: set[str] = set()
        """Final-only requests no step has run yet: their first progress marks them started (engine-loop thread
        only)."""
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
    def num_held(self) -> int:
        """Commands held behind a call that waits for the requests in flight (a weight update, and what came
        after it)."""
        return len(self._held)

    @property
    def is_alive(self) -> bool:
        return self.dead_reason is None and self._thread is not None and self._thread.is_alive()

    async def submit(self, requests: list[EngineRequest]) -> OutputStream:
        """Queues the requests; returns once the engine accepted them all (ValueError if it rejected one,
        in which case none is kept). Raises QueueFullError or EngineDeadError without queueing anything. Requests
        whose params ask for finished outputs only (a whole response) get nothing else."""
        if not self.is_alive:
            raise EngineDeadError(self.dead_reason or "the engine loop is not running")
        sequences = {r.request_id: r.params.n for r in requests}
        if self.num_unstarted + sum(sequences.values()) > self.max_waiting_requests:
            raise QueueFullError(f"{self.num_unstarted} sequences are waiting")
        stream = OutputStream(self, sequences)
        self.num_unstarted += sum(sequences.values())
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

    async def call(self, fn: Callable[[LLMEngine], object], when_idle: bool = False) -> object:
        """Runs `fn(engine)` on the engine-loop thread (see `_Call`); returns its result or raises its error."""
        if not self.is_alive:
            raise EngineDeadError(self.dead_reason or "the engine loop is not running")
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._commands.put(_Call(fn, future, when_idle))
        return await future

    # ---- engine-loop thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._serve_once():
                pass
            self._fail_all("the server is shutting down")
        except EngineDeadError as e:  # the ranks failed: no step can run again
            logger.error("%s; failing %d open requests", e, len(self._routes))
            self._fail_all(str(e))
        except Exception as e:  # the engine-loop boundary: log, fail every open request, mark the engine dead
            logger.exception("engine loop crashed; failing %d open requests", len(self._routes))
            self._fail_all(f"engine loop crashed: {type(e).__name__}: {e}")

    def _serve_once(self) -> bool:
        """Applies the queued commands, runs one step if there is work; False when told to stop."""
        for command in self._drain(block=not self.engine.has_unfinished_requests()):
            if command is _STOP:
                return False
            self._apply(command)
        self._replay_held()
        self._check_ranks()
        if self.engine.has_unfinished_requests():
            outputs = self.engine.step()
            self._check_ranks()  # a step the ranks broke: its requests fail as the dead engine's (503), not 500
            now = time.monotonic()
            for output in outputs:
                self._deliver(output, now)
            for progress in self.engine.take_progress():
                self._progress(progress, now)
            self._replay_held()  # the step may have finished the last request a held call waits for
        if self.observer is not None:
            self.observer.engine_stats(self.engine.stats())
        return True

    def _apply(self, command: _Add | _Abort | _Call) -> None:
        if isinstance(command, _Abort):
            self._abort(command.request_id)
        elif self._held or (_waits_for_idle(command) and self.engine.has_unfinished_requests()):
            self._held.append(command)  # a call waiting for the requests in flight, or what came after one
        elif isinstance(command, _Call):
            self._run_call(command)
        else:
            self._add(command)

    def _replay_held(self) -> None:
        """Applies the held commands in order, up to a call that still waits for requests in flight."""
        while self._held and not (_waits_for_idle(self._held[0]) and self.engine.has_unfinished_requests()):
            held = self._held.pop(0)
            self._run_call(held) if isinstance(held, _Call) else self._add(held)

    def _run_call(self, command: _Call) -> None:
        try:
            result, error = command.fn(self.engine), None
        except Exception as e:  # handed to the caller, which answers it
            result, error = None, e
        if error is None:
            self._to_loop(_resolve, command.future, result)
        else:
            self._to_loop(_reject, command.future, error)

    def _check_ranks(self) -> None:
        failure = self.engine.ranks_failure()
        if failure is not None:
            raise EngineDeadError(f"a worker rank failed: {failure}")

    def _drain(self, block: bool) -> Iterator[_Add | _Abort | _Call | None]:
        if block:  # woken every RANKS_CHECK_S to check the ranks
            try:
                yield self._commands.get(timeout=RANKS_CHECK_S)
            except queue.Empty:
                return
        while True:
            try:
                yield self._commands.get_nowait()
            except queue.Empty:
                return

    def _add(self, command: _Add) -> None:
        added: list[str] = []
        try:
            for request in command.requests:
                self.engine.add_request(request.request_id, request.prompt_token_ids, request.params, request.lora_name)
                added.append(request.request_id)
        except ValueError as e:
            for request_id in added:
                self.engine.abort_request(request_id)
            self._to_loop(command.stream.set_accepted, e)
            return
        for request in command.requests:
            self._routes[request.request_id] = command.stream
            if request.params.output_kind == RequestOutputKind.FINAL_ONLY:
                self._unstarted_final.add(request.request_id)
            if self.observer is not None:
                self.observer.request_added(request, command.arrival_time)
        self._to_loop(command.stream.set_accepted, None)

    def _abort(self, request_id: str) -> None:
        self._unstarted_final.discard(request_id)
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
            self._unstarted_final.discard(output.request_id)
        if self.observer is not None:
            self.observer.request_output(output, now)
        self._to_loop(stream.put, _copy(output))

    def _progress(self, progress: RequestProgress, now: float) -> None:
        """A final-only request ran a step: the metrics see it, and its stream learns once that it started."""
        stream = self._routes.get(progress.request_id)
        if stream is None:
            return  # aborted while the step ran
        if self.observer is not None:
            self.observer.request_progress(progress, now)
        if progress.request_id in self._unstarted_final:
            self._unstarted_final.discard(progress.request_id)
            self._to_loop(stream.mark_started, progress.request_id)

    def _fail_all(self, reason: str) -> None:
        self.dead_reason = reason
        streams = set(self._routes.values())
        self._routes.clear()
        self._unstarted_final.clear()
        for command in [*self._held, *self._drain(block=False)]:
            if isinstance(command, _Add):
                streams.add(command.stream)
            elif isinstance(command, _Call):
                self._to_loop(_reject, command.future, EngineDeadError(reason))
        self._held.clear()
        for stream in streams:
            self._to_loop(stream.put, EngineDeadError(reason))

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        assert self._loop is not None, "AsyncEngine.start() was not called"
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            logger.debug("event loop closed; dropping a message for %s", callback)


def _copy(output: RequestOutput) -> RequestOutput:
    """A snapshot the engine will not mutate (it updates its CompletionOutput objects, and their token and logprob
    lists, in place every step)."""
    return dataclasses.replace(
        output,
        outputs=[_copy_completion(o) for o in output.outputs],
        metrics=dataclasses.replace(output.metrics),
        new_token_counts=list(output.new_token_counts),
    )


def _copy_completion(output: CompletionOutput) -> CompletionOutput:
    logprobs = None if output.logprobs is None else list(output.logprobs)
    return dataclasses.replace(output, token_ids=list(output.token_ids), logprobs=logprobs)


def _resolve(future: asyncio.Future[object], result: object) -> None:
    if not future.done():  # the caller may have gone (cancelled)
        future.set_result(result)


def _reject(future: asyncio.Future[object], error: Exception) -> None:
    if not future.done():
        future.set_exception(error)


def _waits_for_idle(command: _Add | _Call) -> bool:
    return isinstance(command, _Call) and command.when_idle
