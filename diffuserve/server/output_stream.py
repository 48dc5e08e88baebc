"""OutputStream: one HTTP request's outputs on the event loop, as the engine-loop thread hands them over
(bridge.py): the latest output per engine request, the backpressure count of its sequences not yet started, and
closing (aborting what is unfinished). Knows nothing of HTTP or of the OpenAI protocol.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from diffuserve.core.outputs import RequestOutput


class StreamOwner(Protocol):
    """What a stream needs of the bridge that feeds it (bridge.AsyncEngine)."""

    num_unstarted: int
    """Sequences accepted but not yet scheduled for their first step (the backpressure count)."""

    def abort(self, request_id: str) -> None: ...


class OutputStream:
    """The outputs of one HTTP request's engine requests, as the engine produced them; ends when all finished.

    Outputs are cumulative, so only the latest one per request is kept until it is read: a slow reader gets
    several blocks in one output rather than an ever-growing backlog of snapshots. A whole (non-streamed) response's
    requests take their finished outputs only (`RequestOutputKind.FINAL_ONLY`): the stream is told when each
    started (`mark_started`) and handed its finished output.

    Lives on the event loop; the engine-loop thread only ever calls `put` / `set_accepted` through
    `call_soon_threadsafe`. `close()` (always call it, e.g. in `finally`) aborts the unfinished requests. It also
    keeps the owner's count of sequences not yet scheduled for their first step (the backpressure bound).
    """

    def __init__(self, owner: StreamOwner, sequences: dict[str, int]) -> None:
        """`sequences`: {engine request id: its number of sequences (n)}."""
        self._owner = owner
        self._sequences = sequences
        request_ids = list(sequences)
        self.request_ids = request_ids
        self._latest: dict[str, RequestOutput] = {}  # unread, oldest first
        self._error: Exception | None = None
        self._ready = asyncio.Event()
        self._accept: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._unstarted = set(request_ids)  # counted as waiting by the owner
        self._open = set(request_ids)  # no finished output delivered yet
        self._num_finished_read = 0

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> RequestOutput:
        while not self._latest:
            if self._error is not None:
                raise self._error
            if self._num_finished_read == len(self.request_ids):
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()
        output = self._latest.pop(next(iter(self._latest)))
        self._num_finished_read += output.finished
        return output

    def close(self) -> None:
        """Aborts what is unfinished (idempotent)."""
        for request_id in self._open:
            self._owner.abort(request_id)
        self._open.clear()
        self._mark_started(set(self._unstarted))

    # ---- the bridge's side -----------------------------------------------------------------------------------
    async def wait_accepted(self) -> None:
        """Returns once the engine took every request; raises what it refused them with."""
        await self._accept

    def set_accepted(self, error: Exception | None) -> None:
        """The engine took the requests (None) or refused them (error). Only the first call counts."""
        if self._accept.done():
            return
        if error is None:
            self._accept.set_result(None)
        else:
            self._accept.set_exception(error)
            self.close()

    def put(self, item: RequestOutput | Exception) -> None:
        """A new output of one of the requests, or the exception the engine died with."""
        if isinstance(item, RequestOutput):
            self._mark_started({item.request_id})
            if item.finished:
                self._open.discard(item.request_id)
            self._latest.pop(item.request_id, None)
            self._latest[item.request_id] = item
        else:  # the engine died: nothing more will come
            self._error = item
            self.set_accepted(item)
            self.close()
        self._ready.set()

    def mark_started(self, request_id: str) -> None:
        """A step ran the request (one that produces no output before it finishes)."""
        self._mark_started({request_id})

    def _mark_started(self, request_ids: set[str]) -> None:
        started = self._unstarted & request_ids
        self._unstarted -= started
        self._owner.num_unstarted -= sum(self._sequences[r] for r in started)
