"""The `clover_moe` family: Clover-35B-A3B-Preview, a Qwen3.5/3.6-MoE trunk (Gated DeltaNet and gated full
attention layers, softmax top-k experts with a gated shared expert) trained further for block diffusion.

Module tree (and so parameter names) as in the Hub checkpoints, without their `language_model` prefixes:
`model.embed_tokens`, `model.layers.{i}.{input_layernorm, linear_attn | self_attn, post_attention_layernorm,
mlp}`, `model.norm`, `lm_head`. One entry point, the engine's: `forward(ids, positions, step)` over one flattened
step batch of many sequences, the attention layers over the engine's paged K/V (layers/attention), the GDN layers
over its state pool (gdn_step: each sequence advances its own slot over its commit tokens, then runs its block
against it). The oracles read the same modules whole, over dense per-sequence state (dense.py).
Knows nothing of requests; the engine builds the step's inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.families.clover_moe.gated_attention import GatedAttention
from diffuserve.model.families.clover_moe.gated_deltanet import GatedDeltaNet, set_gdn_backend
from diffuserve.model.families.clover_moe.gated_shared_moe import GatedSharedExpertMoe
from diffuserve.model.families.clover_moe.gdn_step import gdn_step
from diffuserve.model.families.clover_moe.hybrid_norm import ZeroCenteredRMSNorm
from diffuserve.model.interface import DiffusionModel, StepRules
from diffuserve.model.layers.attention import PagedAttentionInputs, RotaryEmbedding
from diffuserve.model.step_inputs import StepInputs


class HybridDecoderLayer(nn.Module):
    """h = x + mixer(norm(x)); out = h + mlp(norm(h)); the mixer is `linear_attn` (GDN) or `self_attn`."""

    def __init__(self, args: ModelArgs, layer_id: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        hybrid = hybrid_args(args)
        self.is_gdn = hybrid.is_gdn(layer_id)
        # Index of this layer among the layers of its kind: its K/V cache or its state-pool tensors.
        self.cache_index = sum(hybrid.is_gdn(i) == self.is_gdn for i in range(layer_id))
        self.input_layernorm = ZeroCenteredRMSNorm(args.hidden_size, args.rms_norm_eps)
        if self.is_gdn:
            self.linear_attn = GatedDeltaNet(args.hidden_size, hybrid.gdn, args.rms_norm_eps, hybrid.has_diffusion)
        else:
            self.self_attn = GatedAttention(args, rotary, self.cache_index)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = GatedSharedExpertMoe(
            args.hidden_size,
            args.num_experts,
            args.num_experts_per_tok,
            args.moe_intermediate_size,
            args.shared_expert_intermediate_size,
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """Engine step: x [N, H] -> [N, H] (see the module docstring)."""
        normed = self.input_layernorm(x)
        if self.is_gdn:
            h = x + self.recurrent_mix(normed, step)
        else:
            attn = step.attention
            assert isinstance(attn, PagedAttentionInputs), "an engine step's attention is paged"
            h = x + self.self_attn(normed, positions, attn)
        return h + self.mlp(self.post_attention_layernorm(h))

    @torch.compiler.disable
    def recurrent_mix(self, normed: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """The GDN mixer over the step (gdn_step). Where a compiled forward's graph breaks, as at attention: which
        rows commit into which state slot changes every step, and traced it would specialise the graph on it."""
        return gdn_step(self.linear_attn, normed, step.require_recurrent(), self.cache_index)


class HybridModel(nn.Module):
    def __init__(self, args: ModelArgs, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(HybridDecoderLayer(args, i, rotary) for i in range(args.num_layers))
        self.norm = ZeroCenteredRMSNorm(args.hidden_size, args.rms_norm_eps)


class CloverMoeForBlockDiffusion(DiffusionModel):
    def __init__(self, args: ModelArgs, max_model_len: int) -> None:
        super().__init__()
        self.args = args
        rotary = RotaryEmbedding(args.head_dim, args.rope, args.max_position_embeddings, max_model_len)
        self.model = HybridModel(args, rotary)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def has_diffusion(self) -> bool:
        return hybrid_args(self.args).has_diffusion

    @property
    def step_rules(self) -> StepRules:
        """The GDN prefix is causal; without the diffusion tensors the model decodes next-token (shifted)."""
        shift = hybrid_args(self.args).prediction_shift or not self.has_diffusion
        return StepRules(prediction_shift=shift, causal_commits=True, autoregressive=not self.has_diffusion)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        step: StepInputs,
    ) -> torch.Tensor:
        """Engine step: input_ids, positions [N] -> hidden [N, H] before the final norm."""
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, positions, step)
        return x

    def set_recurrent_backend(self, backend: str, device: torch.device) -> None:
        set_gdn_backend(self, backend, device)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., V] fp32 (the head runs in the model dtype)."""
        return self.lm_head(self.model.norm(hidden)).float()
