"""The naive reference decode: no cache, the whole sequence recomputed at every step under the block-causal
mask, one request at a time (as the LLaDA2 reference `generate` does). Slow and obviously correct: the tests
compare the engine against it, and `bench compare` measures against it.

Stops after the block in which a stop id appears or max_tokens is reached, then cuts the answer at the first
stop id (inclusive) and at max_tokens.
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

    @property
    def num_forwards(self) -> int:
        return sum(self.steps_per_block)


@torch.inference_mode()
def reference_generate(
    model: torch.nn.Module, args: ModelArgs, prompt: list[int], params: SamplingParams, max_tokens: int,
    stop_ids: frozenset[int], generator: torch.Generator | None = None,
) -> ReferenceResult:
    """`params` must be resolved (`with_defaults`); `max_tokens` already capped by the caller."""
    block, mask_id, num_prompt = args.block_length, args.mask_token_id, len(prompt)
    total = -(-(num_prompt + max_tokens) // block) * block
    x = list(prompt) + [mask_id] * (total - num_prompt)
    steps_per_block = []
    for start in range(num_prompt // block * block, total, block):
        end = start + block
        steps = 0
        while mask_id in x[start:end]:
            masked = [i for i in range(block) if x[start + i] == mask_id]
            logits = _block_logits(model, x[:end], start, masked, block)
            _suppress(logits, masked, start - num_prompt, params.min_tokens, stop_ids)
            decoder = DECODERS[params.decoder]
            proposal = propose(logits, torch.tensor(masked), block, params, generator, decoder.needs_entropy)
            for i in decoder.select(proposal, steps, params, block).nonzero().flatten().tolist():
                x[start + i] = int(proposal.tokens[i])
            steps += 1
        steps_per_block.append(steps)
        if end >= num_prompt + max_tokens or any(t in stop_ids for t in x[num_prompt:end]):
            break
    return ReferenceResult(_cut(x[num_prompt : num_prompt + max_tokens], stop_ids, params.min_tokens), steps_per_block)


def _block_logits(model: torch.nn.Module, tokens: list[int], start: int, masked: list[int], block: int) -> torch.Tensor:
    """Full recompute of tokens[:end]; returns fp32 logits [M, V] at the block's masked positions."""
    end = len(tokens)
    positions = torch.arange(end)
    mask = block_causal_mask(positions, end, block)[None, None]
    hidden = model(torch.tensor(tokens)[None], positions[None], DenseAttentionInputs(mask))  # [1, end, H]
    return model.compute_logits(hidden[0, [start + i for i in masked]])


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
