"""One completion's user-visible text: its tokens detokenized incrementally (engine/detokenizer.py: a step
decodes its new tokens, not the whole output), equal to a whole decode; stop strings searched only where one can
newly end, and text shown only up to a point no stop string can still reach back over (a suffix that could start
a stop string is held back until the next block decides it); its logprobs as far as its text is shown.

Torch-free; the tokenizer is any object with `decode(ids, skip_special_tokens)`. Knows nothing of requests,
statuses or the n-way fan-in (engine/output_processor.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from diffuserve.core.outputs import CompletionOutput, Logprob, TokenLogprobs
from diffuserve.engine.detokenizer import REPLACEMENT_CHAR, Decoding, IncrementalDetokenizer
from diffuserve.sampling_params import ResolvedSamplingParams

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
    num_engine_tokens: int = field(init=False, default=0)
    """The engine request's output tokens as of its last step (its progress while its output waits to finish)."""

    def __post_init__(self) -> None:
        self.output = CompletionOutput(self.index, "", [])

    def update(self, tokenizer: Decoding | None, token_ids: list[int], finished: bool) -> bool:
        """Brings the text up to the tokens (the previous ones plus any new ones at the end); returns True if a
        stop string was hit (the caller finishes it)."""
        if not finished and len(token_ids) == self._num_seen:
            return False  # no new token (output tokens only grow until the request finishes): nothing changes
        self._num_seen = len(token_ids)
        self._show_tokens(token_ids)
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
        shown = self.output.logprobs
        if shown is None or len(shown) > self.num_shown_tokens:  # the first, or fewer shown than before
            self.output.logprobs = self._logprobs[: self.num_shown_tokens]
        else:  # in place, as the tokens (`_show_tokens`)
            shown += self._logprobs[len(shown) : self.num_shown_tokens]

    def _show_tokens(self, token_ids: list[int]) -> None:
        """The output's tokens brought up to `token_ids`, in place: a running request's output tokens only grow,
        so a step appends its new ones, not a copy of the whole output (a step's work stays independent of the
        output's length, as the text's is). A shorter list (a stop that cut tokens already shown) replaces it.
        A caller keeping a step's view copies the lists (server/bridge.py does)."""
        shown = self.output.token_ids
        if len(token_ids) < len(shown):
            self.output.token_ids = list(token_ids)
        else:
            shown += token_ids[len(shown) :]

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
