"""Incremental detokenization (engine/detokenizer.py, used by the output processor's completions) against the
whole-output rule it replaces: at every update, the same text, tokens, shown-token count and stop-string hit as
decoding all tokens from scratch (the oracle below, which shares no code with the engine), on a byte-level BPE
(UTF-8 characters split across byte tokens, invalid bytes, special and added tokens), the same with
transformers' space clean-up (a decoder that is not local, where the detokenizer must notice and decode whole)
and a SentencePiece-style tokenizer with byte fallback (a decode drops its first leading space); and a step's
decoding work does not grow with the output (4,000 tokens, counted by a wrapping tokenizer)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models

from diffuserve.core.outputs import Logprob
from diffuserve.engine.completion import Completion
from diffuserve.reference.byte_tokenizer import special_token_ids, write_byte_tokenizer
from diffuserve.sampling_params import ResolvedSamplingParams, SamplingParams
from diffuserve.text.tokenizer import Tokenizer

VOCAB = 300
SPECIAL = list(special_token_ids().values())[:3]  # endoftext, im_start, im_end (never the mask)
FILLER = [VOCAB - 2, VOCAB - 1]  # added, non-special tokens ("<|x298|>")
CHARS = "é中😀"


def reference(tokenizer, params: ResolvedSamplingParams, token_ids: list[int], finished: bool):
    """The rule, with every text decoded whole: (stop hit, text, token ids, shown tokens)."""

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, params.skip_special_tokens)

    text = decode(token_ids)
    hits = [(text.find(s), s) for s in params.stop if s in text]
    if hits:
        index, stop = min(hits)
        count = next(n for n in range(1, len(token_ids) + 1) if decode(token_ids[:n])[index:].startswith(stop))
        end = index + (len(stop) if params.include_stop_str_in_output else 0)
        return True, text[:end], token_ids[:count], count
    shown = text
    if not finished:
        if text.endswith("\ufffd"):
            stable = decode(token_ids[: max(0, len(token_ids) - 3)])  # a character is at most 4 bytes
            if text.startswith(stable):
                shown = stable + text[len(stable) :].rstrip("\ufffd")
        held = [n for s in params.stop for n in range(1, len(s)) if shown.endswith(s[:n])]
        shown = shown[: len(shown) - max(held, default=0)]
    count = len(token_ids)
    if len(shown) < len(text) and params.logprobs is not None:
        while count and len(decode(token_ids[:count])) > len(shown):
            count -= 1
    return False, shown, list(token_ids), count


class RustDecoding:
    """A `tokenizers` tokenizer as the output processor sees one."""

    def __init__(self, tokenizer: RustTokenizer) -> None:
        self.tokenizer = tokenizer

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


class Counting:
    """Counts the token ids each decode call is given."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.num_decoded = 0

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        self.num_decoded += len(token_ids)
        return self.inner.decode(token_ids, skip_special_tokens)


class CleanUp:
    """A tokenizer whose decode then removes the space before punctuation, as transformers'
    `clean_up_tokenization_spaces` does for tokenizers other than BPE: " ." becomes "." once the dot comes, so
    text already decoded changes (the decoder is not local)."""

    RULES = (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" 's", "'s")

    def __init__(self, inner) -> None:
        self.inner = inner

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self.inner.decode(token_ids, skip_special_tokens)
        for old, new in self.RULES:
            text = text.replace(old, new)
        return text


def byte_level(root: Path) -> Tokenizer:
    write_byte_tokenizer(root, VOCAB)
    return Tokenizer(root)


def sentencepiece_like() -> RustDecoding:
    """Llama's decoder: '▁' -> ' ', byte-fallback pieces `<0xNN>` -> bytes, fused, one leading space stripped."""
    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", "▁a", "▁b", "a", "b", ".", "▁."]
    tokenizer = RustTokenizer(
        models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[], unk_token="<unk>", byte_fallback=True)
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(["<s>", "</s>"])
    return RustDecoding(tokenizer)


def byte_level_tokens(rng: random.Random, n: int) -> list[int]:
    """Mostly text that the tokens split anywhere: ASCII (spaces, dots), the bytes of multi-byte characters, and
    now and then a stray continuation byte, a special token or an added one."""
    out: list[int] = []
    while len(out) < n:
        kind = rng.random()
        if kind < 0.5:
            out.append(ord(rng.choice("ab .,'")))
        elif kind < 0.8:
            out.extend(rng.choice(CHARS).encode())
        elif kind < 0.9:
            out.append(rng.randrange(0x80, 0x100))
        else:
            out.append(rng.choice(SPECIAL + FILLER))
    return out[:n]


def sentencepiece_tokens(rng: random.Random, n: int) -> list[int]:
    words = list(range(259, 266))  # ▁, ▁a, ▁b, a, b, ., ▁.
    out: list[int] = []
    while len(out) < n:
        kind = rng.random()
        if kind < 0.6:
            out.append(rng.choice(words))
        elif kind < 0.85:
            out.extend(3 + b for b in rng.choice(CHARS).encode())  # byte-fallback pieces
        elif kind < 0.93:
            out.append(3 + rng.randrange(0x80, 0x100))
        else:
            out.append(rng.choice([1, 2]))
    return out[:n]


def random_params(rng: random.Random, text: str) -> ResolvedSamplingParams:
    """Stop strings taken from the free-running text (so that some are hit, some across updates), or none."""
    stops = []
    for _ in range(rng.randrange(3)):
        if len(text) > 2:
            start = rng.randrange(len(text) - 1)
            stops.append(text[start : start + rng.randint(1, 3)])
    return SamplingParams(
        stop=stops,
        logprobs=0,
        skip_special_tokens=rng.random() < 0.5,
        include_stop_str_in_output=rng.random() < 0.5,
    ).with_defaults({}, max_tokens_limit=64)


def check_against_reference(tokenizer, token_ids: list[int], params: ResolvedSamplingParams, rng: random.Random):
    """Feeds `token_ids` in random chunks (some empty) and compares every update with the whole-decode rule."""
    completion = Completion(0, params)
    count = 0
    while True:
        count = min(len(token_ids), count + rng.choice([0, 1, 1, 2, 3, 4, 8]))
        finished = count == len(token_ids)
        ids = token_ids[:count]
        hit = completion.update(tokenizer, ids, finished)
        out = completion.output
        expected = reference(tokenizer, params, ids, finished)
        assert (hit, out.text, out.token_ids, completion.num_shown_tokens) == expected, (ids, params.stop)
        if hit or finished:
            return


@pytest.mark.parametrize("kind", ["byte-level", "byte-level, clean-up", "sentencepiece"])
def test_incremental_text_equals_the_whole_decode_at_every_update(kind, tmp_path: Path):
    if kind == "sentencepiece":
        tokenizer, tokens = sentencepiece_like(), sentencepiece_tokens
    else:
        tokenizer, tokens = byte_level(tmp_path), byte_level_tokens
        if kind.endswith("clean-up"):
            tokenizer = CleanUp(tokenizer)
    rng = random.Random(kind)
    for _ in range(300):
        token_ids = tokens(rng, rng.randint(1, 40))
        params = random_params(rng, tokenizer.decode(token_ids, False))
        check_against_reference(tokenizer, token_ids, params, rng)


def test_a_decoder_that_is_not_local_is_decoded_whole(tmp_path: Path):
    """With clean-up, " ." decodes to "." only once the dot follows: the text already final changes."""
    tokenizer = CleanUp(byte_level(tmp_path))
    params = SamplingParams().with_defaults({}, max_tokens_limit=16)
    token_ids = [*b"x y", *b" ", *b".", *b"z"]
    for end in (3, 4, 5, 6):
        check_against_reference(tokenizer, token_ids[:end], params, random.Random(end))
    completion = Completion(0, params)
    for end in (3, 4, 5, 6):
        completion.update(tokenizer, token_ids[:end], end == 6)
    assert completion.output.text == tokenizer.decode(token_ids) == "x y.z"


def test_a_step_decodes_only_the_newest_tokens_of_a_4000_token_output(tmp_path: Path):
    """1,000 steps of 4 tokens (one block each): the tokens decoded per step stay at a few blocks' worth, the
    same at the end as at the start, while the text stays exactly the whole decode. The text splits multi-byte
    characters across blocks and keeps ending in the first character of a stop string (held back, with the
    logprobs of its tokens), and the stop string comes at the very end."""
    inner = byte_level(tmp_path)
    tokenizer = Counting(inner)
    token_ids = [*(("héllo wörld 中文 😀! " * 200).encode()[:3995]), *"😀?".encode()]
    assert len(token_ids) == 4000
    params = SamplingParams(stop=["😀?"], logprobs=0).with_defaults({}, max_tokens_limit=4000)
    completion = Completion(0, params)
    logprobs = [{t: Logprob(-1.0, 1)} for t in token_ids]
    per_step = []
    for end in range(4, 4001, 4):
        before = tokenizer.num_decoded
        hit = completion.update(tokenizer, token_ids[:end], finished=False)
        completion.show_logprobs(logprobs[:end], lambda t: None)
        per_step.append(tokenizer.num_decoded - before)
        text = inner.decode(token_ids[:end])
        assert completion.output.text == text[: len(completion.output.text)]
        assert text.startswith(completion.output.text) and len(text) - len(completion.output.text) <= 2
    assert hit and completion.output.text == inner.decode(token_ids).removesuffix("😀?")  # up to the stop string
    *streaming, last = per_step  # the last step also finds the tokens through the stop string, once
    assert max(streaming) <= 100 and last <= 500, (max(streaming), last)
    assert max(streaming[-100:]) <= max(streaming[:100])  # no growth with the output
    assert sum(per_step) < 10 * len(token_ids)  # a whole decode per step: 4 + 8 + ... + 4,000 = 2,002,000
