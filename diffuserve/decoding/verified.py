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
the stop ids) forbidden, the penalties (decoding/penalties.py, the request's wrapper), and with structured output
the grammar's mask at that position (decoding/constrained.py's matcher, fed each draft as it is kept). A verified
token's logprobs are read from that same row, as autoregressive decoding's from its own (decoding/logprobs.py);
the drafts compute none.

Which positions are compared and what happens to the request afterwards is core/verification.py's; which rows
the forward gives is the worker's (worker/verification.py); the step's checks, decoding/verification.py's.
"""

from __future__ import annotations

import torch

from diffuserve.core.outputs import TokenLogprobs
from diffuserve.core.request import Request
from diffuserve.core.writes import Verification
from diffuserve.decoding.generators import RequestGenerators, forbid_tokens
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.decoding.grammar_walk import grammar_masked
from diffuserve.decoding.logprobs import logprob_rows, token_logprobs
from diffuserve.decoding.mask import MaskDecoder
from diffuserve.decoding.mask_policies import FixedStepsPolicy, ThresholdPolicy, filter_logits
from diffuserve.sampling_defaults import VERIFIED
from diffuserve.sampling_params import ResolvedSamplingParams


class VerifiedDecoder(MaskDecoder):
    def __init__(self, block_length: int, one_forward: bool = True, name: str = VERIFIED) -> None:
        super().__init__(name, FixedStepsPolicy() if one_forward else ThresholdPolicy(), block_length)
        self.one_forward = one_forward
        """Every masked position drafted in one forward; else the threshold policy over `steps` forwards."""
        self._draft_params: dict[str, ResolvedSamplingParams] = {}
        """Per request id, its drafts' parameters: made once (a `replace` of the request's frozen parameters builds
        and checks a new dataclass of some thirty fields, and every draft step of every request reads them)."""

    def proposal_params(self, request: Request) -> ResolvedSamplingParams:
        """Drafts are greedy whatever the request's temperature (q is then a point mass: nothing to keep), and
        compute no logprobs (a verified token's are its causal row's); a one-forward draft takes every position."""
        params = self._draft_params.get(request.request_id)
        if params is None:
            steps = {"steps": 1} if self.one_forward else {}
            params = request.params.replace(temperature=0.0, logprobs=None, **steps)
            self._draft_params[request.request_id] = params
        return params

    def release(self, request_id: str) -> None:
        """Forgets the request's draft parameters."""
        self._draft_params.pop(request_id, None)

    def verify(
        self,
        request: Request,
        rows: torch.Tensor,
        positions: list[int],
        drafts: list[int],
        generators: RequestGenerators,
        grammar: GrammarState | None = None,
    ) -> Verification:
        """rows [M, V] fp32 (penalised by the request's wrapper, if any): the causal path's predictions of the
        drafted absolute `positions` (ascending, consecutive), whose drafts are `drafts` -> how many drafts are
        kept, the token at the first rejected position, and (when asked for) the logprobs of the kept drafts and
        that token. `grammar`: the matcher (synced by the grammar wrapper) each row is masked by."""
        offsets = [p - request.block_start for p in positions]  # canvas indices relative to the open block
        rows = forbid_tokens(request, offsets, rows)
        params = request.params
        generator = None if params.is_greedy else generators.of(request)
        kept, token = _compare(rows, drafts, params, generator, grammar)
        tokens = [*drafts[:kept], *([] if token is None else [token])]
        logprobs = None if params.logprobs is None else _logprobs(rows[: len(tokens)], tokens, params)
        return Verification(len(positions), kept, token, logprobs)


def greedy_verdict(drafts: list[int], target: list[int]) -> tuple[int, int | None]:
    """Drafts checked against their rows' argmaxes `target` -> (the leading drafts kept, the argmax written at the
    first disagreement, or None when all are kept)."""
    rejected = next((i for i, (d, t) in enumerate(zip(drafts, target, strict=False)) if d != t), None)
    return (len(drafts), None) if rejected is None else (rejected, target[rejected])


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
        return greedy_verdict(drafts, rows.argmax(dim=-1).tolist())
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
