"""The per-sequence recurrent state of Gated DeltaNet layers: its bytes on one device and the FLOPs of the
delta-rule recurrence.

Owns the hybrid model's second memory term: a sequence holds, in every GDN layer, the state S [Hv, Dk, Dv] in
fp32 and the conv ring [conv_dim, k - 1] (the last k - 1 inputs of the causal conv) in the model's activation
dtype, whatever its length. Tensor parallelism splits both by heads, as it splits the in-projections. Knows
nothing of KV pages, pools or time: memory, capacity and the roofline call it.
"""

from __future__ import annotations

from diffuserve.model.shapes import DTYPE_BYTES, RecurrentState
from diffuserve.planner.hybrid_config import LinearAttentionGroup
from diffuserve.planner.inputs import Deployment
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.units import fmt_bytes

STATE_BYTES = DTYPE_BYTES[RecurrentState.state_dtype]
"""S is kept in fp32 whatever the weights are (the delta rule accumulates over the whole sequence)."""
RECURRENT_FLOPS_PER_STATE_ELEMENT = 7
"""Per token, head and element of S [Dk, Dv]: decay S * exp(g) 1, S^T k 2, the rank-1 update k (x) u 2, the
read-out S^T q 2 (multiply-adds count 2)."""


def activation_bytes(deployment: Deployment) -> int:
    """The model dtype the layers compute in: fp32 for fp32 weights, else bf16 (quantized weights dequantize)."""
    return 4 if deployment.weight_dtype == "fp32" else 2


def state_spec(group: LinearAttentionGroup, deployment: Deployment) -> RecurrentState:
    """The engine's cache spec of one GDN layer (model/shapes.py): the conv ring in the activation dtype."""
    conv = "fp32" if activation_bytes(deployment) == 4 else "bf16"
    return RecurrentState(
        group.num_key_heads, group.num_value_heads, group.key_head_dim, group.value_head_dim, group.conv_kernel, conv
    )


def state_bytes_per_layer(group: LinearAttentionGroup, deployment: Deployment) -> tuple[float, float]:
    """(S, conv ring) bytes of one sequence in one GDN layer on one device."""
    spec, tp = state_spec(group, deployment), deployment.tensor_parallel_size
    return float(spec.state_bytes(tp)), float(spec.ring_bytes(tp))


def state_bytes_per_sequence(spec: ModelSpec, deployment: Deployment) -> float:
    """Constant bytes one sequence holds on one device: 0 for models without linear-attention layers."""
    group = spec.linear_attention
    if group is None:
        return 0.0
    return float(group.num_layers * state_spec(group, deployment).bytes_per_sequence(deployment.tensor_parallel_size))


def recurrent_flops(spec: ModelSpec, tokens: float) -> float:
    """FLOPs of the delta-rule recurrence for `tokens` tokens over all GDN layers (the projections and the conv
    are weights: counted with the active parameters)."""
    group = spec.linear_attention
    if group is None:
        return 0.0
    per_token = RECURRENT_FLOPS_PER_STATE_ELEMENT * group.num_value_heads * group.key_head_dim * group.value_head_dim
    return group.num_layers * per_token * tokens


def state_formula(spec: ModelSpec, deployment: Deployment) -> str:
    """The state term with its numbers, for `--explain`."""
    group = spec.linear_attention
    if group is None:
        return "state/sequence = 0 (no linear-attention layers)"
    tp, act = deployment.tensor_parallel_size, activation_bytes(deployment)
    s, ring = state_bytes_per_layer(group, deployment)
    return (
        f"state/sequence (Gated DeltaNet) = L {group.num_layers} x (S: Hv {group.num_value_heads} x Dk "
        f"{group.key_head_dim} x Dv {group.value_head_dim} x {STATE_BYTES} B (fp32) {fmt_bytes(s * tp)} + conv ring:"
        f" (k-1) {group.conv_kernel - 1} x conv_dim {group.conv_dim} x {act} B {fmt_bytes(ring * tp)}) / tp {tp} = "
        f"{fmt_bytes(state_bytes_per_sequence(spec, deployment))}, whatever the context"
    )
