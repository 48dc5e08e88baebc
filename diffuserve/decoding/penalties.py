"""Presence, frequency and repetition penalties: a step applied to a block's logit rows before any decoder reads
them, so every decoder (mask policies, autoregressive, renoise, grammar-constrained) decodes penalised logits at
every denoising step. For a logit l of a token counted c > 0 times, in this order (vLLM's):

    repetition r (transformers', vLLM's)    l / r if l > 0 else l * r
    frequency  f (OpenAI's)                 l - f * c
    presence   p (OpenAI's)                 l - p

on the raw logits, before temperature, top-k, top-p and the decoder's rule. Counted tokens: the request's
committed output tokens (its finished blocks; tokens accepted in the open block do not count until it is
finished), plus the prompt's with `penalize_prompt`. The counts live on the device in one table kept across
steps, a row [V] per penalised request, grown by what each request committed since the step that last read it (one
indexed add for the whole step). A step's blocks are penalised all at once (`apply_penalties`: each row by its
own request's counts and penalties), one block as a batch of one. A request without penalties is never wrapped
(registry.py), so it pays nothing. Knows nothing of caches or models.
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


def apply_penalties(
    rows: torch.Tensor, counts: torch.Tensor, params: list[ResolvedSamplingParams], lengths: list[int]
) -> torch.Tensor:
    """rows [N, V] fp32: request i's `lengths[i]` rows, request after request, edited in place; counts [R, V]:
    request i's counts -> every request's rows penalised by its own counts and penalties (the module docstring's
    rule), all at once. A penalty a request leaves off takes its neutral value in its rows (repetition 1,
    frequency and presence 0), which leaves them exactly as they are: x / 1, x * 1 and x - 0 are x."""
    device, dtype = rows.device, rows.dtype
    counts = _per_row(counts, lengths)  # [N, V]
    seen = counts > 0
    repetition = [p.repetition_penalty for p in params]
    if any(r != 1 for r in repetition):
        r = _per_row(torch.tensor(repetition, dtype=dtype, device=device)[:, None], lengths)  # [N, 1]
        rows.copy_(torch.where(seen, torch.where(rows > 0, rows / r, rows * r), rows))
    frequency = [p.frequency_penalty for p in params]
    if any(frequency):
        rows -= _per_row(torch.tensor(frequency, dtype=dtype, device=device)[:, None], lengths) * counts.to(dtype)
    presence = [p.presence_penalty for p in params]
    if any(presence):
        rows -= _per_row(torch.tensor(presence, dtype=dtype, device=device)[:, None], lengths) * seen.to(dtype)
    return rows


def _per_row(values: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """values [R, ...] -> [N, ...]: request i's entry repeated for each of its `lengths[i]` rows."""
    if all(length == 1 for length in lengths):  # one row per request (autoregressive steps): no copy
        return values
    repeats = torch.tensor(lengths, dtype=torch.long, device=values.device)
    return values.repeat_interleave(repeats, dim=0, output_size=sum(lengths))


class PenaltyCounts:
    """Every penalised request's token counts, a row [V] of one table on the device kept across steps, grown by the
    output each request committed since it was last read."""

    def __init__(self) -> None:
        self._table: torch.Tensor | None = None
        """[rows, V] long: row `_rows[request id][0]` holds that request's counts."""
        self._rows: dict[str, list[int]] = {}
        """request id -> [its row, the output tokens its row counts]."""
        self._free: list[int] = []

    def of(self, request: Request, vocab_size: int, device: torch.device) -> torch.Tensor:
        """The request's counts now [V]: its committed output tokens (and its prompt's with penalize_prompt)."""
        return self.rows([request], vocab_size, device)[0]

    def rows(self, requests: list[Request], vocab_size: int, device: torch.device) -> torch.Tensor:
        """[R, V] long, a copy: each request's counts now, its row first brought up to its committed output (a
        request seen first, or whose output was cut back, is counted afresh)."""
        fresh: list[int] = []  # rows counted afresh
        added_rows: list[int] = []  # (row, token) of every token to count
        added_tokens: list[int] = []
        taken: list[int] = []  # each request's row
        for request in requests:
            output = request.output_token_ids
            entry = self._rows.get(request.request_id)
            if entry is None or entry[1] > len(output):
                if entry is None:
                    entry = self._rows[request.request_id] = [self._take_row(vocab_size, device), 0]
                entry[1] = 0
                fresh.append(entry[0])
                if request.params.penalize_prompt:
                    _add(added_rows, added_tokens, entry[0], request.prompt_token_ids, vocab_size)
            _add(added_rows, added_tokens, entry[0], output[entry[1] :], vocab_size)
            entry[1] = len(output)
            taken.append(entry[0])
        table = self._table
        assert table is not None, "a row was taken"
        if fresh:
            table[torch.tensor(fresh, dtype=torch.long, device=device)] = 0
        if added_tokens:  # one indexed add for every request's new tokens
            index = torch.tensor([added_rows, added_tokens], dtype=torch.long, device=device)  # [2, T]
            table.index_put_((index[0], index[1]), torch.ones_like(index[0]), accumulate=True)
        return table.index_select(0, torch.tensor(taken, dtype=torch.long, device=device))

    def release(self, request_id: str) -> None:
        entry = self._rows.pop(request_id, None)
        if entry is not None:
            self._free.append(entry[0])

    def _take_row(self, vocab_size: int, device: torch.device) -> int:
        if not self._free:  # a table twice as large, the old rows kept
            old = self._table
            size = 0 if old is None else old.shape[0]
            self._table = torch.zeros(max(8, 2 * size), vocab_size, dtype=torch.long, device=device)
            if old is not None:
                self._table[:size] = old
            self._free = list(range(self._table.shape[0] - 1, size - 1, -1))
        return self._free.pop()


def _add(rows: list[int], tokens: list[int], row: int, new: list[int], vocab_size: int) -> None:
    """Queues `new`'s tokens (those in the vocabulary) to be counted in `row`."""
    kept = [t for t in new if 0 <= t < vocab_size]
    rows += [row] * len(kept)
    tokens += kept


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
        rows = apply_penalties(rows.clone(), counts[None], [request.params], [rows.shape[0]])
        return self.inner.decode(request, rows, positions, generators)

    def decode_blocks(
        self,
        requests: list[Request],
        rows: torch.Tensor,
        positions: list[list[int]],
        generators: RequestGenerators,
    ) -> list[BlockDecode]:
        """Each block's rows penalised as `decode` penalises them, all at once (on one copy of `rows`), then the
        inner decoder decodes them all at once (its batched pass, where it has one)."""
        counts = self.counts.rows(requests, rows.shape[-1], rows.device)  # [R, V]
        lengths = [len(read) for read in positions]
        rows = apply_penalties(rows.clone(), counts, [r.params for r in requests], lengths)  # a copy, as `decode`
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
            apply_penalties(rows[i : i + 1], counts[None], [request.params], [1])
            counts[draft] += 1
        return self.inner.verify(request, rows, positions, drafts, generators, grammar)

    def release(self, request_id: str) -> None:
        self.counts.release(request_id)
        self.inner.release(request_id)
