"""The "sdar" family: a Qwen3 / Qwen3-MoE shaped block-diffusion transformer.

Serves `SDARForCausalLM` (Qwen3 weights), `SDARMoeForCausalLM` (Qwen3-MoE weights; our own small models too) and
the deprecated `CloverForBlockDiffusion` name of the same layout (not Clover: that is clover_moe.py): GQA
attention with q/k-norm and RoPE, softmax top-k routed experts with an optional shared expert, optional dense
layers, tied or untied LM head. The stack itself is `transformer.BlockDiffusionLM`.
"""

from __future__ import annotations

from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.attention import Attention, RotaryEmbedding
from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe.layer import SparseMoeBlock
from diffuserve.model.transformer import BlockDiffusionLM


class SDARForBlockDiffusion(BlockDiffusionLM):
    def make_attention(self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding) -> nn.Module:
        return Attention(args, layer_id, rotary)

    def make_mlp(self, args: ModelArgs, layer_id: int) -> nn.Module:
        if not args.is_moe_layer(layer_id):
            return SwiGLU(args.hidden_size, args.intermediate_size)
        return SparseMoeBlock(
            args.hidden_size,
            args.num_experts,
            args.num_experts_per_tok,
            args.moe_intermediate_size,
            args.norm_topk_prob,
            args.shared_expert_intermediate_size,
        )
