"""The decoder stack every block-diffusion family shares: token embeddings, pre-norm residual layers (attention,
then an MLP), a final norm, and an LM head applied only to the rows a decoder needs.

Families differ in how a layer's attention and MLP are built (`make_attention`, `make_mlp`: the template
methods) and in their checkpoint names (mapped once in their weight-name module); the module tree, and so our
parameter names, is the same for all: `model.embed_tokens`, `model.layers.{i}.self_attn`, `.mlp`, `model.norm`,
`lm_head`. Knows nothing of requests.
"""

from __future__ import annotations

from abc import abstractmethod

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.interface import DiffusionModel
from diffuserve.model.layers.attention import AttentionInputs, RotaryEmbedding
from diffuserve.model.layers.norm import RMSNorm
from diffuserve.model.step_inputs import StepInputs


class DecoderLayer(nn.Module):
    """Pre-norm residual block: h = x + self_attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, args: ModelArgs, self_attn: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        h = x + self.self_attn(self.input_layernorm(x), positions, attn)
        return h + self.mlp(self.post_attention_layernorm(h))


class TransformerModel(nn.Module):
    def __init__(self, args: ModelArgs, layers: list[DecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionInputs) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, positions, attn)
        return x


class BlockDiffusionLM(DiffusionModel):
    """A family's model. `forward` returns the last hidden states (pre-norm); `compute_logits` maps chosen rows
    to fp32 logits, so the LM head runs only over the positions a decoder needs."""

    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        self.args = args
        rotary = RotaryEmbedding(args.head_dim, args.rope, args.max_position_embeddings, max_model_len)
        layers = [
            DecoderLayer(args, self.make_attention(args, i, rotary), self.make_mlp(args, i))
            for i in range(args.num_layers)
        ]
        self.model = TransformerModel(args, layers)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @abstractmethod
    def make_attention(self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding) -> nn.Module:
        """Layer `layer_id`'s attention: forward(x, positions, attn) -> [..., H]."""

    @abstractmethod
    def make_mlp(self, args: ModelArgs, layer_id: int) -> nn.Module:
        """Layer `layer_id`'s feed-forward (dense or MoE): forward(x) -> same shape."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """input_ids/positions [N] with paged inputs, or [Bt, T] with dense inputs -> hidden [..., H]."""
        return self.model(input_ids, positions, step.attention)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, H] -> logits [M, V] fp32 (the head runs in the model dtype, as the references do)."""
        return self.lm_head(self.model.norm(hidden)).float()
