"""How many sequences fit, and how long they can be: the KV pool divided by what one sequence holds (its KV
pages plus, for hybrid models, its constant recurrent state).

Owns max sequences at the context, max context at the concurrency (binary search over pages), the comparison of
a hybrid model with the same model in full attention, and the "does not fit" diagnosis. Knows nothing of time or
money. Counts are per replica unless named `total`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from diffuserve.planner.inputs import Deployment, Workload
from diffuserve.planner.memory import MemoryBreakdown, kv_bytes_per_sequence, page_size_for
from diffuserve.planner.model_spec import AttentionGroup, ModelSpec
from diffuserve.planner.recurrent_state import state_bytes_per_sequence
from diffuserve.planner.units import ceil_div, fmt_bytes
from diffuserve.planner.verified import backup_bytes_per_sequence


@dataclass(frozen=True)
class Capacity:
    context_length: int
    kv_bytes_per_sequence: float
    state_bytes_per_sequence: float
    """Constant recurrent state of a sequence (hybrid models; 0 otherwise)."""
    backup_bytes_per_sequence: float
    """decoder verified: the copy of that state saved before each check (planner/verified.py; 0 otherwise)."""
    max_seqs_by_kv: int
    """Sequences of `context_length` tokens whose KV and state fit one replica's pool."""
    max_num_seqs: int
    """The engine's per-step cap (max_num_seqs)."""
    num_replicas: int
    concurrency: int
    """Planned concurrent sequences over the whole deployment."""
    max_context_at_concurrency: int
    """Longest context at which `concurrency` sequences still fit (capped at the model's maximum)."""
    formulas: tuple[str, ...]
    full_attention_kv_bytes_per_sequence: float | None = None
    """Hybrid models: KV of one sequence if every layer were full attention with the same heads."""
    full_attention_max_seqs: int | None = None
    """Hybrid models: sequences that would fit the same pool per replica with full attention in every layer."""

    @property
    def bytes_per_sequence(self) -> float:
        """What one sequence holds: KV pages + recurrent state (+ its verification backup)."""
        return self.kv_bytes_per_sequence + self.state_bytes_per_sequence + self.backup_bytes_per_sequence

    @property
    def concurrency_per_replica(self) -> int:
        return ceil_div(self.concurrency, self.num_replicas)

    @property
    def max_concurrency(self) -> int:
        """Sequences the whole deployment can decode together: replicas x min(KV limit, engine cap)."""
        return self.num_replicas * min(self.max_seqs_by_kv, self.max_num_seqs)


def max_sequences(kv_pool_bytes: float, bytes_per_sequence: float) -> int:
    """floor(pool / (KV + state) per sequence); 0 when the pool is empty or negative."""
    return max(0, int(kv_pool_bytes // bytes_per_sequence)) if bytes_per_sequence > 0 else 0


def held_state_bytes(spec: ModelSpec, deployment: Deployment, decoder: str) -> float:
    """The constant bytes one sequence holds on one device: its recurrent state, and under verified decoding the
    backup of it (0 for models without linear-attention layers)."""
    backup = backup_bytes_per_sequence(spec, deployment) if decoder == "verified" else 0.0
    return state_bytes_per_sequence(spec, deployment) + backup


def sequence_bytes(
    spec: ModelSpec, deployment: Deployment, context: int, block_length: int, decoder: str = "diffusion"
) -> float:
    """KV of `context` tokens (whole pages) plus the constant state (`held_state_bytes`): one sequence on one
    device."""
    return kv_bytes_per_sequence(spec, deployment, context, block_length) + held_state_bytes(spec, deployment, decoder)


def full_attention_equivalent(spec: ModelSpec) -> ModelSpec:
    """The same model with every layer full attention, with the heads of its full-attention layers."""
    group = next((g for g in spec.attention if g.window is None), spec.attention[-1])
    full = AttentionGroup(
        spec.num_layers,
        group.num_heads,
        group.num_kv_heads,
        group.head_dim,
        has_v_proj=group.has_v_proj,
        output_gate=group.output_gate,
    )
    return replace(spec, attention=(full,), linear_attention=None)


def max_context(
    spec: ModelSpec,
    deployment: Deployment,
    kv_pool_bytes: float,
    num_seqs: int,
    block_length: int,
    decoder: str = "diffusion",
) -> int:
    """Largest context (a whole number of pages, at most max_position_embeddings) at which `num_seqs`
    sequences fit the pool; 0 when not even one page each fits. KV per sequence grows with the context, so
    a binary search over the page count finds it."""
    page = page_size_for(deployment, block_length)
    cap = spec.max_position_embeddings

    def fits(pages: int) -> bool:
        held = sequence_bytes(spec, deployment, min(pages * page, cap), block_length, decoder)
        return num_seqs * held <= kv_pool_bytes

    low, high = 0, ceil_div(cap, page)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return min(low * page, cap)


def compute_capacity(spec: ModelSpec, deployment: Deployment, memory: MemoryBreakdown, workload: Workload) -> Capacity:
    """Capacity at the workload's context; the planned concurrency defaults to as many as fit."""
    context, block = workload.context_length, workload.block_length
    kv = kv_bytes_per_sequence(spec, deployment, context, block)
    state = state_bytes_per_sequence(spec, deployment)
    backup = held_state_bytes(spec, deployment, workload.decoder) - state
    pool = memory.kv_pool_bytes
    by_kv = max_sequences(pool, kv + state + backup)
    replicas = deployment.num_replicas
    concurrency = workload.concurrency or replicas * min(by_kv, deployment.max_num_seqs)
    per_replica = ceil_div(concurrency, replicas) if concurrency else 0
    longest = max_context(spec, deployment, pool, per_replica, block, workload.decoder) if per_replica else 0
    per_seq = f"({fmt_bytes(kv)} + state {fmt_bytes(state)})" if spec.is_hybrid else fmt_bytes(kv)
    if backup:
        per_seq = f"({fmt_bytes(kv)} + state {fmt_bytes(state)} + verification backup {fmt_bytes(backup)})"
    formulas = [
        f"KV pool = usable {fmt_bytes(memory.usable_bytes)} - weights {fmt_bytes(memory.weight_bytes)} "
        f"- activations {fmt_bytes(memory.activation_bytes)} - overhead {fmt_bytes(memory.overhead_bytes)} "
        f"= {fmt_bytes(pool)}",
        f"KV/sequence = KV/token x {context} tokens (pages of {page_size_for(deployment, block)}; sliding layers "
        f"capped at window + S) = {fmt_bytes(kv)}",
        f"max sequences = floor({fmt_bytes(pool)} / {per_seq}) = {by_kv} per replica x {replicas} replica(s)",
        f"max context at {per_replica} sequence(s)/replica = largest c with {per_replica} x "
        f"{'(KV/sequence(c) + state)' if spec.is_hybrid else 'KV/sequence(c)'} <= pool = {longest}",
    ]
    full_kv = full_seqs = None
    if spec.is_hybrid:
        full_kv = kv_bytes_per_sequence(full_attention_equivalent(spec), deployment, context, block)
        full_seqs = max_sequences(pool, full_kv)
        formulas.append(_comparison_formula(spec, context, pool, full_kv, full_seqs))
    return Capacity(
        context_length=context,
        kv_bytes_per_sequence=kv,
        state_bytes_per_sequence=state,
        backup_bytes_per_sequence=backup,
        max_seqs_by_kv=by_kv,
        max_num_seqs=deployment.max_num_seqs,
        num_replicas=replicas,
        concurrency=concurrency,
        max_context_at_concurrency=longest,
        formulas=tuple(formulas),
        full_attention_kv_bytes_per_sequence=full_kv,
        full_attention_max_seqs=full_seqs,
    )


def _comparison_formula(spec: ModelSpec, context: int, pool: float, full_kv: float, full_seqs: int) -> str:
    group = full_attention_equivalent(spec).attention[0]
    return (
        f"full-attention equivalent: all {spec.num_layers} layers attention (Hkv {group.num_kv_heads} x D "
        f"{group.head_dim}), no state: KV/sequence at {context} tokens = {fmt_bytes(full_kv)}; max sequences = "
        f"floor({fmt_bytes(pool)} / {fmt_bytes(full_kv)}) = {full_seqs} per replica (same pool)"
    )


def fit_problem(memory: MemoryBreakdown, capacity: Capacity) -> str | None:
    """Why the plan does not fit, with the numbers; None when it does."""
    if memory.kv_pool_bytes <= 0:
        return (
            f"weights {fmt_bytes(memory.weight_bytes)} + activations {fmt_bytes(memory.activation_bytes)} + "
            f"overhead {fmt_bytes(memory.overhead_bytes)} exceed the usable {fmt_bytes(memory.usable_bytes)} "
            "per device"
        )
    held = "KV + state" if capacity.state_bytes_per_sequence else "KV"
    if capacity.backup_bytes_per_sequence:
        held += " + verification backup"
    if capacity.max_seqs_by_kv == 0:
        return (
            f"one {capacity.context_length}-token sequence needs {fmt_bytes(capacity.bytes_per_sequence)} of "
            f"{held} per device but the pool holds {fmt_bytes(memory.kv_pool_bytes)}"
        )
    if capacity.concurrency_per_replica > capacity.max_seqs_by_kv:
        need = capacity.concurrency_per_replica * capacity.bytes_per_sequence
        return (
            f"{capacity.concurrency_per_replica} sequences of {capacity.context_length} tokens per replica need "
            f"{fmt_bytes(need)} of {held} per device but the pool holds {fmt_bytes(memory.kv_pool_bytes)} "
            f"({capacity.max_seqs_by_kv} fit)"
        )
    return None
