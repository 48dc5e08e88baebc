"""Parameter counts of a ModelSpec, split the way memory and bandwidth need them.

Owns the counting rules (attention, Gated DeltaNet, dense MLP, shared expert and its gate, router, routed experts,
embeddings, norms) and the
definition of "active": every parameter a token's forward uses, **embeddings included** (input embedding and
LM head), routed experts counted `k/E`. This is the convention of the published totals we compare against
(Ling 2.0 / LLaDA2: "6.1B activated (4.8B non-embedding)"; Qwen3-30B-A3B: "3.3B activated").
Knows nothing of dtypes or hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.planner.hybrid_config import LinearAttentionGroup
from diffuserve.planner.model_spec import AttentionGroup, ModelSpec

GATED_MLP_MATRICES = 3
"""SwiGLU / GeGLU MLPs have gate, up and down projections."""


@dataclass(frozen=True)
class ParamCounts:
    attention: int
    """Q (and its output gate), K, V, O projections of the attention layers (plus the per-head q/k norms)."""
    linear_attention: int
    """Gated DeltaNet layers: projections, conv, decay and gate vectors, output norm (and preview tensors)."""
    dense_mlp: int
    shared_experts: int
    """Shared experts and, where the family has one, their sigmoid gate [1, h]."""
    router: int
    routed_experts: int
    input_embedding: int
    """The token-embedding table; 0 when tied to the LM head (it is then counted once, as the head)."""
    lm_head: int
    norms: int

    @property
    def embeddings(self) -> int:
        return self.input_embedding + self.lm_head

    @property
    def total(self) -> int:
        return self.non_expert + self.routed_experts

    @property
    def non_expert(self) -> int:
        """Everything but the routed experts: what every token uses."""
        return (
            self.attention
            + self.linear_attention
            + self.dense_mlp
            + self.shared_experts
            + self.router
            + self.embeddings
            + self.norms
        )

    def active(self, spec: ModelSpec) -> float:
        """Parameters one token uses, embeddings included: non-expert + routed * k / E."""
        return self.non_expert + self.routed_experts * _active_expert_share(spec)

    def active_non_embedding(self, spec: ModelSpec) -> float:
        return self.active(spec) - self.embeddings

    def matmul_active(self, spec: ModelSpec) -> float:
        """Active parameters that cost 2 FLOPs per token: all but the input-embedding lookup."""
        return self.active(spec) - self.input_embedding


def count_parameters(spec: ModelSpec) -> ParamCounts:
    """Counts every weight matrix of the config; norms approximately (2 vectors of `hidden` per layer + final)."""
    h = spec.hidden_size
    expert_mlp = GATED_MLP_MATRICES * h * spec.moe_intermediate_size
    shared = GATED_MLP_MATRICES * h * spec.shared_expert_intermediate_size + (h if spec.shared_expert_gate else 0)
    return ParamCounts(
        attention=sum(_attention_params(group, h) for group in spec.attention),
        linear_attention=_linear_attention_params(spec.linear_attention, h) if spec.linear_attention else 0,
        dense_mlp=spec.num_dense_mlp_layers * GATED_MLP_MATRICES * h * spec.intermediate_size,
        shared_experts=spec.num_moe_layers * shared,
        router=spec.num_moe_layers * spec.num_experts * h,
        routed_experts=spec.num_moe_layers * spec.num_experts * expert_mlp,
        input_embedding=0 if spec.tie_word_embeddings else spec.vocab_size * h,
        lm_head=spec.vocab_size * h,
        norms=(2 * spec.num_layers + 1) * h,
    )


def _attention_params(group: AttentionGroup, hidden: int) -> int:
    q_size = group.num_heads * group.head_dim
    q_out = 2 * q_size if group.output_gate else q_size
    kv_size = group.num_kv_heads * group.head_dim
    v_size = kv_size if group.has_v_proj else 0
    per_layer = hidden * (q_out + kv_size + v_size) + q_size * hidden + 2 * group.head_dim
    return group.num_layers * per_layer


def _linear_attention_params(group: LinearAttentionGroup, hidden: int) -> int:
    """`GdnArgs.layer_params` per GDN layer. Clover's block-diffusion tensors (`conv_right_weight`
    [conv_dim, k - 1] and three `bd_softmax_*` per GDN layer, about 0.74M in all: 0.002%) are not counted:
    config.json does not say whether a checkpoint has them."""
    return group.num_layers * group.layer_params(hidden)


def _active_expert_share(spec: ModelSpec) -> float:
    return spec.num_experts_per_tok / spec.num_experts if spec.num_experts else 0.0
