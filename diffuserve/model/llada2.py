"""The LLaDA2 family: LLaDA2.0-mini / -flash and LLaDA2.1 (`LLaDA2MoeModelLM`, the BailingMoeV2 transformer).

Composes `layers/`: GQA attention with a fused `query_key_value` projection, optional per-head q/k RMSNorm
(before RoPE), partial NeoX rotary (the first head_dim * partial_rotary_factor dims) and an optional `dense`
bias; pre-norm residual blocks whose first `first_k_dense_replace` layers run a dense SwiGLU and the others a
MoE block (group-limited sigmoid router, experts combined in fp32, always-on shared experts); fp32 logits with
no shift (the logit at a position predicts that position). Module names follow the Hub checkpoint
(`word_embeddings`, `attention`, `mlp`, ...); the attention's packed names are mapped in `llada2_weights`.
Knows nothing of requests; LLaDA2.1's token editing is a decoder (engine/decoders.py), not a model change.
"""

from __future__ import annotations

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.attention import Attention
from diffuserve.model.layers.attention_backend import AttentionInputs
from diffuserve.model.layers.group_router import GroupLimitedRouter
from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe import SparseMoeBlock
from diffuserve.model.layers.norm import RMSNorm
from diffuserve.model.layers.rotary import RotaryEmbedding


def make_mlp(args: ModelArgs, layer_id: int) -> nn.Module:
    """The dense SwiGLU of the first `first_k_dense_replace` layers, else the MoE block."""
    if not args.is_moe_layer(layer_id):
        return SwiGLU(args.hidden_size, args.intermediate_size)
    extra = args.extra
    gate = GroupLimitedRouter(
        args.num_experts, args.hidden_size, args.num_experts_per_tok, extra["n_group"], extra["topk_group"],
        extra["routed_scaling_factor"],
    )
    return SparseMoeBlock(
        args.hidden_size, args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size,
        norm_topk_prob=True, shared_intermediate_size=args.shared_expert_intermediate_size, gate=gate,
    )


class LLaDA2DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attention(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.attention = Attention(
            args, layer_id, rotary, qk_norm=args.extra["use_qk_norm"], output_bias=args.extra["use_bias"]
        )
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = make_mlp(args, layer_id)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        h = x + self.attention(self.input_layernorm(x), positions, attn)
        return h + self.mlp(self.post_attention_layernorm(h))


class LLaDA2Model(nn.Module):
    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        rotary = RotaryEmbedding(args.head_dim, args.rope, args.max_position_embeddings, max_model_len)
        self.layers = nn.ModuleList(LLaDA2DecoderLayer(args, i, rotary) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, positions, attn)
        return x


class LLaDA2ForBlockDiffusion(nn.Module):
    """`forward` returns the last hidden states (pre-norm); `compute_logits` maps chosen rows to fp32 logits,
    so the LM head runs only over the positions a decoder needs."""

    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        self.args = args
        self.model = LLaDA2Model(args, max_model_len)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.word_embeddings.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        """input_ids/positions [N] with paged inputs, or [Bt, T] with dense inputs -> hidden [..., H]."""
        return self.model(input_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, H] -> logits [M, V] fp32 (`lm_head(norm(h)).float()`, as the reference)."""
        return self.lm_head(self.model.norm(hidden)).float()
