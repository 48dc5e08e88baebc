"""The naive reference decode: no cache, the whole sequence recomputed at every step under the block-causal
mask, one request at a time (as the LLaDA2 reference `generate` does). Slow and obviously correct: the tests
compare the engine against it, and `bench compare` measures against it.

Stops after the block in which a stop id appears or max_tokens is reached, then cuts the answer at the first
stop id (inclusive) and at max_tokens. With decoder=edit a block runs as LLaDA2.1's `generate` runs it: steps
while masks remain, then up to max_post_edit_steps more, ending early at a step that changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.engine.decoders import DECODERS
from diffuserve.engine.sampling import propose
from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.attention_backend import DenseAttentionInputs, block_causal_mask
from diffuserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class ReferenceResult:
    token_ids: list[int]
    steps_per_block: list[int]
    num_edits: int = 0
    """Accepted tokens rewritten by an editing decoder."""

    @property
    def num_forwards(self) -> int:
        return sum(self.steps_per_block)


@torch.inference_mode()
def reference_generate(
    model: torch.nn.Module, args: ModelArgs, prompt: list[int], params: SamplingParams, max_tokens: int,
    stop_ids: frozenset[int], generator: torch.Generator | None = None,
) -> ReferenceResult:
    """`params` must be resolved (`with_defaults`); `max_tokens` already capped by the caller."""
    block, num_prompt = args.block_length, len(prompt)
    total = -(-(num_prompt + max_tokens) // block) * block
    x = list(prompt) + [args.mask_token_id] * (total - num_prompt)
    steps_per_block, num_edits = [], 0
    for start in range(num_prompt // block * block, total, block):
        steps, edits = _decode_block(model, args, x, start, num_prompt, params, stop_ids, generator)
        steps_per_block.append(steps)
        num_edits += edits
        if start + block >= num_prompt + max_tokens or any(t in stop_ids for t in x[num_prompt : start + block]):
            break
    cut = _cut(x[num_prompt : num_prompt + max_tokens], stop_ids, params.min_tokens)
    return ReferenceResult(cut, steps_per_block, num_edits)


def _decode_block(
    model: torch.nn.Module, args: ModelArgs, x: list[int], start: int, num_prompt: int, params: SamplingParams,
    stop_ids: frozenset[int], generator: torch.Generator | None,
) -> tuple[int, int]:
    """Denoises the block x[start : start + B] in place; returns (steps, edits). Steps run while masks remain,
    then (LLaDA2.1) up to `post_edit_budget` more, stopping after a step that changed nothing."""
    block = args.block_length
    end = start + block
    decoder = DECODERS[params.decoder]
    steps = post_edit_steps = edits = 0
    while True:
        canvas = torch.tensor(x[start:end])  # [B]
        masked = canvas == args.mask_token_id
        if not masked.any():
            post_edit_steps += 1
            if post_edit_steps > params.post_edit_budget:
                break
        read = decoder.logit_positions(masked.nonzero().flatten().tolist(), max(0, num_prompt - start), block)
        logits = _block_logits(model, x[:end], start, read, block)
        _suppress(logits, read, start - num_prompt, params.min_tokens, stop_ids)
        proposal = propose(logits, torch.tensor(read, dtype=torch.long), block, params, generator,
                           decoder.needs_entropy)
        write = decoder.decide(proposal, canvas, masked, steps, params, block)
        changed = write & (proposal.tokens != canvas)
        edits += int((changed & ~masked).sum())
        x[start:end] = torch.where(write, proposal.tokens, canvas).tolist()
        steps += 1
        if not masked.any() and not changed.any():
            break
    return steps, edits


def _block_logits(model: torch.nn.Module, tokens: list[int], start: int, read: list[int], block: int) -> torch.Tensor:
    """Full recompute of tokens[:end]; returns fp32 logits [M, V] at the block positions `read`."""
    end = len(tokens)
    positions = torch.arange(end)
    mask = block_causal_mask(positions, end, block)[None, None]
    hidden = model(torch.tensor(tokens)[None], positions[None], DenseAttentionInputs(mask))  # [1, end, H]
    return model.compute_logits(hidden[0, [start + i for i in read]])


def _suppress(
    logits: torch.Tensor, masked: list[int], first_generated: int, min_tokens: int, stop_ids: frozenset[int]
) -> None:
    early = [row for row, i in enumerate(masked) if first_generated + i < min_tokens]
    if early and stop_ids:
        logits[torch.tensor(early)[:, None], torch.tensor(sorted(stop_ids))[None, :]] = float("-inf")


def _cut(generated: list[int], stop_ids: frozenset[int], min_tokens: int) -> list[int]:
    for g, token in enumerate(generated):
        if token in stop_ids and g >= min_tokens:
            return generated[: g + 1]
    return generated
