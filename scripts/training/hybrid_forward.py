"""The training forward of a hybrid (`clover_moe`) model over a `HybridBatch`, and its masked diffusion loss.

One pass computes what the engine computes block by block:
  - the clean stream runs the causal trunk (`DenseClover.forward_causal`'s maths) over each whole conversation and
    keeps every layer's state at every block boundary: GDN layers run the delta rule in its chunked form, one chunk
    per block (block_states), and keep S and the conv ring at each block start; attention layers keep K/V;
  - each noisy block runs the preview (`DenseClover.forward_preview`'s maths) against its row's state at its block
    start: GDN layers through gdn_preview (right conv taps, block softmax with the history slot), attention layers
    over the clean prefix's K/V before the block plus the whole noisy block.
The layers' own projections, norms and MoE are used, so the weights trained are the weights served
(tests/eval/test_hybrid_forward.py checks the noisy rows against the engine's reference decode). The clean
stream's rows also give the next-token loss (reply token p from row p - 1), the reading of the engine's causal
rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.families.clover_moe.dense import attention_causal, attention_project
from diffuserve.model.families.clover_moe.gated_attention import GatedAttention
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet
from diffuserve.model.families.clover_moe.gdn_preview import preview_mix
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion, HybridDecoderLayer
from diffuserve.model.layers.attention import DenseAttentionInputs, dense_attention

from .block_states import block_delta_rule, depthwise_conv
from .hybrid_batch import HybridBatch


def prediction_shift(model: CloverMoeForBlockDiffusion) -> bool:
    return hybrid_args(model.args).prediction_shift


def _gdn(
    layer: GatedDeltaNet, clean: torch.Tensor, noisy: torch.Tensor, batch: HybridBatch, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """clean [B, L, H], noisy [M, T, H] (normed inputs) -> the GDN outputs of both streams."""
    taps = layer.gdn.conv_kernel - 1
    projected = layer.project(clean)
    mixed = projected.mixed.transpose(1, 2)  # [B, C, L]
    window = F.pad(mixed, (taps, 0))  # zeros before the first token, as an empty state's ring
    conv = F.silu(depthwise_conv(window, layer.conv1d.weight[:, 0]))
    q, k, v = layer._qkv(conv.transpose(1, 2))
    out, starts = block_delta_rule(q, k, v, projected.g.transpose(1, 2), projected.beta.transpose(1, 2), block)
    clean_out = layer.output(clean, out)
    # Block b's ring is the `taps` conv inputs before it: window[..., b*T : b*T + taps].
    ring_index = batch.noisy_blocks[:, None] * block + torch.arange(taps)  # [M, taps]
    rings = window[batch.noisy_rows[:, None], :, ring_index].transpose(1, 2)  # [M, C, taps]
    block_states = starts[batch.noisy_rows, batch.noisy_blocks]  # [M, Hv, Dk, Dv]
    noisy_projected = layer.project(noisy)
    noisy_mixed = noisy_projected.mixed.transpose(1, 2)
    # gdn_preview.block_conv's maths: causal taps over [ring | block], right taps over the block's next positions.
    ahead = F.pad(noisy_mixed, (0, taps))[..., 1:]
    noisy_conv = F.silu(
        depthwise_conv(torch.cat([rings, noisy_mixed], dim=-1), layer.conv1d.weight[:, 0])
        + depthwise_conv(ahead, layer.conv_right_weight)
    )
    q, k, v = layer._qkv(noisy_conv.transpose(1, 2))
    o = preview_mix(
        q,
        k,
        v,
        noisy_projected.g.transpose(1, 2),
        block_states,
        layer.bd_softmax_logit_scale,
        layer.bd_softmax_history_bias,
        layer.bd_softmax_history_c,
    )
    return clean_out, layer.output(noisy, o)


def _attention(
    layer: GatedAttention, clean: torch.Tensor, noisy: torch.Tensor, batch: HybridBatch, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean: causal. Noisy block at block b: the clean row's K/V before b * T, then its own T positions."""
    length = clean.shape[1]
    positions = torch.arange(length)
    clean_out, kv = attention_causal(layer, clean, positions)
    noisy_positions = batch.noisy_blocks[:, None] * block + torch.arange(block)  # [M, T]
    q, gate, own = attention_project(layer, noisy, noisy_positions, None)
    keys = torch.cat([kv.k[batch.noisy_rows], own.k], dim=1)  # [M, L + T, Hkv, D]
    values = torch.cat([kv.v[batch.noisy_rows], own.v], dim=1)
    sees_clean = positions[None, :] < (batch.noisy_blocks * block)[:, None]  # [M, L]
    mask = torch.cat([sees_clean, sees_clean.new_ones(len(sees_clean), block)], dim=1)  # [M, L + T]
    mask = mask[:, None, None, :].expand(-1, 1, block, -1)  # [M, 1, T, L + T]
    out = dense_attention(q, keys, values, DenseAttentionInputs(mask), layer.head_dim**-0.5)
    return clean_out, layer.o_proj(out * torch.sigmoid(gate))


def _layer(
    layer: HybridDecoderLayer, clean: torch.Tensor, noisy: torch.Tensor, batch: HybridBatch, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """HybridDecoderLayer.forward for both streams; the MoE runs once over all their tokens."""
    normed_clean, normed_noisy = layer.input_layernorm(clean), layer.input_layernorm(noisy)
    mix = _gdn if layer.is_gdn else _attention
    mixer = layer.linear_attn if layer.is_gdn else layer.self_attn
    mixed_clean, mixed_noisy = mix(mixer, normed_clean, normed_noisy, batch, block)
    h = torch.cat([(clean + mixed_clean).flatten(0, 1), (noisy + mixed_noisy).flatten(0, 1)])  # [B*L + M*T, H]
    out = h + layer.mlp(layer.post_attention_layernorm(h))
    num_clean = clean.shape[0] * clean.shape[1]
    return out[:num_clean].view_as(clean), out[num_clean:].view_as(noisy)


def hybrid_training_forward(model: CloverMoeForBlockDiffusion, batch: HybridBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (clean hidden [B, L, H], noisy hidden [M, T, H]), both before the final norm (as forward_causal's)."""
    block = model.args.block_length
    clean, noisy = model.model.embed_tokens(batch.clean_ids), model.model.embed_tokens(batch.noisy_ids)
    for layer in model.model.layers:
        clean, noisy = _layer(layer, clean, noisy, batch, block)
    return clean, noisy


def predicting_rows(
    model: CloverMoeForBlockDiffusion, clean_hidden: torch.Tensor, noisy_hidden: torch.Tensor, batch: HybridBatch
) -> torch.Tensor:
    """-> [M, T, H]: the output row that predicts each noisy position. With the prediction shift, position p is
    read from row p - 1: the previewed row before it, or for a block's first position the clean trunk's row at
    the block start - 1 (the committed prefix's last row, as the engine reads it)."""
    if not prediction_shift(model):
        return noisy_hidden
    previous = clean_hidden[batch.noisy_rows, batch.noisy_blocks * model.args.block_length - 1]  # [M, H]
    return torch.cat([previous[:, None], noisy_hidden[:, :-1]], dim=1)


def next_token_rows(clean_hidden: torch.Tensor, batch: HybridBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (rows [N, H], tokens [N]) at the N reply positions: token p is read from the clean trunk's row p - 1,
    the causal reading (`forward_causal`'s row p - 1) that verified decoding commits. Position 0 is never a
    reply token, so every target has a row before it."""
    targets = batch.clean_targets[:, 1:]
    selected = targets >= 0
    return clean_hidden[:, :-1][selected], targets[selected]


def _logits(model: CloverMoeForBlockDiffusion, batch: HybridBatch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """-> {"diffusion": (logits [N, V] fp32, clean tokens [N]) at the masked positions of the noisy blocks,
    "next_token": (logits, tokens) at the reply positions of the clean stream}, from one forward."""
    clean_hidden, noisy_hidden = hybrid_training_forward(model, batch)
    rows = predicting_rows(model, clean_hidden, noisy_hidden, batch)
    selected = batch.targets >= 0
    causal_rows, causal_targets = next_token_rows(clean_hidden, batch)
    return {
        "diffusion": (model.compute_logits(rows[selected]), batch.targets[selected]),
        "next_token": (model.compute_logits(causal_rows), causal_targets),
    }


def hybrid_losses(model: CloverMoeForBlockDiffusion, batch: HybridBatch) -> dict[str, torch.Tensor]:
    """{"diffusion": mean cross-entropy over masked positions (unweighted, as diffusion_batch.diffusion_loss
    explains), "next_token": mean cross-entropy of the clean stream's reply tokens}."""
    return {name: F.cross_entropy(logits, targets) for name, (logits, targets) in _logits(model, batch).items()}


@torch.no_grad()
def hybrid_token_accuracy(model: CloverMoeForBlockDiffusion, batch: HybridBatch) -> dict[str, float]:
    """Share of masked positions, and of reply positions read causally, whose argmax is the clean token."""
    return {
        name: (logits.argmax(-1) == targets).float().mean().item()
        for name, (logits, targets) in _logits(model, batch).items()
    }
