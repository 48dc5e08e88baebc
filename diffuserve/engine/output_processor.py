"""Turns engine tokens into user-visible outputs: the n-way fan-in of a user request's completions.

Torch-free. Each completion's text, stop strings and shown logprobs are engine/completion.py's; this module
decides which completions a step brings up to date and which user requests it snapshots.

`OutputProcessor` owns the user requests (a prompt and its n completions, each an engine request). After each
step it brings the completions of the step's requests up to their tokens (text and logprob text) and returns the
requests whose text reached a stop string (`update_completions`, which may run on another thread beside the next
forward: engine/output_overlap.py); the engine finishes those through the scheduler, the one owner of "finished",
and only then does the processor snapshot the user requests (`snapshot`), from the statuses the scheduler set. It
never decides a status.

A request whose caller wants its finished output only (`RequestOutputKind.FINAL_ONLY`, as `LLM.generate` and the
server's whole responses ask) costs nothing here while it runs: its text is made once, when it finishes (or step
by step where a stop string may end it), and it is snapshot only then. Meanwhile only its progress is kept (its
token count and finished completions, `take_progress`), which the server's metrics read.

It also names the prompt scores the engine computes (`prompt_logprobs`, filled position by position; a
request's output carries them once every prompt position is scored, which is before its first token).

What it hands back to callers (`RequestOutput`, `CompletionOutput`, ...) is defined in `core/outputs.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from diffuserve.core.outputs import Logprob, RequestMetrics, RequestOutput, RequestProgress, TokenLogprobs
from diffuserve.core.request import Request, RequestStatus
from diffuserve.engine.completion import Completion
from diffuserve.engine.detokenizer import Decoding, TokenTexts
from diffuserve.sampling_params import RequestOutputKind

FINAL_ONLY = RequestOutputKind.FINAL_ONLY
"""Read per request per step: a module name and an identity test, not an enum attribute and an enum comparison."""


@dataclass
class ParentRequest:
    """A user request: a prompt and its n completions (engine requests `<id>` for n=1, `<id>#<i>` otherwise)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    completions: list[Completion]
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.monotonic()))
    num_cached_tokens: int = 0
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """With prompt_logprobs: one entry per prompt position, filled as the engine scores them."""
    num_scored: int = 0

    @property
    def final_only(self) -> bool:
        """Whether the caller gets its finished output only (`RequestOutputKind.FINAL_ONLY`)."""
        return self.completions[0].params.output_kind is FINAL_ONLY

    @property
    def is_finished(self) -> bool:
        return all(c.output.finish_reason is not None for c in self.completions)

    def child_id(self, index: int) -> str:
        """The engine request id of completion `index`."""
        return self.request_id if len(self.completions) == 1 else f"{self.request_id}#{index}"

    def progress(self) -> RequestProgress:
        """Its progress while its output waits for the finish (a finished completion's tokens are its output's)."""
        completions = self.completions
        return RequestProgress(
            self.request_id,
            sum(len(c.output.token_ids) if c.output.finish_reason else c.num_engine_tokens for c in completions),
            [c.output.finish_reason for c in completions],
        )

    def snapshot(self, new_token_counts: list[int]) -> RequestOutput:
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            [c.output for c in self.completions],
            self.metrics,
            self.num_cached_tokens,
            new_token_counts,
            self.prompt_logprobs if self.num_scored >= len(self.prompt_token_ids) - 1 else None,
        )


class OutputProcessor:
    def __init__(self, tokenizer: Decoding | None) -> None:
        self.tokenizer = tokenizer
        self._token_text = TokenTexts(tokenizer)
        """Each token id's text for logprobs (special tokens spelled out), decoded once."""
        self._parents: dict[str, ParentRequest] = {}
        self._children: dict[str, tuple[ParentRequest, Completion]] = {}  # engine request id -> its completion
        self._progressed: dict[str, ParentRequest] = {}
        """Final-only user requests that a step ran since the last `take_progress` without an output."""

    def add_request(self, parent: ParentRequest) -> None:
        self._parents[parent.request_id] = parent
        for completion in parent.completions:
            self._children[parent.child_id(completion.index)] = (parent, completion)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._parents

    def has_completion(self, engine_request_id: str) -> bool:
        """Whether the engine request is a completion of a user request still here (not aborted or done)."""
        return engine_request_id in self._children

    def abort_request(self, request_id: str) -> list[str]:
        """Forgets a user request; returns its engine request ids (empty if unknown)."""
        parent = self._parents.get(request_id)
        if parent is None:
            return []
        self._forget(parent)
        return [parent.child_id(c.index) for c in parent.completions]

    def add_prompt_scores(self, scores: dict[str, list[tuple[int, TokenLogprobs]]]) -> None:
        """Records a step's prompt scores (engine request id -> (prompt position, logprobs)), naming the tokens."""
        for request_id, entries in scores.items():
            parent, _ = self._children[request_id]
            assert parent.prompt_logprobs is not None, "scores for a request that does not score its prompt"
            for position, entry in entries:
                parent.prompt_logprobs[position] = {
                    token: Logprob(logprob.logprob, logprob.rank, self._token_text(token))
                    for token, logprob in entry.items()
                }
            parent.num_scored += len(entries)

    def update_completions(self, requests: list[Request]) -> list[str]:
        """Brings the completions of `requests` (a step's) up to their tokens, text and logprobs; returns the ids
        of the unfinished ones whose text reached a stop string. The processor decides no status: the engine
        finishes those through the scheduler, then calls `snapshot`. Reads the requests, writes only the
        completions: it may run beside the next step's forward (engine/output_overlap.py)."""
        hits = []
        for request in requests:
            if _waits_for_final(request) and not request.params.stop:
                continue  # its text is made once, when it finishes: only a stop string needs it sooner
            _, completion = self._children[request.request_id]
            stop_hit = completion.update(self.tokenizer, request.output_token_ids, request.status.is_finished)
            if request.params.logprobs is not None:  # as far as the text is shown, which a stop ends
                completion.show_logprobs(request.output_logprobs, self._token_text)
            if stop_hit and not request.status.is_finished:
                hits.append(request.request_id)
        return hits

    def snapshot(self, requests: list[Request], new_token_counts: dict[str, int]) -> list[RequestOutput]:
        """One output per user request among `requests`, as their (final, if finished) statuses say; a finished
        user request is forgotten after its last snapshot."""
        now = time.monotonic()
        touched: dict[int, ParentRequest] = {}
        for request in requests:
            parent, completion = self._children[request.request_id]
            if _waits_for_final(request):
                completion.num_engine_tokens = len(request.output_token_ids)
                self._progressed[parent.request_id] = parent
                continue
            self._fill(parent, completion, request)
            if not parent.final_only or parent.is_finished:
                touched.setdefault(id(parent), parent)
            else:  # a completion finished before its siblings
                self._progressed[parent.request_id] = parent
        outputs = []
        for parent in touched.values():
            out = parent.snapshot([new_token_counts.get(parent.child_id(c.index), 0) for c in parent.completions])
            if out.finished:
                parent.metrics.finished_time = now
                self._forget(parent)
            outputs.append(out)
        return outputs

    def take_progress(self) -> list[RequestProgress]:
        """The progress of the final-only user requests that steps ran since the last call without an output
        (none of them finished: a finished one's output says it all)."""
        progress = [parent.progress() for parent in self._progressed.values()]
        self._progressed.clear()
        return progress

    def _fill(self, parent: ParentRequest, completion: Completion, request: Request) -> None:
        """Copies a request's counters, trace and finish into its completion's output."""
        out = completion.output
        out.num_forwards, out.error = request.num_forwards, request.error
        out.num_draft_tokens, out.num_accepted_tokens = request.draft.num_checked, request.draft.num_kept
        if request.params.record_denoising:
            out.denoising_steps = list(request.denoising_steps)
        if request.status.is_finished:
            out.finish_reason = request.status.finish_reason
            if completion.stopped_as_it_finished and request.status == RequestStatus.FINISHED_LENGTH:
                out.finish_reason = "stop"  # as vLLM's output processor says it
            if out.stop_reason is None:  # a stop string's is already there
                out.stop_reason = request.stop_reason
        first = request.first_token_time  # the earliest of its completions' first tokens
        if first is not None and (parent.metrics.first_token_time is None or first < parent.metrics.first_token_time):
            parent.metrics.first_token_time = first
        parent.num_cached_tokens = request.num_cached_tokens

    def _forget(self, parent: ParentRequest) -> None:
        self._parents.pop(parent.request_id, None)
        self._progressed.pop(parent.request_id, None)
        for completion in parent.completions:
            self._children.pop(parent.child_id(completion.index), None)


def _waits_for_final(request: Request) -> bool:
    """A running request whose caller wants its finished output only: nothing of it is shown yet."""
    return request.params.output_kind is FINAL_ONLY and not request.status.is_finished
