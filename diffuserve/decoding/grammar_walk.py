"""Grammar-constrained block decoding: a step's accepted tokens always extend a valid prefix of the grammar.

A block decides its positions in any order, but a grammar mask is a left-to-right object. The rule, per step,
for a request with `structured_outputs` (its decided generated tokens always form a prefix of the block):

1. walk the masked positions left to right from the first undecided one; mask each position's logits with the
   matcher's state after the tokens before it (the decided ones, then the walk's own proposals), propose a
   token from the masked logits, and feed it to the matcher speculatively;
2. let the request's decoder select positions from that proposal as it always does (threshold, fixed, entropy);
3. accept the decoder's per-step count (threshold and fixed: the schedule's `block_length // steps`; entropy: 1)
   taken from the left, so each step commits >= 1 token, then every following position the decoder's rule
   accepts on its own (threshold: above the threshold; entropy: within the bound; fixed: none), up to the first
   it does not; roll the matcher back to the decided tokens (the next step feeds what was accepted).

Positions after an unselected one are proposed (their confidences feed the decoder's rule) but never accepted
before everything left of them is decided, so every committed sequence is a valid grammar prefix, and a block
still commits several tokens per forward when the model is confident left to right.

Under decoder=verified the walk writes the drafts (greedy, after the drafted block that awaits verification), and
decoding/verified.py masks the causal rows that check them with the same matcher (`state_of`, `grammar_masked`).

Owns the grammar compiler (built on first use) and each request's `GrammarState`; knows nothing of batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from diffuserve.core.request import Request
from diffuserve.decoding.grammar_compiler import GrammarCompiler
from diffuserve.decoding.grammar_state import GrammarState
from diffuserve.decoding.logprobs import LogprobRows
from diffuserve.decoding.mask_policies import (
    MASK_POLICIES,
    EntropyBoundPolicy,
    FixedStepsPolicy,
    MaskPolicy,
    Proposal,
    ThresholdPolicy,
    propose,
)
from diffuserve.sampling_params import ResolvedSamplingParams
from diffuserve.structured_outputs import StructuredOutputsParams


class StructuredDecoding:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> None:
        """`tokenizer`: diffuserve's Tokenizer (its transformers tokenizer is wrapped on first use)."""
        self._tokenizer, self._vocab_size, self._eos = tokenizer, vocab_size, list(eos_token_ids)
        self._compiler: GrammarCompiler | None = None
        self.states: dict[str, GrammarState] = {}
        """Each constrained request's matcher state, by request id."""
        self.failures: dict[str, str] = {}
        """Requests whose matcher failed since the engine last looked (e.g. a grammar too complex to parse):
        id -> message. The engine fails them alone (take_failures), not the step."""

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = GrammarCompiler(self._tokenizer.hf, self._vocab_size, self._eos)
        return self._compiler

    def check(self, spec: StructuredOutputsParams) -> None:
        """Compiles `spec` (cached); RequestError naming the problem if it does not compile."""
        self.compiler.compile(spec)

    def release(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def take_failures(self) -> dict[str, str]:
        """`failures`, emptied."""
        failures, self.failures = self.failures, {}
        return failures

    def decode(
        self,
        request: Request,
        rows: torch.Tensor,
        positions: list[int],
        generator: torch.Generator | None,
        block_length: int,
        params: ResolvedSamplingParams | None = None,
        policy: MaskPolicy | None = None,
    ) -> tuple[Proposal | None, list[int]]:
        """The step's proposal and the canvas indices whose proposed token is written. rows [M, V]: logits at the
        masked canvas indices `positions` (ascending), proposed with `params` and decided by `policy` (default:
        the request's and its decoder's; a verified request's drafts: greedy, by the threshold policy). A matcher
        failure writes nothing (no proposal) and is reported by `take_failures`."""
        params = request.params if params is None else params
        policy = MASK_POLICIES[params.decoder] if policy is None else policy
        try:
            return self._decode(request, rows, positions, generator, block_length, params, policy)
        except RuntimeError as e:
            self.fail(request, e)
            return None, []

    def fail(self, request: Request, error: RuntimeError) -> None:
        """The request's matcher failed: reported by `take_failures`, its state forgotten."""
        self.failures[request.request_id] = f"structured output: {error}".splitlines()[0]
        self.release(request.request_id)

    def _decode(
        self,
        request: Request,
        rows: torch.Tensor,
        positions: list[int],
        generator: torch.Generator | None,
        block_length: int,
        params: ResolvedSamplingParams,
        decoder: MaskPolicy,
    ) -> tuple[Proposal, list[int]]:
        start = self.begin(request, positions, block_length, params, decoder)
        proposal, confidences = self._walk(
            start.state, rows, start.positions, params, generator, block_length, decoder.needs_entropy, start.stop
        )
        return proposal, self.end(start, request, proposal, confidences, params, decoder, block_length)

    def begin(
        self,
        request: Request,
        positions: list[int],
        block_length: int,
        params: ResolvedSamplingParams,
        decoder: MaskPolicy,
    ) -> WalkStart:
        """A block's walk before its first position: the matcher synced to the decided tokens, the run of masked
        positions it may walk, the decoder's count from the left and when the walk may stop. Raises RuntimeError
        if the matcher fails."""
        state = self.state_of(request)
        first = request.generation_start_in_block()
        undecided = positions[0]
        # Only the run of masks from the first undecided position can be accepted (a decided token after a gap
        # was never fed to the walk's matcher).
        positions = positions[: next((k for k, i in enumerate(positions) if i != undecided + k), len(positions))]
        # A verified request's drafted block (not yet verified) precedes the open one: the drafts build on it.
        decided = request.output_token_ids + request.draft.tokens + request.canvas[first:undecided]
        state.sync(decided)
        # The decoder's per-step count (>= 1 at every step of a block), taken from the left.
        floor = (
            1 if type(decoder) is EntropyBoundPolicy else decoder.min_count(request.step_in_block, params, block_length)
        )
        return WalkStart(state, positions, len(decided), floor, _early_stop(decoder, floor, params.threshold))

    def end(
        self,
        start: WalkStart,
        request: Request,
        proposal: Proposal,
        confidences: list[float],
        params: ResolvedSamplingParams,
        decoder: MaskPolicy,
        block_length: int,
    ) -> list[int]:
        """After the walk (`confidences`: of the positions walked): the matcher rolled back to the decided
        tokens, and the canvas indices whose proposed token is written."""
        start.state.truncate(start.num_decided)
        positions, floor = start.positions, start.floor
        if start.stop is not None:
            run = (
                floor
                if type(decoder) is FixedStepsPolicy
                else next(
                    (k for k, c in enumerate(confidences) if k >= floor and c <= params.threshold), len(confidences)
                )
            )
        else:
            # The positions taken from the left fill the decoder's count: ranked above every proposal (a
            # confidence of 2 passes any threshold), so a count-based rule (threshold's top-k fallback, fixed)
            # never selects a later position to fill it; only what the rule accepts on its own extends the run.
            taken = torch.zeros_like(proposal.confidence, dtype=torch.bool)
            taken[positions[:floor]] = True
            ranked = Proposal(proposal.tokens, proposal.confidence.masked_fill(taken, 2.0), proposal.entropy)
            canvas = torch.tensor(request.canvas, device=proposal.tokens.device)  # [B]
            selected = decoder.decide(
                ranked, canvas, canvas == request.mask_token_id, request.step_in_block, params, block_length
            ).tolist()
            run = next((k for k in range(floor, len(positions)) if not selected[positions[k]]), len(positions))
        return positions[: min(run, len(confidences))]

    def _walk(
        self,
        state: GrammarState,
        rows: torch.Tensor,
        positions: list[int],
        params: Any,
        generator: torch.Generator | None,
        block_length: int,
        need_entropy: bool,
        stop: Callable[[int, float], bool] | None,
    ) -> tuple[Proposal, list[float]]:
        """Proposes each position from its grammar-masked logits, feeding each proposal to `state`, until
        `stop(k, confidence)` says position k ends what can be accepted. Returns the proposal and the walked
        positions' confidences."""
        walked: list[float] = []
        device = rows.device
        tokens = torch.zeros(block_length, dtype=torch.long, device=device)
        confidence = torch.full((block_length,), float("-inf"), device=device)
        entropy = torch.full((block_length,), float("inf"), device=device) if need_entropy else None
        k_top = params.logprobs
        logprobs = None if k_top is None else LogprobRows.empty(block_length, min(k_top, rows.shape[-1]), device)
        for k, index in enumerate(positions):
            row = grammar_masked(rows[k : k + 1], state.allowed())  # [1, V]
            one = propose(
                row, torch.tensor([index], device=device), block_length, params, generator, need_entropy, k_top
            )
            tokens[index], confidence[index] = one.tokens[index], one.confidence[index]
            if entropy is not None and one.entropy is not None:
                entropy[index] = one.entropy[index]
            if logprobs is not None and one.logprobs is not None:
                logprobs.copy_row(index, one.logprobs)
            state.push(int(one.tokens[index]))
            walked.append(float(one.confidence[index]))
            if stop is not None and stop(k, walked[-1]):
                break
        return Proposal(tokens, confidence, entropy, logprobs), walked

    def state_of(self, request: Request) -> GrammarState:
        """The request's matcher state, made on first use (it follows the request's tokens: `GrammarState.sync`)."""
        state = self.states.get(request.request_id)
        if state is None:
            spec = request.params.structured_outputs
            assert spec is not None
            trigger = self._tokenizer.encode(spec.start_after, add_special_tokens=False) if spec.start_after else None
            state = GrammarState(
                self.compiler.matcher(spec),
                self._vocab_size,
                trigger,
                request.params.stop_ids,
                self.compiler.tokenizer.eos_tokens,
            )
            self.states[request.request_id] = state
        return state


@dataclass(frozen=True)
class WalkStart:
    """A block's walk as `StructuredDecoding.begin` set it up."""

    state: GrammarState
    positions: list[int]
    """The canvas indices the walk may propose, left to right: the run of masks from the first undecided one."""
    num_decided: int
    """Generated tokens the matcher was synced to (it is rolled back to them after the walk)."""
    floor: int
    """The decoder's count taken from the left."""
    stop: Callable[[int, float], bool] | None
    """When the walk may stop (`_early_stop`); None: every position is walked."""


def grammar_masked(row: torch.Tensor, allowed: np.ndarray | None) -> torch.Tensor:
    """row [1, V] -> a copy with the tokens the grammar forbids (`allowed`: GrammarState.allowed) at -inf; the row
    itself when unconstrained. min_tokens may have removed the only tokens the grammar allows (its end): the grammar
    wins, and those tokens are then equally likely."""
    if allowed is None:
        return row
    forbidden = ~torch.from_numpy(allowed).to(row.device)[None, :]
    masked = row.masked_fill(forbidden, float("-inf"))
    if bool(torch.isfinite(masked).any()):
        return masked
    return torch.zeros_like(row).masked_fill(forbidden, float("-inf"))


def _early_stop(decoder: MaskPolicy, floor: int, threshold: float) -> Callable[[int, float], bool] | None:
    """When the walk may stop, for decoders whose accepted run depends on the positions before it only:

    fixed accepts exactly the `floor` positions taken from the left; threshold accepts them and then every
    following position whose confidence is > threshold, up to the first that is not (its top-k fallback never
    reaches past them: they fill its count). Entropy weighs every masked position: None, the whole run is
    walked."""
    if type(decoder) is FixedStepsPolicy:
        return lambda k, confidence: k + 1 >= floor
    if type(decoder) is ThresholdPolicy:
        return lambda k, confidence: k >= floor and confidence <= threshold
    return None
