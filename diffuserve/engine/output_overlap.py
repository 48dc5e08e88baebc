"""Output processing beside the next step's forward (`--overlap-outputs`): a step's completions are brought up to
its tokens (detokenization, stop strings, logprob text) on a second thread while the next step's forward runs, as
vLLM's engine core hands its outputs to another process and goes on.

Owns the one worker thread and the step whose outputs are still to make (`HeldStep`). Knows nothing of what the
processor does with the requests, nor of statuses: the engine finishes the stop-string hits through the scheduler
once the thread is joined, then snapshots the outputs on its own thread.

Why the thread may read live requests: it runs only while the engine is inside `runner.execute` (the forward and
the decoders), which reads the requests' blocks but never writes their output tokens, logprobs, counters or
statuses. The schedule that precedes it (admissions, preemptions) changes none of them either; the step's update,
which does, comes after the join.

What changes for a caller: a step returns the previous step's outputs (the last step's come from the step that
finds nothing to schedule), and a request whose text reached a stop string was already scheduled once more; that
step's work for it is dropped when the hit finishes it, so every request's outputs are the ones the plain order
makes, one step later.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from diffuserve.core.request import Request
from diffuserve.engine.output_processor import OutputProcessor


@dataclass
class HeldStep:
    """A step whose outputs are not made yet: its requests in schedule order and the tokens each finalised."""

    requests: list[Request]
    new_token_counts: dict[str, int]
    stop_hits: Future[list[str]] | None = field(default=None, repr=False)
    """While the thread updates the completions: the ids whose text reached a stop string."""


class OutputOverlap:
    def __init__(self, processor: OutputProcessor) -> None:
        self.processor = processor
        self.held: HeldStep | None = None
        """The last step's requests, whose outputs the next step makes."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diffuserve-outputs")

    def take(self) -> HeldStep | None:
        """The held step (without the requests aborted since: their outputs are gone), no longer held; None if
        nothing is held."""
        held, self.held = self.held, None
        if held is not None:
            held.requests = [r for r in held.requests if self.processor.has_completion(r.request_id)]
        return held

    def launch(self, held: HeldStep) -> None:
        """Starts updating `held`'s completions on the thread (called once the next step's batch is built: the
        batch is Python work too, which the thread would only slow down)."""
        held.stop_hits = self._thread.submit(self.processor.update_completions, held.requests)

    def shutdown(self) -> None:
        self._thread.shutdown(wait=True)
