"""FLOPs and bytes of one engine step of an sdar-family model, computed from its shape (ModelArgs).

Owns the arithmetic only: how many FLOPs a query token, a logit row and an attention (query, key) pair cost,
and how many bytes of weights and K/V a step reads. The counts of tokens, rows and pairs come from the
engine's actual step (see engine_run.ForwardProbe), so the result is exact for what ran, not a model of it.
A multiply-add is 2 FLOPs; elementwise work (norms, RoPE, softmax, SiLU) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.model.config import ModelArgs


@dataclass(frozen=True)
class ModelCost:
    flops_per_token: float
    """Weight matmuls every query token goes through: QKV and O projections, router, the k routed experts,
    shared expert, dense MLPs (all layers; the LM head is counted per logit row)."""
    flops_per_logit_row: float
    """The LM head for one position whose logits a decoder reads."""
    flops_per_attention_pair: float
    """QK^T and PV for one (query, key) pair over all layers: 4 x Hq x D x layers. The engine computes every
    pair of a sequence's queries x keys (masked pairs included), so that is what is counted."""
    dense_weight_bytes: float
    """Weights every forward reads in full: attention, norms, routers, shared experts, dense MLPs, LM head
    (not the input embedding, of which a forward reads only its tokens' rows)."""
    expert_weight_bytes: float
    """One routed expert of one layer (gate, up and down projections)."""
    num_moe_layers: int
    kv_bytes_per_token: float
    """K and V of one position over all layers."""

    def step_flops(self, num_tokens: int, num_logit_rows: int, attention_pairs: int) -> float:
        return (
            num_tokens * self.flops_per_token
            + num_logit_rows * self.flops_per_logit_row
            + attention_pairs * self.flops_per_attention_pair
        )

    def step_bytes(self, experts_touched_per_layer: float, kv_tokens_read: int) -> float:
        """Weights read (dense in full, routed experts as touched) plus the cached K/V the queries attend to."""
        experts = self.num_moe_layers * experts_touched_per_layer * self.expert_weight_bytes
        return self.dense_weight_bytes + experts + kv_tokens_read * self.kv_bytes_per_token


def model_cost(args: ModelArgs, weight_itemsize: int, kv_itemsize: int) -> ModelCost:
    """The per-unit costs of `args` with weights of `weight_itemsize` bytes and K/V of `kv_itemsize` bytes."""
    h, d = args.hidden_size, args.head_dim
    attention_macs = h * (args.num_heads + 2 * args.num_kv_heads) * d + args.num_heads * d * h
    moe_layers = [i for i in range(args.num_layers) if args.is_moe_layer(i)]
    num_moe, num_dense = len(moe_layers), args.num_layers - len(moe_layers)
    shared_macs = 3 * h * args.shared_expert_intermediate_size
    expert_macs = 3 * h * args.moe_intermediate_size
    routed_token_macs = h * args.num_experts + args.num_experts_per_tok * expert_macs + shared_macs
    dense_mlp_macs = 3 * h * args.intermediate_size
    token_macs = args.num_layers * attention_macs + num_moe * routed_token_macs + num_dense * dense_mlp_macs
    norms = args.num_layers * (2 * h + 2 * d) + h
    dense_params = (
        args.num_layers * attention_macs
        + num_moe * (h * args.num_experts + shared_macs)
        + num_dense * dense_mlp_macs
        + norms
        + h * args.vocab_size
    )
    return ModelCost(
        flops_per_token=2.0 * token_macs,
        flops_per_logit_row=2.0 * h * args.vocab_size,
        flops_per_attention_pair=4.0 * args.num_heads * d * args.num_layers,
        dense_weight_bytes=float(dense_params * weight_itemsize),
        expert_weight_bytes=float(expert_macs * weight_itemsize),
        num_moe_layers=num_moe,
        kv_bytes_per_token=float(2 * args.num_layers * args.num_kv_heads * d * kv_itemsize),
    )
