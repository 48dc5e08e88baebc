"""Presence, frequency and repetition penalties: a step applied to a block's logit rows before any decoder reads
them, so every decoder (mask policies, autoregressive, renoise, grammar-constrained) decodes penalised logits at
every denoising step. For a logit l of a token counted c > 0 times, in this order (vLLM's):

    repetition r (transformers', vLLM's)    l / r if l > 0 else l * r
    frequency  f (OpenAI's)                 l - f * c
    presence   p (OpenAI's)                 l - p

on the raw logits, before temperature, top-k, top-p and the decoder's rule. Counted tokens: the request's
committed output tokens (its finished blocks; tokens accepted in the open block do not count until it is
finished), plus the prompt's with `penalize_prompt`. Each request's counts [V] live on the device and grow as
its blocks finish. A request without penalties is never wrapped (registry.py), so it pays nothing.
Knows nothing of batches, caches or models.
"""

from __future__ import annotations

import torch

from diffuserve.core.request import Request
from diffuserve.core.writes import Verification
from diffuserve.decoding.generators import RequestGenerators
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.decoding.protocol import BlockDecode, Decoder
from diffuserve.decoding.wrapped import WrappedDecoder
from diffuserve.sampling_params import ResolvedSamplingParams


def apply_penalties(rows: torch.Tensor, counts: torch.Tensor, params: ResolvedSamplingParams) -> torch.Tensor:
    """rows [M, V] fp32, edited in place; counts [V]: each token's count among the counted tokens."""
    seen = counts > 0  # [V]
    if params.repetition_penalty != 1:
        r = params.repetition_penalty
        rows[:, seen] = torch.where(rows[:, seen] > 0, rows[:, seen] / r, rows[:, seen] * r)
    if params.frequency_penalty:
        rows -= params.frequency_penalty * counts.to(rows.dtype)
    if params.presence_penalty:
        rows -= params.presence_penalty * seen.to(rows.dtype)
    return rows


class PenaltyCounts:
    """Each penalised request's token counts [V] on the device, grown as its output is committed."""

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, torch.Tensor]] = {}
        """request id -> (output tokens counted, counts [V])."""

    def of(self, request: Request, vocab_size: int, device: torch.device) -> torch.Tensor:
        """The request's counts now: its committed output tokens (and its prompt's with penalize_prompt)."""
        output = request.output_token_ids
        entry = self._counts.get(request.request_id)
        if entry is not None and entry[0] <= len(output):
            counted, counts = entry
        else:  # first use, or an output cut back: count afresh
            counted, counts = 0, torch.zeros(vocab_size, dtype=torch.long, device=device)
            if request.params.penalize_prompt:
                counts += _bincount(request.prompt_token_ids, vocab_size, device)
        if counted < len(output):
            counts = counts + _bincount(output[counted:], vocab_size, device)
        self._counts[request.request_id] = (len(output), counts)
        return counts

    def release(self, request_id: str) -> None:
        self._counts.pop(request_id, None)


def _bincount(tokens: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    ids = torch.tensor([t for t in tokens if 0 <= t < vocab_size], dtype=torch.long, device=device)
    return torch.bincount(ids, minlength=vocab_size)


class Penalized(WrappedDecoder):
    """A decoder whose logit rows are penalised (apply_penalties) before it reads them: a block's rows by the
    committed output's counts; a draft's causal rows, each as autoregressive decoding would penalise its position
    (counting every token before it: the output, the draft's tokens before the checked ones, then the checked
    drafts before it), so the penalised verified output is the autoregressive one at any block length."""

    def __init__(self, inner: Decoder, counts: PenaltyCounts) -> None:
        super().__init__(inner)
        self.counts = counts

    def decode(
        self, request: Request, rows: torch.Tensor, positions: list[int], generators: RequestGenerators
    ) -> BlockDecode:
        counts = self.counts.of(request, rows.shape[-1], rows.device)
        # A copy: `rows` may be the step's logits themselves, which a verified request's head check reads again
        # (and penalises once more, as its own causal row) after this decode.
        return self.inner.decode(request, apply_penalties(rows.clone(), counts, request.params), positions, generators)

    def decode_blocks(
        self,
        requests: list[Request],
        rows: torch.Tensor,
        positions: list[list[int]],
        generators: RequestGenerators,
    ) -> list[BlockDecode]:
        """Each block's rows penalised as `decode` penalises them (on one copy of `rows`), then the inner decoder
        decodes them all at once (its batched pass, where it has one)."""
        rows, start = rows.clone(), 0  # a copy, as in `decode`
        for request, read in zip(requests, positions, strict=True):
            counts = self.counts.of(request, rows.shape[-1], rows.device)
            apply_penalties(rows[start : start + len(read)], counts, request.params)  # a view: edits the copy
            start += len(read)
        return self.inner.decode_blocks(requests, rows, positions, generators)

    def verify(
        self,
        request: Request,
        rows: torch.Tensor,
        positions: list[int],
        drafts: list[int],
        generators: RequestGenerators,
        grammar: GrammarState | None = None,
    ) -> Verification:
        first = request.draft.start(request.block_start)  # the position of the draft's first token
        counts = self.counts.of(request, rows.shape[-1], rows.device) + _bincount(
            request.draft.tokens[: positions[0] - first], rows.shape[-1], rows.device
        )
        rows = rows.clone()  # the caller's rows stay the model's (see decode)
        for i, draft in enumerate(drafts):
            apply_penalties(rows[i : i + 1], counts, request.params)
            counts[draft] += 1
        return self.inner.verify(request, rows, positions, drafts, generators, grammar)

    def release(self, request_id: str) -> None:
        self.counts.release(request_id)
        self.inner.release(request_id)
