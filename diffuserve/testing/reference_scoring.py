"""The naive reference of prompt scoring: the block chain rule of docs/server.md ("Prompt scoring") computed with
one plain dense forward per scored position, through the model's forward only (no cache, no batching, none of
the engine's code).

Position p (p >= 1) of block b = p // B is read from a forward over the prompt's blocks before b (clean) and
block b with the tokens before p revealed and the rest masked, under the block-causal mask; its log-distribution
is the log-softmax of the logits at row p (the sdar and llada2 families predict a position from its own row).
"""

from __future__ import annotations

import torch

from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.testing.reference_decode import block_causal_mask
from diffuserve.testing.reference_model import ReferenceModel


@torch.inference_mode()
def reference_prompt_log_probs(ref: ReferenceModel, prompt: list[int]) -> list[torch.Tensor | None]:
    """Per prompt position, the log-distribution [V] fp32 its score reads; None at position 0 (no score)."""
    block = ref.block_length
    out: list[torch.Tensor | None] = [None]
    for p in range(1, len(prompt)):
        end = (p // block + 1) * block
        tokens = prompt[:p] + [ref.mask_token_id] * (end - p)
        attention = DenseAttentionInputs(block_causal_mask(end // block, block)[None, None])
        hidden = ref.model(torch.tensor(tokens)[None], torch.arange(end)[None], attention)  # [1, T, H]
        out.append(torch.log_softmax(ref.model.compute_logits(hidden[0, p : p + 1])[0], dim=-1))
    return out


def reference_prompt_logprob(ref: ReferenceModel, prompt: list[int]) -> float:
    """log p(prompt) under the chain rule: the sum over positions >= 1 of the prompt token's logprob."""
    log_probs = reference_prompt_log_probs(ref, prompt)
    return sum(float(lp[token]) for lp, token in zip(log_probs, prompt) if lp is not None)
