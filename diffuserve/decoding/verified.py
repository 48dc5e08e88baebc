"""VerifiedDecoder (decoder=verified): a block is drafted, greedily, and checked against the model's causal path,
whose row before each position predicts it (the AR shift), so the output is the model's autoregressive output:
token-identical to greedy autoregressive decoding at temperature 0, distributed exactly as autoregressive sampling
otherwise (same temperature, top-k, top-p).

    the draft    by default every masked position of the block at once, in one forward (the argmax of each
                 position's row: LinearSpec's one-forward draft); with `steps` > 1 the threshold policy over up to
                 that many forwards (each accepts at least block_length // steps)
    the head     the block's first position is read from a causal row (the block is anchored right after the last
                 verified token, core/request.py), so the step that writes it checks it against that same row
                 (`verify` on one position): it is verified in the forward that wrote it
    the rest     checked by the forward that commits the block, against the commit's causal rows

    temperature 0   keep drafted tokens while they equal the causal argmax; at the first that does not, the
                    argmax is written instead (the "bonus" token) and the next block starts after it
    temperature > 0 speculative sampling with a point-mass draft q = 1[x]: keep x with probability
                    min(1, p(x) / q(x)) = p(x); on rejection draw from the normalised residual (p - q)+, which is
                    p without x. A sampled draft would need its q row ([V] floats) kept per drafted position
                    until the commit; the greedy draft needs nothing kept

Why that is exact: at each position the kept token is x with probability p(x) and any other y with probability
(1 - p(x)) * p(y) / (1 - p(x)) = p(y).

p is the causal row after the processing autoregressive decoding gives it: the mask token (and, below min_tokens,
the stop ids) forbidden, the penalties, and with structured output the grammar's mask at that position. The
matcher is the one the drafts were grammar-walked with; before verifying it is synced to the verified tokens
(rolling back the drafted block the next block's walk had fed it) and is then fed each draft as it is kept, so a
rejected suffix is never in it. A verified token's logprobs are read from that same row, as autoregressive
decoding's from its own (decoding/logprobs.py); the drafts compute none.

Which positions are compared and what happens to the request afterwards is core/verification.py's; which rows
the forward gives is the worker's (worker/verification.py).
"""

from __future__ import annotations

import torch

from diffuserve.core.outputs import TokenLogprobs
from diffuserve.core.request import Request
from diffuserve.core.writes import Verification
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.decoding.grammar_walk import StructuredDecoding, grammar_masked
from diffuserve.decoding.logprobs import logprob_rows, token_logprobs
from diffuserve.decoding.mask import MaskDecoder
from diffuserve.decoding.mask_policies import FixedStepsDecoder, ThresholdDecoder, filter_logits
from diffuserve.decoding.penalties import PenaltyCounts, apply_penalties
from diffuserve.sampling_params import VERIFIED, ResolvedSamplingParams


class VerifiedDecoder(MaskDecoder):
    def __init__(
        self,
        block_length: int,
        penalty_counts: PenaltyCounts | None = None,
        structured: StructuredDecoding | None = None,
        one_forward: bool = True,
        name: str = VERIFIED,
    ) -> None:
        super().__init__(name, FixedStepsDecoder() if one_forward else ThresholdDecoder(), block_length)
        self.one_forward = one_forward
        """Every masked position drafted in one forward; else the threshold policy over `steps` forwards."""
        self.penalty_counts = penalty_counts if penalty_counts is not None else PenaltyCounts()
        """The committed output's counts (the registry's): the drafts are penalised with them, and each causal row
        with them plus the tokens before its position (`_penalised`)."""
        self.structured = structured
        """The grammar matchers the drafts were walked with (the registry's): the causal rows are masked by them."""

    def draft_params(self, request: Request) -> ResolvedSamplingParams:
        """Drafts are greedy whatever the request's temperature (q is then a point mass: nothing to keep), and
        compute no logprobs (a verified token's are its causal row's); a one-forward draft takes every position."""
        if self.one_forward:
            return request.params.replace(temperature=0.0, logprobs=None, steps=1)
        return request.params.replace(temperature=0.0, logprobs=None)

    def verify(
        self,
        request: Request,
        rows: torch.Tensor,
        positions: list[int],
        drafts: list[int],
        generators: RequestGenerators,
    ) -> Verification:
        """rows [M, V] fp32: the causal path's predictions of the drafted absolute `positions` (ascending,
        consecutive), whose drafts are `drafts` -> how many drafts are kept, the token at the first rejected
        position, and (when asked for) the logprobs of the kept drafts and that token."""
        offsets = [p - request.block_start for p in positions]  # canvas indices relative to the open block
        rows = forbid_tokens(request, offsets, rows)
        params = request.params
        if params.has_penalties:
            rows = self._penalised(request, rows, positions, drafts)
        generator = None if params.is_greedy else generators.of(request)
        try:
            grammar = self._grammar(request, positions[0])
            kept, token = _compare(rows, drafts, params, generator, grammar)
        except RuntimeError as e:  # the matcher failed: the request fails alone (take_failures), as when drafting
            assert self.structured is not None
            self.structured.fail(request, e)
            return Verification(len(positions), len(positions), None)
        tokens = [*drafts[:kept], *([] if token is None else [token])]
        logprobs = None if params.logprobs is None else _logprobs(rows[: len(tokens)], tokens, params)
        return Verification(len(positions), kept, token, logprobs)

    def _penalised(self, request: Request, rows: torch.Tensor, positions: list[int], drafts: list[int]) -> torch.Tensor:
        """rows [M, V], each penalised as autoregressive decoding would penalise its position: counting every
        token before it (the output, the verified tokens after it, then the drafts before it), so the penalised
        output is the model's autoregressive one at any block length."""
        first = request.block_start - len(request.drafted)  # the position of drafted[0]
        counts = self.penalty_counts.of(request, rows.shape[-1], rows.device)
        counts = counts + torch.bincount(
            torch.tensor(request.drafted[: positions[0] - first], dtype=torch.long, device=rows.device),
            minlength=rows.shape[-1],
        )
        for i, draft in enumerate(drafts):
            apply_penalties(rows[i : i + 1], counts, request.params)
            counts[draft] += 1
        return rows

    def _grammar(self, request: Request, start: int) -> GrammarState | None:
        """With structured output: the request's matcher fed its verified tokens before position `start`."""
        if request.params.structured_outputs is None or self.structured is None:
            return None
        state = self.structured.state_of(request)
        first = request.block_start - len(request.drafted)  # the position of drafted[0]
        state.sync(request.output_token_ids + request.drafted[: start - first])
        return state


def _compare(
    rows: torch.Tensor,
    drafts: list[int],
    params: ResolvedSamplingParams,
    generator: torch.Generator | None,
    grammar: GrammarState | None,
) -> tuple[int, int | None]:
    """-> (the leading drafts kept, the token at the first rejected position or None). With a `grammar`, each row
    is masked in place by the matcher's state after the drafts kept before it, which it is then fed."""
    if grammar is None and params.is_greedy:  # one transfer for the whole block
        target = rows.argmax(dim=-1).tolist()
        rejected = next((i for i, (d, t) in enumerate(zip(drafts, target, strict=False)) if d != t), None)
        return (len(drafts), None) if rejected is None else (rejected, target[rejected])
    for i, draft in enumerate(drafts):
        if grammar is not None:
            rows[i] = grammar_masked(rows[i : i + 1], grammar.allowed())[0]
        token = _check(rows[i], draft, params, generator)
        if token is not None:
            return i, token
        if grammar is not None:
            grammar.push(draft)
    return len(drafts), None


def _check(
    row: torch.Tensor, draft: int, params: ResolvedSamplingParams, generator: torch.Generator | None
) -> int | None:
    """row [V]: None if `draft` is kept, else the token written instead (greedy: the argmax; sampled: x kept with
    probability p(x), else a draw from p without x)."""
    if params.is_greedy:
        best = int(row.argmax())
        return None if best == draft else best
    probs = torch.softmax(filter_logits(row[None] / params.temperature, params.top_k, params.top_p), dim=-1)[0]
    if torch.rand((), generator=generator, device=row.device) < probs[draft]:
        return None
    residual = probs.clone()
    residual[draft] = 0.0
    return int(torch.multinomial(residual, 1, generator=generator).item())


def _logprobs(rows: torch.Tensor, tokens: list[int], params: ResolvedSamplingParams) -> list[TokenLogprobs]:
    """rows [T, V] (processed, grammar-masked), tokens [T] verified -> their logprobs under the distribution each
    was verified against: at temperature 0 the softmax of the row, else the tempered, filtered one."""
    assert params.logprobs is not None
    scores = rows if params.is_greedy else filter_logits(rows / params.temperature, params.top_k, params.top_p)
    index = torch.arange(len(tokens), device=rows.device)
    chosen = torch.tensor(tokens, dtype=torch.long, device=rows.device)
    table = logprob_rows(torch.log_softmax(scores, dim=-1), chosen, index, len(tokens), params.logprobs)
    return token_logprobs(table, chosen, index)
