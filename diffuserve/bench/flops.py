"""FLOPs and bytes of one engine step, computed from the model's shape (ModelArgs): attention models, and hybrid
clover_moe models (Gated DeltaNet layers beside gated attention; their recurrent state is read and written
every step).

Owns the arithmetic only: how many FLOPs a query token, a logit row and an attention (query, key) pair cost,
and how many bytes of weights, K/V and recurrent state a step reads. The counts of tokens, rows and pairs come from the
engine's actual step (see engine_run.ForwardProbe), so the result is exact for what ran, not a model of it.
A multiply-add is 2 FLOPs; elementwise work (norms, RoPE, softmax, SiLU) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from diffuserve.model.config import ModelArgs
from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.registry import cache_layout
from diffuserve.model.weight_bytes import WeightBytes
from diffuserve.planner.recurrent_state import RECURRENT_FLOPS_PER_STATE_ELEMENT

ITEMSIZE_DTYPES = {4: "fp32", 2: "bf16", 1: "fp8"}
"""Cache dtype names (model/shapes.py) by bytes per element."""


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
    """K and V of one position over all (attention) layers."""
    state_bytes_per_seq: float = 0.0
    """Hybrid models: one sequence's recurrent state over all GDN layers (S in fp32, the conv ring); 0 otherwise."""
    gdn_weight_bytes: float = 0.0
    """Hybrid models: the GDN layers' weights (`GdnArgs.layer_params`: projections, conv taps, per-head scalars)."""
    gdn_flops_per_token: float = 0.0
    """Hybrid models: one token through all GDN mixers (their weights and the delta rule)."""

    def step_flops(self, num_tokens: int, num_logit_rows: int, attention_pairs: int) -> float:
        return (
            num_tokens * self.flops_per_token
            + num_logit_rows * self.flops_per_logit_row
            + attention_pairs * self.flops_per_attention_pair
        )

    def step_bytes(self, experts_touched_per_layer: float, kv_tokens_read: int, num_seqs: int = 0) -> float:
        """Weights read (dense in full, routed experts as touched), the cached K/V the queries attend to, and each
        sequence's recurrent state read and written once (hybrid models)."""
        experts = self.num_moe_layers * experts_touched_per_layer * self.expert_weight_bytes
        kv = kv_tokens_read * self.kv_bytes_per_token
        return self.dense_weight_bytes + experts + kv + num_seqs * self.state_traffic_per_seq

    @property
    def state_traffic_per_seq(self) -> float:
        """A sequence's state read and written back in one step."""
        return 2 * self.state_bytes_per_seq

    def gdn_step_flops(self, num_tokens: int) -> float:
        """The GDN layers' FLOPs for a step of `num_tokens` query tokens (every token passes every GDN layer)."""
        return num_tokens * self.gdn_flops_per_token

    def gdn_step_bytes(self, num_seqs: int) -> float:
        """The GDN layers' floor for one step: their mixers' weights, and the step's states read and written."""
        return self.gdn_weight_bytes + num_seqs * self.state_traffic_per_seq


def with_measured_weights(cost: ModelCost, weights: WeightBytes, args: ModelArgs) -> ModelCost:
    """`cost` with the weight bytes a loaded model really holds (quantized weights with their scales): what
    every forward reads in full, one routed expert, and the GDN mixers."""
    experts = max(cost.num_moe_layers * args.num_experts, 1)
    return replace(
        cost,
        dense_weight_bytes=float(weights.per_forward_dense),
        expert_weight_bytes=weights.routed_experts / experts,
        gdn_weight_bytes=float(weights.gdn),
    )


def _mixers(args: ModelArgs) -> tuple[int, int, int, int]:
    """(attention layers, multiply-adds of one attention mixer, weights of all GDN mixers, multiply-adds of the
    delta rule per token over all GDN layers). clover_moe's attention is gated: q_proj emits the query and its
    output gate. The delta rule's FLOPs per state element and token are the planner's count."""
    h, d = args.hidden_size, args.head_dim
    if "hybrid" not in args.extra:
        return args.num_layers, h * (args.num_heads + 2 * args.num_kv_heads) * d + args.num_heads * d * h, 0, 0
    hybrid, gdn = hybrid_args(args), hybrid_args(args).gdn
    num_gdn = sum(hybrid.is_gdn(i) for i in range(args.num_layers))
    attention = h * (2 * args.num_heads + 2 * args.num_kv_heads) * d + args.num_heads * d * h
    delta_rule = (
        num_gdn * RECURRENT_FLOPS_PER_STATE_ELEMENT * gdn.num_value_heads * gdn.key_head_dim * gdn.value_head_dim // 2
    )
    return args.num_layers - num_gdn, attention, num_gdn * gdn.layer_params(h, hybrid.has_diffusion), delta_rule


def model_cost(args: ModelArgs, weight_itemsize: int, kv_itemsize: int) -> ModelCost:
    """The per-unit costs of `args` with weights of `weight_itemsize` bytes and K/V of `kv_itemsize` bytes."""
    h, d = args.hidden_size, args.head_dim
    num_attention, attention_macs, gdn_params, delta_rule_macs = _mixers(args)
    hybrid = "hybrid" in args.extra
    moe_layers = [i for i in range(args.num_layers) if args.is_moe_layer(i)]
    num_moe, num_dense = len(moe_layers), args.num_layers - len(moe_layers)
    shared_macs = 3 * h * args.shared_expert_intermediate_size + (h if hybrid else 0)  # + sigmoid gate
    expert_macs = 3 * h * args.moe_intermediate_size
    routed_token_macs = h * args.num_experts + args.num_experts_per_tok * expert_macs + shared_macs
    dense_mlp_macs = 3 * h * args.intermediate_size
    mixer_macs = num_attention * attention_macs + gdn_params
    token_macs = mixer_macs + delta_rule_macs + num_moe * routed_token_macs + num_dense * dense_mlp_macs
    norms = args.num_layers * (2 * h + 2 * d) + h
    dense_params = (
        mixer_macs
        + num_moe * (h * args.num_experts + shared_macs)
        + num_dense * dense_mlp_macs
        + norms
        + h * args.vocab_size
    )
    return ModelCost(
        flops_per_token=2.0 * token_macs,
        flops_per_logit_row=2.0 * h * args.vocab_size,
        flops_per_attention_pair=4.0 * args.num_heads * d * num_attention,
        dense_weight_bytes=float(dense_params * weight_itemsize),
        expert_weight_bytes=float(expert_macs * weight_itemsize),
        num_moe_layers=num_moe,
        kv_bytes_per_token=float(cache_layout(args, ITEMSIZE_DTYPES[kv_itemsize]).kv_bytes_per_token()),
        state_bytes_per_seq=float(cache_layout(args, ITEMSIZE_DTYPES[weight_itemsize]).state_bytes_per_sequence()),
        gdn_weight_bytes=float(gdn_params * weight_itemsize),
        gdn_flops_per_token=2.0 * (gdn_params + delta_rule_macs),
    )
