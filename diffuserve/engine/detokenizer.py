"""Incremental detokenization: the text of a growing token list, decoding only the tokens at its end.

Decoding a completion's whole output at every step costs O(output) per step, O(output^2) per request. Here the
text is kept in segments that end at boundaries, and an update decodes only the tokens after the last boundary,
with the segment before it as left context (what a decoder may need from the left: SentencePiece drops the
leading space of a decode's first token):

    tokens   [ ...... earlier segments ...... | context segment |  new tokens  ]
    text     [ final text (never changes)                       |   pending    ]
             pending = decode(context segment + new)[len(decode(context segment)):]

The boundary moves to the end when the pending text is non-empty and does not end in U+FFFD (a character whose
bytes may still be coming in the next tokens): a boundary never falls inside a character. The text so built is
`decode(all tokens)` whenever the decoder is local in this sense: byte-level BPE (bytes concatenated, then UTF-8
with replacement), SentencePiece with byte fallback, tokenizers whose tokens each stand for a string. Where a
decode shows it is not (decode(context + new) does not start with decode(context)), the detokenizer decodes the
whole output from then on, exactly as before.

Per update it decodes the tokens since the context segment's start: the new ones, the context and the tokens
still waiting for a boundary (those that end in an incomplete character or add no text, such as skipped special
tokens); none of it grows with the output. Torch-free; the tokenizer is any object with `decode`.
"""

from __future__ import annotations

import bisect
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
"""What a decode shows for bytes that are not (yet) a whole UTF-8 character."""


class Decoding(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """The text of one completion's tokens, updated as tokens are appended."""

    text: str
    """The text of the tokens of the last update."""
    _boundaries: list[tuple[int, int]]
    """(tokens, characters of text) at each boundary, in order; the first is (0, 0)."""
    _final: str
    """The text of the tokens before the last boundary."""
    _context: str
    """The context segment (the tokens between the last two boundaries) decoded on its own."""
    _seen: list[int]
    """The tokens from the context's start on, as the last update saw them."""
    _ids: list[int]
    _num_stable_chars: int

    def __init__(self, tokenizer: Decoding, skip_special_tokens: bool) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._is_whole = False
        """The decoder proved not local: every update decodes the whole output."""
        self._reset()

    @property
    def num_stable_chars(self) -> int:
        """Leading characters of `text` that were already final before the last update (0 after a reset)."""
        return self._num_stable_chars

    def update(self, token_ids: list[int], finished: bool) -> str:
        """The text of `token_ids`, equal to decoding them whole: the previous update's tokens plus any new ones
        at their end (a list that does not extend them starts over). Unless `finished`, a trailing incomplete
        character stays pending; with `finished` every token's text is final. Sets and returns `self.text`."""
        if not self._extends(token_ids):
            self._reset()
        self._ids = token_ids
        self._num_stable_chars = 0 if self._is_whole else len(self._final)
        if self._is_whole:
            self.text = self._decode(token_ids)
            return self.text
        start, end = self._context_start, self._boundaries[-1][0]
        window = self._decode(token_ids[start:])
        if not window.startswith(self._context):
            self._is_whole = True
            return self.update(token_ids, finished)
        pending = window[len(self._context) :]
        if pending and (finished or not pending.endswith(REPLACEMENT_CHAR)):
            self._final += pending
            self._boundaries.append((len(token_ids), len(self._final)))
            self._context = self._decode(token_ids[end:])
            pending = ""
        self._seen = token_ids[self._context_start :]
        self.text = self._final + pending
        return self.text

    def prefix_text(self, count: int) -> tuple[int, str]:
        """(offset, piece) such that the first `count` tokens decode to `text[:offset] + piece`, decoding only
        the segment that holds token `count` (and its context); the whole prefix if the decoder is not local."""
        i = bisect.bisect_right(self._boundaries, count, key=lambda b: b[0]) - 1
        num_tokens, offset = self._boundaries[i]
        if self._is_whole or count == num_tokens:
            return (0, self._decode(self._ids[:count])) if self._is_whole else (offset, "")
        context_start = self._boundaries[i - 1][0] if i else 0
        last = i == len(self._boundaries) - 1
        context = self._context if last else self._decode(self._ids[context_start:num_tokens])
        segment = self._decode(self._ids[context_start:count])
        if not segment.startswith(context):
            return 0, self._decode(self._ids[:count])
        return offset, segment[len(context) :]

    def num_tokens_before(self, char_index: int) -> int:
        """Most leading tokens known to decode to at most the first `char_index` characters (a boundary)."""
        if self._is_whole:
            return 0
        i = bisect.bisect_right(self._boundaries, char_index, key=lambda b: b[1]) - 1
        return self._boundaries[i][0]

    @property
    def _context_start(self) -> int:
        return self._boundaries[-2][0] if len(self._boundaries) > 1 else 0

    def _extends(self, token_ids: list[int]) -> bool:
        """Whether `token_ids` holds the tokens decoded so far (those before the context are taken as kept)."""
        start = self._context_start
        return len(token_ids) >= start + len(self._seen) and token_ids[start : start + len(self._seen)] == self._seen

    def _reset(self) -> None:
        self._boundaries, self._final, self._context, self._seen, self._ids = [(0, 0)], "", "", [], []
        self._num_stable_chars = 0
        self.text = ""

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, self.skip_special_tokens)


class TokenTexts:
    """Each token id's text alone, special tokens spelled out (logprobs' `decoded_token`, the denoising view), decoded
    once per id."""

    def __init__(self, tokenizer: Decoding | None) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return text
