"""Bytes per device: weights (dense vs. routed experts), KV cache per token and per sequence, the recurrent
state per sequence of hybrid models (planner/recurrent_state.py), the activation and logits workspace, runtime
overhead, and what is left for the KV pool.

Owns the memory formulas; every result carries the formulas with its numbers (`formulas`). Knows nothing of
time or money. Shape letters: L layers, Hkv KV heads, D head dim, S block length, V vocabulary, h hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.model.shapes import PagedKV, SlidingWindowKV, heads_per_rank
from diffuserve.planner.inputs import KV_BYTES, WEIGHT_BYTES, Deployment
from diffuserve.planner.model_spec import AttentionGroup, ModelSpec
from diffuserve.planner.params import ParamCounts
from diffuserve.planner.recurrent_state import state_bytes_per_sequence, state_formula
from diffuserve.planner.units import GiB, ceil_div, fmt_bytes, fmt_count

NCCL_OVERHEAD_BYTES = 2 * GiB
"""Communicator buffers once a replica spans devices (llm-d-planner measured ~2.1 GiB at TP >= 2)."""
LOGITS_BYTES_PER_ELEMENT = 8
"""FP32 logits plus the FP32 probabilities the decoder derives from them."""


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per-device memory. `kv_pool_bytes` is negative when weights and workspace alone do not fit."""

    device_bytes: int
    usable_bytes: float
    dense_weight_bytes: float
    embedding_bytes: float
    expert_weight_bytes: float
    activation_bytes: float
    overhead_bytes: float
    kv_bytes_per_token: float
    """Full-attention layers only; sliding-window layers are capped per sequence (see `kv_bytes_per_sequence`)."""
    state_bytes_per_sequence: float
    """Constant recurrent state of the linear-attention layers per sequence (0 without such layers)."""
    formulas: tuple[str, ...]

    @property
    def weight_bytes(self) -> float:
        return self.dense_weight_bytes + self.embedding_bytes + self.expert_weight_bytes

    @property
    def kv_pool_bytes(self) -> float:
        return self.usable_bytes - self.weight_bytes - self.activation_bytes - self.overhead_bytes


def embedding_dtype(weight_dtype: str) -> str:
    """Quantized checkpoints keep the embedding and LM head in bf16; float checkpoints keep their dtype."""
    return weight_dtype if weight_dtype in ("fp32", "bf16", "fp16") else "bf16"


def page_size_for(deployment: Deployment, block_length: int) -> int:
    """The engine's default page: the smallest multiple of the block length that is >= 16 tokens."""
    return deployment.page_size or block_length * ceil_div(16, block_length)


def kv_heads_per_device(group: AttentionGroup, tensor_parallel_size: int) -> int:
    """KV heads split over TP ranks; a rank keeps at least one (heads are replicated when TP > Hkv)."""
    return heads_per_rank(group.num_kv_heads, tensor_parallel_size)


def kv_spec(group: AttentionGroup, deployment: Deployment) -> PagedKV:
    """The engine's cache spec of one of the group's layers (model/shapes.py)."""
    if group.window is None:
        return PagedKV(group.num_kv_heads, group.head_dim, deployment.kv_dtype)
    return SlidingWindowKV(group.num_kv_heads, group.head_dim, deployment.kv_dtype, group.window)


def kv_bytes_per_token(deployment: Deployment, group: AttentionGroup) -> float:
    """2 (K and V) * L * Hkv_per_device * D * bytes per element: the layers' spec, as the engine sizes it."""
    return group.num_layers * kv_spec(group, deployment).bytes_per_token(deployment.tensor_parallel_size)


def kv_bytes_per_sequence(spec: ModelSpec, deployment: Deployment, context: int, block_length: int) -> float:
    """KV bytes one sequence of `context` tokens holds on one device, rounded up to whole pages.

    Full-attention layers keep every token; a sliding-window layer keeps at most the window plus the block
    being denoised (the block's first query looks back `window` tokens), rounded to pages.
    """
    page = page_size_for(deployment, block_length)
    total = 0.0
    for group in spec.attention:
        kept = kv_spec(group, deployment).tokens_kept(context, block_length, page)
        total += kv_bytes_per_token(deployment, group) * kept
    return total


def memory_breakdown(
    spec: ModelSpec,
    params: ParamCounts,
    deployment: Deployment,
    device_bytes: int,
    runtime_overhead_bytes: int,
    block_length: int,
) -> MemoryBreakdown:
    """Weights, workspace and overhead on one device of a replica; the KV pool is what remains."""
    tp, shards = deployment.tensor_parallel_size, deployment.expert_shards
    b_w, dtype = WEIGHT_BYTES[deployment.weight_dtype], deployment.weight_dtype
    b_emb = WEIGHT_BYTES[embedding_dtype(dtype)]
    dense = split_dense_params(spec, params, deployment) + params.router + params.norms
    usable = device_bytes * deployment.gpu_memory_utilization
    activation, act_formula = _workspace(spec, deployment, block_length)
    overhead = _overhead(deployment, runtime_overhead_bytes)
    full_per_token = sum(kv_bytes_per_token(deployment, g) for g in spec.attention if g.window is None)
    formulas = (
        f"usable = {fmt_bytes(device_bytes)} x gpu_memory_utilization {deployment.gpu_memory_utilization} "
        f"= {fmt_bytes(usable)}",
        f"attention/dense weights per device = {fmt_count(dense)} params (split over tp {tp}: attention with "
        f"K/V heads replicated past Hkv, linear attention, dense MLP, shared experts unless ep > 1; whole: "
        f"routers, norms) x {b_w:.4g} B ({dtype}) = {fmt_bytes(dense * b_w)}",
        f"embeddings + LM head = {fmt_count(params.embeddings)} x {b_emb:.4g} B, whole on every device "
        f"= {fmt_bytes(params.embeddings * b_emb)}",
        f"routed experts = {fmt_count(params.routed_experts)} x {b_w:.4g} B / max(tp, ep) {shards} "
        f"= {fmt_bytes(params.routed_experts * b_w / shards)}",
        act_formula,
        f"runtime overhead = {fmt_bytes(overhead)}"
        + (" (incl. 2 GiB NCCL buffers)" if _is_parallel(deployment) else ""),
        *_kv_formulas(spec, deployment),
        *([state_formula(spec, deployment)] if spec.is_hybrid else []),
    )
    return MemoryBreakdown(
        device_bytes=device_bytes,
        usable_bytes=usable,
        dense_weight_bytes=dense * b_w,
        embedding_bytes=params.embeddings * b_emb,
        expert_weight_bytes=params.routed_experts * b_w / shards,
        activation_bytes=activation,
        overhead_bytes=overhead,
        kv_bytes_per_token=full_per_token,
        state_bytes_per_sequence=state_bytes_per_sequence(spec, deployment),
        formulas=formulas,
    )


def split_dense_params(spec: ModelSpec, params: ParamCounts, deployment: Deployment) -> float:
    """One device's share of the non-expert parameters the engine splits over tp ranks: attention (the K/V
    projections of a device's heads_per_rank KV heads, so replicated when tp > Hkv), linear attention, dense
    MLPs, and the shared experts unless experts are whole per rank (ep > 1 keeps them whole, as the engine's
    expert parallelism does). Routers, norms, embeddings and the LM head stay whole (model/tensor_parallel.py)."""
    tp = deployment.tensor_parallel_size
    kv = sum(
        g.num_layers * (2 if g.has_v_proj else 1) * spec.hidden_size * g.num_kv_heads * g.head_dim
        for g in spec.attention
    )
    kv_share = sum(
        g.num_layers * (2 if g.has_v_proj else 1) * spec.hidden_size * heads_per_rank(g.num_kv_heads, tp) * g.head_dim
        for g in spec.attention
    )
    shared = params.shared_experts if deployment.expert_parallel_size > 1 else params.shared_experts / tp
    split = params.attention - kv + params.linear_attention + params.dense_mlp
    return split / tp + kv_share + shared


def _is_parallel(deployment: Deployment) -> bool:
    return deployment.tensor_parallel_size > 1 or deployment.expert_parallel_size > 1


def _overhead(deployment: Deployment, runtime_overhead_bytes: int) -> float:
    if deployment.runtime_overhead_bytes is not None:
        return deployment.runtime_overhead_bytes
    return runtime_overhead_bytes + (NCCL_OVERHEAD_BYTES if _is_parallel(deployment) else 0)


def _workspace(spec: ModelSpec, deployment: Deployment, block_length: int) -> tuple[float, str]:
    """Peak activations of a full step plus the logits of every denoised position.

    Live tensors per token at the MLP peak (bf16, fp32 for fp32 models): residual, norm output, attention
    output and scratch (4h), the widest mixer projection (Q (+ gate) / K / V, or a GDN layer's q | k | v, z, b,
    a), and the gate/up outputs of the widest MLP (k experts + shared, or dense).
    """
    if deployment.activation_bytes is not None:
        return deployment.activation_bytes, f"activations = {fmt_bytes(deployment.activation_bytes)} (given)"
    tp = deployment.tensor_parallel_size
    b_act = 4 if deployment.weight_dtype == "fp32" else 2
    group = spec.attention[-1]
    qkv = (group.num_heads * (2 if group.output_gate else 1) + 2 * group.num_kv_heads) * group.head_dim
    if spec.linear_attention is not None:
        gdn = spec.linear_attention
        qkv = max(qkv, gdn.conv_dim + gdn.value_dim + 2 * gdn.num_value_heads)
    mlp = max(
        spec.intermediate_size if spec.num_dense_mlp_layers else 0,
        spec.num_experts_per_tok * spec.moe_intermediate_size + spec.shared_expert_intermediate_size,
    )
    per_token = b_act * (4 * spec.hidden_size + (qkv + 2 * mlp) / tp)
    tokens = deployment.max_num_batched_tokens
    logit_tokens = min(tokens, deployment.max_num_seqs * block_length)
    logits = logit_tokens * spec.vocab_size / tp * LOGITS_BYTES_PER_ELEMENT
    total = tokens * per_token + logits
    return total, (
        f"activations = max_num_batched_tokens {tokens} x {fmt_bytes(per_token)}/token "
        f"+ logits min({tokens}, max_num_seqs {deployment.max_num_seqs} x S {block_length}) x V {spec.vocab_size}"
        f" / tp {tp} x {LOGITS_BYTES_PER_ELEMENT} B = {fmt_bytes(total)}"
    )


def _kv_formulas(spec: ModelSpec, deployment: Deployment) -> list[str]:
    lines = []
    for group in spec.attention:
        heads = kv_heads_per_device(group, deployment.tensor_parallel_size)
        kind = "full attention" if group.window is None else f"sliding window {group.window}"
        lines.append(
            f"KV/token ({kind}) = 2 x L {group.num_layers} x Hkv {heads}/device x D {group.head_dim} x "
            f"{KV_BYTES[deployment.kv_dtype]} B ({deployment.kv_dtype}) = "
            f"{fmt_bytes(kv_bytes_per_token(deployment, group))}"
            + (
                f" ({spec.linear_attention.num_layers} linear-attention layers keep no K/V)"
                if spec.linear_attention is not None and group.window is None
                else ""
            )
        )
    return lines
