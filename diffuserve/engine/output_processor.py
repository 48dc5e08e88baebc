"""Turns engine tokens into user-visible completions: detokenization, stop strings, and the n-way fan-in.

Torch-free; the tokenizer is any object with `decode(ids, skip_special_tokens)`. Text is only ever shown up to
a point no stop string can still reach back over: a suffix that could be the start of a stop string is held back
until the next block decides it, so a stream never shows text past a stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from diffuserve.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from diffuserve.sampling_params import SamplingParams

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
    params: SamplingParams
    output: CompletionOutput = field(init=False)

    def __post_init__(self) -> None:
        self.output = CompletionOutput(self.index, "", [])

    def update(self, tokenizer: Decoding | None, token_ids: list[int], finished: bool) -> bool:
        """Re-derives text from the tokens; returns True if a stop string was hit (the caller finishes it)."""
        self.output.token_ids = list(token_ids)
        if tokenizer is None:
            return False
        text = tokenizer.decode(token_ids, self.params.skip_special_tokens)
        hit = find_stop_string(text, self.params.stop) if self.params.stop else None
        if hit is not None:
            index, stop = hit
            self.output.text = text[: index + (len(stop) if self.params.include_stop_str_in_output else 0)]
            self.output.token_ids = self._tokens_through(tokenizer, token_ids, stop)
            self.output.stop_reason = stop
            return True
        if not finished:
            text = self._without_incomplete_character(tokenizer, token_ids, text)
            text = text[: len(text) - partial_stop_length(text, self.params.stop)]
        self.output.text = text
        return False

    def _without_incomplete_character(self, tokenizer: Decoding, token_ids: list[int], text: str) -> str:
        """Holds back replacement characters that the last few (byte) tokens may still complete into one
        character; invalid bytes further back are shown as they are."""
        if not text.endswith("\ufffd"):
            return text
        stable = tokenizer.decode(token_ids[: max(0, len(token_ids) - MAX_UTF8_CONTINUATION)],
                                  self.params.skip_special_tokens)
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

    def snapshot(self, new_token_counts: list[int]) -> RequestOutput:
        return RequestOutput(
            self.request_id, self.prompt, self.prompt_token_ids, [c.output for c in self.completions],
            self.metrics, self.num_cached_tokens, new_token_counts,
        )
