"""Weight bytes under `--weight-dtype fp8 | int8 | int4`, in the formats the engine runs (model/quant, default
`--quantization-targets`), matrix by matrix, so the scale / zero overhead is the real one:

    kind                              values       per output row of input width K (activations bf16, 2 B)
    int8  per output channel          1 B          one bf16 scale                           2 B
    int4  groups of 128, asymmetric   0.5 B        ceil(K / 128) x (bf16 scale + zero)      4 B per group
    fp8   e4m3 per output channel     1 B          one fp32 scale                           4 B

Quantized: routed experts, shared experts, dense MLPs, attention projections, the GDN layers' in_proj_qkv,
in_proj_z and out_proj. In 16 bits: embeddings and LM head, norms, routers, the shared-expert gate, the GDN
layers' in_proj_a / in_proj_b, conv and per-head vectors. A row-parallel layer's per-row scales are held by every
rank (not divided by tp); that is under 0.4 % of a quantized matrix and left out. Knows nothing of hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.params import ParamCounts
from diffuserve.planner.units import ceil_div

QUANTIZED_DTYPES = ("fp8", "int8", "int4")
VALUE_BYTES = {"fp8": 1.0, "int8": 1.0, "int4": 0.5}
INT4_GROUP_SIZE = 128
ACTIVATION_BYTES = 2
"""Scales of int8 / int4 are stored in the activation dtype (bf16), which the integer kernels take."""
UNQUANTIZED_BYTES = 2
"""Everything left in 16 bits."""


def row_overhead_bytes(weight_dtype: str, k: int) -> float:
    """Scale (and zero) bytes of one quantized output row of input width `k`."""
    if weight_dtype == "int4":
        return ceil_div(k, INT4_GROUP_SIZE) * 2 * ACTIVATION_BYTES
    return ACTIVATION_BYTES if weight_dtype == "int8" else 4


@dataclass(frozen=True)
class QuantizedBytes:
    """Whole-model bytes (before dividing over devices)."""

    dense: float
    """Everything but the routed experts and the embeddings / LM head."""
    experts: float
    quantized_params: int
    """Parameters stored quantized (the rest are 16-bit)."""


def _matrices(spec: ModelSpec) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """(rows N, input width K, count) of the quantized matrices: (routed experts, everything else)."""
    h = spec.hidden_size
    i, shared, dense = spec.moe_intermediate_size, spec.shared_expert_intermediate_size, spec.intermediate_size
    experts = [(2 * i, h, spec.num_moe_layers * spec.num_experts), (h, i, spec.num_moe_layers * spec.num_experts)]
    other = []
    if shared:
        other += [(2 * shared, h, spec.num_moe_layers), (h, shared, spec.num_moe_layers)]
    if spec.num_dense_mlp_layers:
        other += [(2 * dense, h, spec.num_dense_mlp_layers), (h, dense, spec.num_dense_mlp_layers)]
    for group in spec.attention:
        q_size, kv = group.num_heads * group.head_dim, group.num_kv_heads * group.head_dim
        q_out = 2 * q_size if group.output_gate else q_size
        other += [(q_out + kv + (kv if group.has_v_proj else 0), h, group.num_layers), (h, q_size, group.num_layers)]
    gdn = spec.linear_attention
    if gdn is not None:
        other += [(gdn.conv_dim + gdn.value_dim, h, gdn.num_layers), (h, gdn.value_dim, gdn.num_layers)]
    return experts, other


def _bytes(weight_dtype: str, matrices: list[tuple[int, int, int]]) -> tuple[float, int]:
    """(bytes, parameters) of quantized matrices."""
    values = sum(n * k * count for n, k, count in matrices)
    overhead = sum(n * count * row_overhead_bytes(weight_dtype, k) for n, k, count in matrices)
    return values * VALUE_BYTES[weight_dtype] + overhead, values


def quantized_bytes(spec: ModelSpec, params: ParamCounts, weight_dtype: str) -> QuantizedBytes:
    """Bytes of the routed experts and of the other non-embedding weights under `weight_dtype`."""
    expert_matrices, other_matrices = _matrices(spec)
    experts, expert_params = _bytes(weight_dtype, expert_matrices)
    other, other_params = _bytes(weight_dtype, other_matrices)
    dense_params = params.non_expert - params.embeddings
    dense = other + (dense_params - other_params) * UNQUANTIZED_BYTES
    return QuantizedBytes(dense, experts, expert_params + other_params)
