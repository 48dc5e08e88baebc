"""Turns engine tokens into user-visible completions: detokenization, stop strings, and the n-way fan-in.

Torch-free; the tokenizer is any object with `decode(ids, skip_special_tokens)`. Text is only ever shown up to
a point no stop string can still reach back over: a suffix that could be the start of a stop string is held back
until the next block decides it, so a stream never shows text past a stop. A completion's logprobs follow its
text: while it runs, only those of the tokens whose text is shown (`CompletionOutput.logprobs`).

`OutputProcessor` owns the user requests (a prompt and its n completions, each an engine request). After each
step it refreshes the completions of the step's requests and snapshots their user requests. A completion whose
text reaches a stop string is reported finished ("stop") and its request id returned in `reqs_to_abort`: the
processor never finishes a request itself, the engine does so through the scheduler.

It also names the prompt scores the engine computes (`prompt_logprobs`, filled position by position; a
request's output carries them once every prompt position is scored, which is before its first token).

It also owns what the engine hands back to callers (`RequestOutput`, `CompletionOutput`, `RequestMetrics`:
vLLM's shapes, plus the diffusion counters).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from diffuserve.engine.request import DenoisingStep, Request, RequestStatus
from diffuserve.sampling_params import ResolvedSamplingParams


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability under one distribution (vLLM's shape)."""

    logprob: float
    rank: int
    """1-based rank of the token in that distribution (1: the most likely)."""
    decoded_token: str | None = None


TokenLogprobs = dict[int, Logprob]
"""One position: the token there and the top-k alternatives from the same distribution, by token id."""


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    """stop, length, abort or error; None while running."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the completion."""
    num_forwards: int = 0
    """NFE: denoising forwards this completion took part in (prefill chunks excluded)."""
    error: str | None = None
    logprobs: list[TokenLogprobs] | None = None
    """With SamplingParams.logprobs: per token, its logprob and the top alternatives, `decoded_token` filled.
    One per token of `token_ids` once finished; while running, those of the tokens whose text `text` shows (a
    token whose text is held back, for a stop string or an incomplete character, follows with its text)."""
    denoising_steps: list[DenoisingStep] | None = None
    """With SamplingParams.record_denoising: every denoising step's writes so far, oldest first (a copy: the
    engine's list goes on growing). They may reach past `token_ids` (a block's positions after a stop)."""

    @property
    def tokens_per_forward(self) -> float:
        """TPF = generated tokens / NFE."""
        return len(self.token_ids) / self.num_forwards if self.num_forwards else 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    """When the first block of generated tokens was final."""
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
    new_token_counts: list[int] = field(default_factory=list)
    """Per completion, tokens that became final in the step that produced this output."""
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    """With SamplingParams.prompt_logprobs: per prompt position, the token's logprob and top alternatives
    (None at position 0, which has no score); None until the whole prompt is scored."""

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)

    @property
    def num_forwards(self) -> int:
        return sum(o.num_forwards for o in self.outputs)

    @property
    def tokens_per_forward(self) -> float:
        nfe = self.num_forwards
        return sum(len(o.token_ids) for o in self.outputs) / nfe if nfe else 0.0


MAX_UTF8_CONTINUATION = 3
"""A UTF-8 character is at most 4 bytes: the last 3 byte tokens may still be waiting for the rest."""


class Decoding(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


def find_stop_string(text: str, stops: list[str]) -> tuple[int, str] | None:
    """Earliest (index, stop string) occurring in `text`, or None."""
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits) if hits else None


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
    """One of a request's n completions: its visible text so far, and whether a stop string ended it."""

    index: int
    params: ResolvedSamplingParams
    output: CompletionOutput = field(init=False)
    num_shown_tokens: int = field(init=False, default=0)
    """Leading tokens of `output.token_ids` whose text `output.text` shows in full."""
    _logprobs: list[TokenLogprobs] = field(init=False, default_factory=list)
    """The logprobs of the tokens shown so far, `decoded_token` filled (tokens once shown never change)."""

    def __post_init__(self) -> None:
        self.output = CompletionOutput(self.index, "", [])

    def update(self, tokenizer: Decoding | None, token_ids: list[int], finished: bool) -> bool:
        """Re-derives text from the tokens; returns True if a stop string was hit (the caller finishes it)."""
        self.output.token_ids = list(token_ids)
        self.num_shown_tokens = len(token_ids)
        if tokenizer is None:
            return False
        text = tokenizer.decode(token_ids, self.params.skip_special_tokens)
        hit = find_stop_string(text, self.params.stop) if self.params.stop else None
        if hit is not None:
            index, stop = hit
            self.output.text = text[: index + (len(stop) if self.params.include_stop_str_in_output else 0)]
            self.output.token_ids = self._tokens_through(tokenizer, token_ids, stop)
            self.num_shown_tokens = len(self.output.token_ids)
            self.output.stop_reason = stop
            return True
        shown = text
        if not finished:
            shown = self._without_incomplete_character(tokenizer, token_ids, text)
            shown = shown[: len(shown) - partial_stop_length(shown, self.params.stop)]
            if len(shown) < len(text) and self.params.logprobs is not None:
                self.num_shown_tokens = self._num_tokens_within(tokenizer, token_ids, len(shown))
        self.output.text = shown
        return False

    def show_logprobs(self, logprobs: list[TokenLogprobs], token_text: Callable[[int], str | None]) -> None:
        """`logprobs` (the request's, one per output token) as far as the text is shown, each entry's
        `decoded_token` set by `token_text`."""
        for entry in logprobs[len(self._logprobs) : self.num_shown_tokens]:
            self._logprobs.append(
                {token: dataclasses.replace(lp, decoded_token=token_text(token)) for token, lp in entry.items()}
            )
        self.output.logprobs = self._logprobs[: self.num_shown_tokens]

    def _num_tokens_within(self, tokenizer: Decoding, token_ids: list[int], length: int) -> int:
        """The most leading tokens whose text fits in the first `length` characters (what is shown): the held
        back suffix is short, so this drops a few tokens from the end."""
        count = len(token_ids)
        while count and len(tokenizer.decode(token_ids[:count], self.params.skip_special_tokens)) > length:
            count -= 1
        return count

    def _without_incomplete_character(self, tokenizer: Decoding, token_ids: list[int], text: str) -> str:
        """Holds back replacement characters that the last few (byte) tokens may still complete into one
        character; invalid bytes further back are shown as they are."""
        if not text.endswith("\ufffd"):
            return text
        stable = tokenizer.decode(
            token_ids[: max(0, len(token_ids) - MAX_UTF8_CONTINUATION)], self.params.skip_special_tokens
        )
        if not text.startswith(stable):
            return text
        return stable + text[len(stable) :].rstrip("\ufffd")

    def _tokens_through(self, tokenizer: Decoding, token_ids: list[int], stop: str) -> list[int]:
        """The shortest token prefix whose text contains the stop string."""
        for n in range(1, len(token_ids) + 1):
            if stop in tokenizer.decode(token_ids[:n], self.params.skip_special_tokens):
                return token_ids[:n]
        return token_ids


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


@dataclass(frozen=True)
class ProcessedOutputs:
    request_outputs: list[RequestOutput]
    """One snapshot per user request that progressed, in the order of its first request in the step."""
    reqs_to_abort: list[str]
    """Engine request ids a stop string ended: the engine finishes them (FINISHED_STOPPED)."""


class OutputProcessor:
    def __init__(self, tokenizer: Decoding | None) -> None:
        self.tokenizer = tokenizer
        self._token_texts: dict[int, str] = {}
        """Each token id's text for logprobs (special tokens spelled out), decoded once."""
        self._parents: dict[str, ParentRequest] = {}
        self._children: dict[str, tuple[ParentRequest, Completion]] = {}  # engine request id -> its completion

    def add_request(self, parent: ParentRequest) -> None:
        self._parents[parent.request_id] = parent
        for completion in parent.completions:
            self._children[parent.child_id(completion.index)] = (parent, completion)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._parents

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
                    token: dataclasses.replace(logprob, decoded_token=self._token_text(token))
                    for token, logprob in entry.items()
                }
            parent.num_scored += len(entries)

    def process_outputs(self, requests: list[Request], new_token_counts: dict[str, int]) -> ProcessedOutputs:
        """Refreshes the completions of `requests` (a step's) and snapshots their user requests; a finished
        user request is forgotten after its last snapshot."""
        now = time.monotonic()
        touched: dict[int, ParentRequest] = {}
        reqs_to_abort = []
        for request in requests:
            parent, completion = self._children[request.request_id]
            if self._refresh(parent, completion, request, now):
                reqs_to_abort.append(request.request_id)
            touched.setdefault(id(parent), parent)
        outputs = []
        for parent in touched.values():
            out = parent.snapshot([new_token_counts.get(parent.child_id(c.index), 0) for c in parent.completions])
            if out.finished:
                parent.metrics.finished_time = now
                self._forget(parent)
            outputs.append(out)
        return ProcessedOutputs(outputs, reqs_to_abort)

    def _refresh(self, parent: ParentRequest, completion: Completion, request: Request, now: float) -> bool:
        """Updates one completion from its request; True if a stop string ends the (unfinished) request."""
        status = request.status
        stop_hit = completion.update(self.tokenizer, request.output_token_ids, status.is_finished)
        if request.params.logprobs is not None:
            completion.show_logprobs(request.output_logprobs, self._token_text)
        stops = stop_hit and not status.is_finished
        if stops:
            status = RequestStatus.FINISHED_STOPPED  # what the engine is about to make it
        out = completion.output
        out.num_forwards, out.error = request.num_forwards, request.error
        if request.params.record_denoising:
            out.denoising_steps = list(request.denoising_steps)
        if status.is_finished:
            out.finish_reason = status.finish_reason
            if not stop_hit and out.stop_reason is None:
                out.stop_reason = request.stop_reason
        if out.token_ids and parent.metrics.first_token_time is None:
            parent.metrics.first_token_time = now
        parent.num_cached_tokens = request.num_cached_tokens
        return stops

    def _token_text(self, token: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._token_texts.get(token)
        if text is None:
            text = self._token_texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text

    def _forget(self, parent: ParentRequest) -> None:
        self._parents.pop(parent.request_id, None)
        for completion in parent.completions:
            self._children.pop(parent.child_id(completion.index), None)
