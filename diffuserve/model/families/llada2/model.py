"""The LLaDA2 family: LLaDA2.0-mini / -flash and LLaDA2.1 (`LLaDA2MoeModelLM`, the BailingMoeV2 transformer).

Composes `layers/`: GQA attention with a fused `query_key_value` projection, optional per-head q/k RMSNorm
(before RoPE), partial NeoX rotary (the first head_dim * partial_rotary_factor dims) and an optional `dense`
bias; pre-norm residual blocks whose first `first_k_dense_replace` layers run a dense SwiGLU and the others a
MoE block (group-limited sigmoid router, experts combined in fp32, always-on shared experts); fp32 logits with
no shift (the logit at a position predicts that position). The stack is `transformer.BlockDiffusionLM`; the
Hub names (`word_embeddings`, `attention.query_key_value`, ...) are mapped to it in `llada2_weights`.
Knows nothing of requests; LLaDA2.1's token editing is a decoder (decoding/mask_policies.py), not a model change.
"""

from __future__ import annotations

from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.attention import Attention, RotaryEmbedding
from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe.layer import GroupLimitedRouter, SparseMoeBlock
from diffuserve.model.transformer import BlockDiffusionLM


class LLaDA2ForBlockDiffusion(BlockDiffusionLM):
    def make_attention(self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding) -> nn.Module:
        extra = args.extra
        return Attention(args, layer_id, rotary, qk_norm=extra["use_qk_norm"], output_bias=extra["use_bias"])

    def make_mlp(self, args: ModelArgs, layer_id: int) -> nn.Module:
        """The dense SwiGLU of the first `first_k_dense_replace` layers, else the MoE block."""
        if not args.is_moe_layer(layer_id):
            return SwiGLU(args.hidden_size, args.intermediate_size)
        extra = args.extra
        gate = GroupLimitedRouter(
            args.num_experts,
            args.hidden_size,
            args.num_experts_per_tok,
            extra["n_group"],
            extra["topk_group"],
            extra["routed_scaling_factor"],
        )
        return SparseMoeBlock(
            args.hidden_size,
            args.num_experts,
            args.num_experts_per_tok,
            args.moe_intermediate_size,
            norm_topk_prob=True,
            shared_intermediate_size=args.shared_expert_intermediate_size,
            gate=gate,
        )
