"""Turns engine tokens into user-visible completions: detokenization, stop strings, and the n-way fan-in.

Torch-free; the tokenizer is any object with `decode(ids, skip_special_tokens)`. Each completion's text is
decoded incrementally (engine/detokenizer.py: a step decodes its new tokens, not the whole output), equal to a
whole decode; stop strings are searched only where one can newly end. Text is only ever shown up to
a point no stop string can still reach back over: a suffix that could be the start of a stop string is held back
until the next block decides it, so a stream never shows text past a stop. A completion's logprobs follow its
text: while it runs, only those of the tokens whose text is shown (`CompletionOutput.logprobs`).

`OutputProcessor` owns the user requests (a prompt and its n completions, each an engine request). After each
step it brings the completions of the step's requests up to their tokens (text and logprob text) and returns the
requests whose text reached a stop string (`update_completions`, which may run on another thread beside the next
forward: engine/output_overlap.py); the engine finishes those through the scheduler, the one owner of "finished",
and only then does the processor snapshot the user requests (`snapshot`), from the statuses the scheduler set. It
never decides a status.

A request whose caller wants its finished output only (`RequestOutputKind.FINAL_ONLY`, as `LLM.generate` asks)
costs nothing here while it runs: its text is made once, when it finishes (or step by step where a stop string may
end it), and it is snapshot only then.

It also names the prompt scores the engine computes (`prompt_logprobs`, filled position by position; a
request's output carries them once every prompt position is scored, which is before its first token).

What it hands back to callers (`RequestOutput`, `CompletionOutput`, ...) is defined in `core/outputs.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from diffuserve.core.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput, TokenLogprobs
from diffuserve.core.request import Request, RequestStatus
from diffuserve.engine.detokenizer import REPLACEMENT_CHAR, Decoding, IncrementalDetokenizer, TokenTexts
from diffuserve.sampling_params import RequestOutputKind, ResolvedSamplingParams

MAX_UTF8_CONTINUATION = 3
"""A UTF-8 character is at most 4 bytes: the last 3 byte tokens may still be waiting for the rest."""


def find_stop_string(text: str, stops: list[str], start: int = 0) -> tuple[int, str] | None:
    """Earliest (index, stop string) occurring in `text` at or after `start`, or None."""
    hits = [(text.find(s, start), s) for s in stops]
    return min(((i, s) for i, s in hits if i >= 0), default=None)


def partial_stop_length(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


@dataclass
class Completion:
    """One of a request's n completions: its visible text so far, and whether a stop string ended it. Its text
    is decoded incrementally (engine/detokenizer.py): a step's work does not grow with the output."""

    index: int
    params: ResolvedSamplingParams
    output: CompletionOutput = field(init=False)
    num_shown_tokens: int = field(init=False, default=0)
    """Leading tokens of `output.token_ids` whose text `output.text` shows in full."""
    _logprobs: list[TokenLogprobs] = field(init=False, default_factory=list)
    """The logprobs of the tokens shown so far, `decoded_token` filled (tokens once shown never change)."""
    _detokenizer: IncrementalDetokenizer | None = field(init=False, default=None)
    stopped_as_it_finished: bool = field(init=False, default=False)
    """A stop string first appeared in the update that saw the request finished (its last tokens reached both
    max_tokens and the stop string): it ended on the stop string, where its text is cut."""
    _num_seen: int = field(init=False, default=-1)
    """How many tokens the last update saw: a step that added none to an unfinished completion changes nothing
    (most steps of a canvas still being denoised), so it is skipped."""

    def __post_init__(self) -> None:
        self.output = CompletionOutput(self.index, "", [])

    def update(self, tokenizer: Decoding | None, token_ids: list[int], finished: bool) -> bool:
        """Brings the text up to the tokens (the previous ones plus any new ones at the end); returns True if a
        stop string was hit (the caller finishes it)."""
        if not finished and len(token_ids) == self._num_seen:
            return False  # no new token (output tokens only grow until the request finishes): nothing changes
        self._num_seen = len(token_ids)
        self.output.token_ids = list(token_ids)
        self.num_shown_tokens = len(token_ids)
        if tokenizer is None:
            return False
        if self._detokenizer is None:
            self._detokenizer = IncrementalDetokenizer(tokenizer, self.params.skip_special_tokens)
        detokenizer = self._detokenizer
        text = detokenizer.update(token_ids, finished)
        hit = self._find_stop(text, detokenizer.num_stable_chars)
        if hit is not None:
            index, stop = hit
            self.stopped_as_it_finished = finished and self.output.stop_reason is None
            self.output.text = text[: index + (len(stop) if self.params.include_stop_str_in_output else 0)]
            self.output.token_ids = token_ids[: self._num_tokens_through(index, stop, len(token_ids))]
            self.num_shown_tokens = len(self.output.token_ids)
            self.output.stop_reason = stop
            return True
        shown = text
        if not finished:
            shown = self._without_incomplete_character(text, len(token_ids))
            shown = shown[: len(shown) - partial_stop_length(shown, self.params.stop)]
            if len(shown) < len(text) and self.params.logprobs is not None:
                self.num_shown_tokens = self._num_tokens_within(len(token_ids), len(shown))
        self.output.text = shown
        return False

    def show_logprobs(self, logprobs: list[TokenLogprobs], token_text: Callable[[int], str | None]) -> None:
        """`logprobs` (the request's, one per output token) as far as the text is shown, each entry's
        `decoded_token` set by `token_text`."""
        for entry in logprobs[len(self._logprobs) : self.num_shown_tokens]:
            self._logprobs.append(
                # Built, not `dataclasses.replace`d: this runs for every alternative of every token shown.
                {token: Logprob(lp.logprob, lp.rank, token_text(token)) for token, lp in entry.items()}
            )
        self.output.logprobs = self._logprobs[: self.num_shown_tokens]

    def _find_stop(self, text: str, num_stable: int) -> tuple[int, str] | None:
        """The earliest stop string in `text`, searched only where it may end past the `num_stable` characters
        that earlier updates already searched (a stop string there would have ended the completion)."""
        if not self.params.stop:
            return None
        return find_stop_string(text, self.params.stop, max(0, num_stable - max(map(len, self.params.stop)) + 1))

    def _num_tokens_within(self, num_tokens: int, length: int) -> int:
        """The most leading tokens whose text fits in the first `length` characters (what is shown): the held
        back suffix is short, so this drops a few tokens from the end."""
        assert self._detokenizer is not None
        count = num_tokens
        while count:
            offset, piece = self._detokenizer.prefix_text(count)
            if offset + len(piece) <= length:
                break
            count -= 1
        return count

    def _without_incomplete_character(self, text: str, num_tokens: int) -> str:
        """Holds back replacement characters that the last few (byte) tokens may still complete into one
        character; invalid bytes further back are shown as they are."""
        assert self._detokenizer is not None
        if not text.endswith(REPLACEMENT_CHAR):
            return text
        offset, piece = self._detokenizer.prefix_text(max(0, num_tokens - MAX_UTF8_CONTINUATION))
        if text[offset : offset + len(piece)] != piece:  # the stable part's text is not where `text` has it
            return text
        stable = offset + len(piece)
        return text[:stable] + text[stable:].rstrip(REPLACEMENT_CHAR)

    def _num_tokens_through(self, index: int, stop: str, num_tokens: int) -> int:
        """The shortest token prefix whose text holds the stop string where `text` has it (at `index`), decoding
        prefixes from the last boundary before it on."""
        assert self._detokenizer is not None
        detokenizer = self._detokenizer
        for count in range(detokenizer.num_tokens_before(index) + 1, num_tokens + 1):
            offset, piece = detokenizer.prefix_text(count)
            start = min(offset, index)  # the prefix's text from `start` on is this
            if (detokenizer.text[start:offset] + piece)[index - start : index - start + len(stop)] == stop:
                return count
        return num_tokens


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
        return self.completions[0].params.output_kind == RequestOutputKind.FINAL_ONLY

    @property
    def is_finished(self) -> bool:
        return all(c.output.finish_reason is not None for c in self.completions)

    def child_id(self, index: int) -> str:
        """The engine request id of completion `index`."""
        return self.request_id if len(self.completions) == 1 else f"{self.request_id}#{index}"

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
            if _waits_for_final(request):
                continue
            parent, completion = self._children[request.request_id]
            self._fill(parent, completion, request)
            if not parent.final_only or parent.is_finished:
                touched.setdefault(id(parent), parent)
        outputs = []
        for parent in touched.values():
            out = parent.snapshot([new_token_counts.get(parent.child_id(c.index), 0) for c in parent.completions])
            if out.finished:
                parent.metrics.finished_time = now
                self._forget(parent)
            outputs.append(out)
        return outputs

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
        for completion in parent.completions:
            self._children.pop(parent.child_id(completion.index), None)


def _waits_for_final(request: Request) -> bool:
    """A running request whose caller wants its finished output only: nothing of it is shown yet."""
    return request.params.output_kind == RequestOutputKind.FINAL_ONLY and not request.status.is_finished
