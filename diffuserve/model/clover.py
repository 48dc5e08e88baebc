"""The "clover" family: a Qwen3 / Qwen3-MoE shaped block-diffusion transformer.

Serves `CloverForBlockDiffusion` (native), `SDARForCausalLM` (Qwen3 weights) and `SDARMoeForCausalLM`
(Qwen3-MoE weights): GQA attention with q/k-norm and RoPE, softmax top-k routed experts with an optional shared
expert, optional dense layers, tied or untied LM head. Composes `layers/`; knows nothing of requests.
"""

from __future__ import annotations

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.attention import Attention
from diffuserve.model.layers.attention_backend import AttentionInputs
from diffuserve.model.layers.mlp import SwiGLU
from diffuserve.model.layers.moe import SparseMoeBlock
from diffuserve.model.layers.norm import RMSNorm
from diffuserve.model.layers.rotary import RotaryEmbedding


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer_id, rotary)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = self._make_mlp(args, layer_id)

    @staticmethod
    def _make_mlp(args: ModelArgs, layer_id: int) -> nn.Module:
        if not args.is_moe_layer(layer_id):
            return SwiGLU(args.hidden_size, args.intermediate_size)
        return SparseMoeBlock(
            args.hidden_size, args.num_experts, args.num_experts_per_tok, args.moe_intermediate_size,
            args.norm_topk_prob, args.shared_expert_intermediate_size,
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, attn)
        return h + self.mlp(self.post_attention_layernorm(h))


class CloverModel(nn.Module):
    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        rotary = RotaryEmbedding(args.head_dim, args.rope, args.max_position_embeddings, max_model_len)
        self.layers = nn.ModuleList(DecoderLayer(args, i, rotary) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, attn)
        return x


class CloverForBlockDiffusion(nn.Module):
    """`forward` returns the last hidden states (pre-norm); `compute_logits` maps chosen rows to fp32 logits,
    so the LM head runs only over the positions a decoder needs."""

    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        self.args = args
        self.model = CloverModel(args, max_model_len)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        """input_ids/positions [N] with paged inputs, or [Bt, T] with dense inputs -> hidden [..., H]."""
        return self.model(input_ids, positions, attn)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, H] -> logits [M, V] fp32 (the head runs in the model dtype, as the references do)."""
        return self.lm_head(self.model.norm(hidden)).float()
