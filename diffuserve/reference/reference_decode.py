"""The naive reference decode: no cache, the whole sequence recomputed at every step under the block-causal
mask, one request at a time (as the LLaDA2 reference `generate` does). Slow and obviously correct: the tests
compare the engine against it, and `bench compare` measures against it.

It shares nothing with the engine but the model's forward: its decoders and sampler (reference_decoders), its
defaults, max-token cap and stop ids (reference_model) and its block-causal mask (here) are its own, so a change
in the engine's version of any of them is caught instead of copied.

Stops after the block in which a stop id appears or max_tokens is reached, then cuts the answer at the first
stop id (inclusive; not before min_tokens) and at max_tokens. With decoder=edit a block runs as LLaDA2.1's
`generate` runs it: steps while masks remain, then up to max_post_edit_steps more, ending early at a step that
changes nothing. With `logprobs` set, it also records each answer token's logprob, rank and top alternatives
under the distribution of the step that last wrote it.

Penalties (presence, frequency, repetition) are applied by plain arithmetic, token by token, to every step's
logits: counted over the generated tokens of the blocks before the one being denoised (and the prompt's with
penalize_prompt), as the SamplingParams field docs define them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.reference_coreset import block_coreset_routing
from diffuserve.reference.reference_decoders import positions_to_write, propose
from diffuserve.reference.reference_dmoe import dmoe_routing
from diffuserve.reference.reference_model import ReferenceModel, post_edit_budget
from diffuserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class ReferenceLogprob:
    """A written token's log-probability and 1-based rank in its step's distribution, and the top alternatives
    of that distribution (those with a finite logprob, at most params.logprobs)."""

    logprob: float
    rank: int
    top: dict[int, float]


@dataclass(frozen=True)
class ReferenceResult:
    token_ids: list[int]
    steps_per_block: list[int]
    forwards_to_answer: int
    """Forwards until every token of the answer was final (accepted; with decoder=edit, its block finished):
    the forwards an engine that stops as soon as the answer is decided needs."""
    num_edits: int = 0
    """Accepted tokens rewritten by an editing decoder."""
    logprobs: list[ReferenceLogprob] | None = None
    """With params.logprobs: one per answer token."""
    decided_at: list[int] = field(default_factory=list)
    """Per answer token, the forward (from 1) at which it became final, as `forwards_to_answer` counts them."""

    @property
    def num_forwards(self) -> int:
        return sum(self.steps_per_block)


@dataclass
class _Sequence:
    """The request's whole sequence as it is decoded, and the forward at which each position became final."""

    tokens: list[int]
    num_prompt: int
    final_at: list[int]
    forwards: int = 0
    edits: int = 0
    logprobs: dict[int, ReferenceLogprob] = field(default_factory=dict)
    """position -> the logprob of its latest write (params.logprobs only)."""


def block_causal_mask(num_blocks: int, block: int) -> torch.Tensor:
    """[T, T] bool, T = num_blocks * block, True = may attend: a lower-triangular matrix of blocks, each entry
    grown into a block x block tile (the LLaDA2 reference's construction)."""
    blocks = torch.tril(torch.ones(num_blocks, num_blocks, dtype=torch.bool))
    return blocks.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)


@torch.inference_mode()
def reference_generate(
    ref: ReferenceModel, prompt: list[int], params: SamplingParams, generator: torch.Generator | None = None
) -> ReferenceResult:
    """Decodes `prompt` with `params` as given to the engine (None knobs take the model's defaults here)."""
    params = ref.resolve(params)
    max_tokens, stop_ids = ref.max_tokens(len(prompt), params), ref.stop_ids(params)
    block, num_prompt = ref.block_length, len(prompt)
    if ref.steps_capped_by_gen_length:
        params = dataclasses.replace(params, steps=min(params.steps or block, max_tokens))
    num_blocks = -(-(num_prompt + max_tokens) // block)
    mask = block_causal_mask(num_blocks, block)
    total = num_blocks * block
    seq = _Sequence(list(prompt) + [ref.mask_token_id] * (total - num_prompt), num_prompt, [0] * total)
    steps_per_block = []
    for start in range(num_prompt // block * block, total, block):
        steps_per_block.append(_decode_block(ref, seq, start, mask, params, stop_ids, generator))
        generated = seq.tokens[num_prompt : start + block]
        if start + block >= num_prompt + max_tokens or any(
            t in stop_ids and g >= params.min_tokens for g, t in enumerate(generated)
        ):
            break
    answer = _cut(seq.tokens[num_prompt : num_prompt + max_tokens], stop_ids, params.min_tokens)
    to_answer = max(seq.final_at[num_prompt : num_prompt + len(answer)], default=0)
    logprobs = None if params.logprobs is None else [seq.logprobs[num_prompt + g] for g in range(len(answer))]
    decided_at = seq.final_at[num_prompt : num_prompt + len(answer)]
    return ReferenceResult(answer, steps_per_block, to_answer, seq.edits, logprobs, decided_at)


def _decode_block(
    ref: ReferenceModel,
    seq: _Sequence,
    start: int,
    mask: torch.Tensor,
    params: SamplingParams,
    stop_ids: frozenset[int],
    generator: torch.Generator | None,
) -> int:
    """Denoises seq.tokens[start : start + B] in place; returns its steps. Steps run while masks remain, then
    (decoder=edit) up to the post-edit budget more, the block ending after a step that changed nothing."""
    block, end = ref.block_length, start + ref.block_length
    first_generated = max(0, seq.num_prompt - start)
    editing = params.decoder == "edit"
    step = post_edit_steps = 0
    while True:
        canvas = seq.tokens[start:end]
        masked = [i for i, t in enumerate(canvas) if t == ref.mask_token_id]
        if not masked:
            post_edit_steps += 1
            if post_edit_steps > post_edit_budget(params):
                break
        read = list(range(first_generated, block)) if editing else masked
        logits = _logits(ref, seq.tokens[:end], mask, [start + i for i in read])
        _penalize(logits, seq, start, params)
        _suppress_early_stops(logits, [start + i - seq.num_prompt for i in read], params.min_tokens, stop_ids)
        keep_log_probs = params.logprobs is not None
        proposal = propose(logits, read, block, params, generator, keep_log_probs, ref.mask_token_id)
        write = positions_to_write(proposal, canvas, masked, first_generated, step, params)
        if proposal.log_probs is not None:
            for i in write:
                seq.logprobs[start + i] = _logprob(proposal.log_probs[read.index(i)], proposal.tokens[i], params)
        seq.forwards += 1
        changed = [i for i in write if proposal.tokens[i] != canvas[i]]
        seq.edits += sum(1 for i in changed if i not in masked)
        for i in write:
            seq.tokens[start + i] = proposal.tokens[i]
            if not editing and canvas[i] == ref.mask_token_id != proposal.tokens[i]:
                seq.final_at[start + i] = seq.forwards
        step += 1
        if not masked and not changed:
            break
    if editing:  # an edited block's tokens are final only once the block is
        seq.final_at[start + first_generated : end] = [seq.forwards] * (block - first_generated)
    return step


def _logits(ref: ReferenceModel, tokens: list[int], mask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Full recompute of `tokens` (positions 0..T-1, the last block being denoised); fp32 logits [M, V] at the
    positions `rows`. With a block expert coreset, the last block's rows route by it (reference_coreset); with
    dMoE's rule, every row (reference_dmoe)."""
    length = len(tokens)
    attention = StepInputs(DenseAttentionInputs(mask[:length, :length][None, None]))
    with (
        block_coreset_routing(ref.model, length - ref.block_length, length, ref.block_expert_coreset),
        dmoe_routing(ref.model, ref.core_threshold),
    ):
        hidden = ref.model(torch.tensor(tokens)[None], torch.arange(length)[None], attention)  # [1, T, H]
    return ref.model.compute_logits(hidden[0, rows])


def _logprob(log_probs: torch.Tensor, token: int, params: SamplingParams) -> ReferenceLogprob:
    """`token`'s entry in one row's log-distribution [V]."""
    values = log_probs.tolist()
    rank = 1 + sum(1 for v in values if v > values[token])
    ordered = sorted(range(len(values)), key=lambda t: -values[t])[: params.logprobs]
    return ReferenceLogprob(values[token], rank, {t: values[t] for t in ordered if values[t] != float("-inf")})


def _penalize(logits: torch.Tensor, seq: _Sequence, start: int, params: SamplingParams) -> None:
    """logits [M, V] of the block at `start`, edited: each counted token's logit l (count c) becomes l / r if
    l > 0 else l * r (repetition r), then l - f * c (frequency f), then l - p (presence p)."""
    prompt = seq.tokens[: seq.num_prompt]
    counted = seq.tokens[seq.num_prompt : start] + (prompt if params.penalize_prompt else [])
    r, f, p = params.repetition_penalty, params.frequency_penalty, params.presence_penalty
    assert r is not None and f is not None and p is not None, "resolved by ReferenceModel.resolve"
    for token in sorted(set(counted)):
        c = counted.count(token)
        for row in range(logits.shape[0]):
            value = logits[row, token]
            if r != 1:
                value = value / r if value > 0 else value * r
            if f:
                value = value - f * c
            if p:
                value = value - p
            logits[row, token] = value


def _suppress_early_stops(
    logits: torch.Tensor, generated_index: list[int], min_tokens: int, stop_ids: frozenset[int]
) -> None:
    """min_tokens: in rows of generated positions below min_tokens, no stop id can be proposed."""
    for row, g in enumerate(generated_index):
        if g < min_tokens:
            for token in stop_ids:
                logits[row, token] = float("-inf")


def _cut(generated: list[int], stop_ids: frozenset[int], min_tokens: int) -> list[int]:
    for g, token in enumerate(generated):
        if token in stop_ids and g >= min_tokens:
            return generated[: g + 1]
    return generated
