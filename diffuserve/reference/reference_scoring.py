"""The naive reference of prompt scoring: the block chain rule of docs/serving/logprobs.md computed with
one plain dense forward per scored position, through the model's forward only (no cache, no batching, none of
the engine's code).

Position p (p >= 1) of block b = p // B is read from a forward over the prompt's blocks before b (clean) and
block b with the tokens before p revealed and the rest masked, under the block-causal mask; its log-distribution
is the log-softmax of the logits at row p (the sdar and llada2 families predict a position from its own row).

clover_moe (`reference_hybrid_prompt_log_probs`), through the model's own uncached forwards: the prefix before
block b run causally from nothing, then block b's variant previewed against the state after it; with the AR
shift position p is read from the preview's row p - 1, and a block's first position from the last row of the
causal prefix. A checkpoint without the block-diffusion tensors reads row p - 1 of a causal forward over x_<p.
"""

from __future__ import annotations

import torch

from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion
from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.reference_decode import block_causal_mask
from diffuserve.reference.reference_model import ReferenceModel


@torch.inference_mode()
def reference_prompt_log_probs(ref: ReferenceModel, prompt: list[int]) -> list[torch.Tensor | None]:
    """Per prompt position, the log-distribution [V] fp32 its score reads; None at position 0 (no score)."""
    block = ref.block_length
    out: list[torch.Tensor | None] = [None]
    for p in range(1, len(prompt)):
        end = (p // block + 1) * block
        tokens = prompt[:p] + [ref.mask_token_id] * (end - p)
        attention = StepInputs(DenseAttentionInputs(block_causal_mask(end // block, block)[None, None]))
        hidden = ref.model(torch.tensor(tokens)[None], torch.arange(end)[None], attention)  # [1, T, H]
        out.append(torch.log_softmax(ref.model.compute_logits(hidden[0, p : p + 1])[0], dim=-1))
    return out


def reference_prompt_logprob(ref: ReferenceModel, prompt: list[int]) -> float:
    """log p(prompt) under the chain rule: the sum over positions >= 1 of the prompt token's logprob."""
    log_probs = reference_prompt_log_probs(ref, prompt)
    return sum(float(lp[token]) for lp, token in zip(log_probs, prompt) if lp is not None)


@torch.inference_mode()
def reference_hybrid_prompt_log_probs(
    model: CloverMoeForBlockDiffusion, prompt: list[int]
) -> list[torch.Tensor | None]:
    """clover_moe: per prompt position, the log-distribution [V] fp32 its score reads; None at position 0."""
    hybrid, block, mask = hybrid_args(model.args), model.args.block_length, model.args.mask_token_id
    dense = DenseClover(model)
    out: list[torch.Tensor | None] = [None]
    for p in range(1, len(prompt)):
        start = p // block * block
        if not hybrid.has_diffusion or (hybrid.prediction_shift and p == start):
            hidden, _ = dense.forward_causal(torch.tensor([prompt[:p]]))
            row = hidden[0, -1]
        else:
            state = dense.forward_causal(torch.tensor([prompt[:start]]))[1] if start else None
            tokens = prompt[start:p] + [mask] * (start + block - p)
            preview = dense.forward_preview(torch.tensor([tokens]), state)[0]  # [B, H]
            row = preview[p - start - 1 if hybrid.prediction_shift else p - start]
        out.append(torch.log_softmax(model.compute_logits(row[None])[0], dim=-1))
    return out
