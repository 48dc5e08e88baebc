"""The naive reference of every mask decoder on a hybrid (`clover_moe`) block-diffusion model: the block logits of
reference_clover_moe (the committed prefix recomputed causally from nothing at every step, the block previewed
against the state after it, the AR shift applied) under the proposals and write rules of reference_decoders
(threshold, fixed, entropy, edit; greedy, or sampled from the request's own generator over the positions read).

It extends reference_clover_moe's threshold-only decoder to the decoders and the sampling the engine shares with
the attention families, and shares nothing with the engine but the model. Generation runs to max_tokens (the
matrix's requests ignore EOS).
"""

from __future__ import annotations

import torch

from diffuserve.reference.reference_clover_moe import HybridLM, _block_logits
from diffuserve.reference.reference_decoders import positions_to_write, propose
from diffuserve.reference.reference_model import ReferenceModel, post_edit_budget
from diffuserve.sampling_params import SamplingParams


@torch.no_grad()
def reference_hybrid_generate(
    model: HybridLM,
    defaults: ReferenceModel,
    prompt: list[int],
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """-> the generated tokens (prompt excluded), `params.max_tokens` of them; `defaults` resolves the knobs a
    request leaves unset."""
    params = defaults.resolve(params)
    assert params.max_tokens is not None and params.ignore_eos, "the hybrid reference runs to max_tokens"
    block_length, mask_id = model.args.block_length, model.args.mask_token_id
    seq = list(prompt)
    while len(seq) - len(prompt) < params.max_tokens:
        start = len(seq) // block_length * block_length
        block = seq[start:] + [mask_id] * (start + block_length - len(seq))
        seq = seq[:start] + _decode_block(model, seq, start, block, max(0, len(prompt) - start), params, generator)
    return seq[len(prompt) : len(prompt) + params.max_tokens]


def _decode_block(
    model: HybridLM,
    seq: list[int],
    start: int,
    block: list[int],
    first_generated: int,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """Steps while masks remain, then (decoder=edit) up to the post-edit budget more, ending after a step that
    changed nothing: reference_decode's block loop over the hybrid block logits."""
    mask_id, editing = model.args.mask_token_id, params.decoder == "edit"
    step = post_edit_steps = 0
    while True:
        masked = [i for i, t in enumerate(block) if t == mask_id]
        if not masked:
            post_edit_steps += 1
            if post_edit_steps > post_edit_budget(params):
                return block
        read = list(range(first_generated, len(block))) if editing else masked
        logits = _block_logits(model, seq, start, block)[read].float()  # [M, V]
        proposal = propose(logits, read, len(block), params, generator, mask_token=mask_id)
        write = positions_to_write(proposal, block, masked, first_generated, step, params)
        changed = [i for i in write if proposal.tokens[i] != block[i]]
        for i in write:
            block[i] = proposal.tokens[i]
        step += 1
        if not masked and not changed:
            return block
