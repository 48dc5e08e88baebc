"""How many sequences fit, and how long they can be: the KV pool divided by what one sequence holds.

Owns max sequences at the context, max context at the concurrency (binary search over pages), and the
"does not fit" diagnosis. Knows nothing of time or money. Counts are per replica unless named `total`.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.planner.inputs import Deployment, Workload
from diffuserve.planner.memory import MemoryBreakdown, kv_bytes_per_sequence, page_size_for
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.units import ceil_div, fmt_bytes


@dataclass(frozen=True)
class Capacity:
    context_length: int
    kv_bytes_per_sequence: float
    max_seqs_by_kv: int
    """Sequences of `context_length` tokens whose KV fits one replica's pool."""
    max_num_seqs: int
    """The engine's per-step cap (max_num_seqs)."""
    num_replicas: int
    concurrency: int
    """Planned concurrent sequences over the whole deployment."""
    max_context_at_concurrency: int
    """Longest context at which `concurrency` sequences still fit (capped at the model's maximum)."""
    formulas: tuple[str, ...]

    @property
    def concurrency_per_replica(self) -> int:
        return ceil_div(self.concurrency, self.num_replicas)

    @property
    def max_concurrency(self) -> int:
        """Sequences the whole deployment can decode together: replicas x min(KV limit, engine cap)."""
        return self.num_replicas * min(self.max_seqs_by_kv, self.max_num_seqs)


def max_sequences(kv_pool_bytes: float, kv_per_sequence: float) -> int:
    """floor(pool / KV per sequence); 0 when the pool is empty or negative."""
    return max(0, int(kv_pool_bytes // kv_per_sequence)) if kv_per_sequence > 0 else 0


def max_context(spec: ModelSpec, deployment: Deployment, kv_pool_bytes: float, num_seqs: int,
                block_length: int) -> int:
    """Largest context (a whole number of pages, at most max_position_embeddings) at which `num_seqs`
    sequences fit the pool; 0 when not even one page each fits. KV per sequence grows with the context, so
    a binary search over the page count finds it."""
    page = page_size_for(deployment, block_length)
    cap = spec.max_position_embeddings

    def fits(pages: int) -> bool:
        return num_seqs * kv_bytes_per_sequence(spec, deployment, min(pages * page, cap), block_length) <= (
            kv_pool_bytes)

    low, high = 0, ceil_div(cap, page)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return min(low * page, cap)


def compute_capacity(spec: ModelSpec, deployment: Deployment, memory: MemoryBreakdown,
                     workload: Workload) -> Capacity:
    """Capacity at the workload's context; the planned concurrency defaults to as many as fit."""
    context, block = workload.context_length, workload.block_length
    per_seq = kv_bytes_per_sequence(spec, deployment, context, block)
    pool = memory.kv_pool_bytes
    by_kv = max_sequences(pool, per_seq)
    replicas = deployment.num_replicas
    concurrency = workload.concurrency or replicas * min(by_kv, deployment.max_num_seqs)
    per_replica = ceil_div(concurrency, replicas) if concurrency else 0
    longest = max_context(spec, deployment, pool, per_replica, block) if per_replica else 0
    formulas = (
        f"KV pool = usable {fmt_bytes(memory.usable_bytes)} - weights {fmt_bytes(memory.weight_bytes)} "
        f"- activations {fmt_bytes(memory.activation_bytes)} - overhead {fmt_bytes(memory.overhead_bytes)} "
        f"= {fmt_bytes(pool)}",
        f"KV/sequence = KV/token x {context} tokens (pages of {page_size_for(deployment, block)}; sliding layers "
        f"capped at window + S) = {fmt_bytes(per_seq)}",
        f"max sequences = floor({fmt_bytes(pool)} / {fmt_bytes(per_seq)}) = {by_kv} per replica "
        f"x {replicas} replica(s)",
        f"max context at {per_replica} sequence(s)/replica = largest c with {per_replica} x KV/sequence(c) "
        f"<= pool = {longest}",
    )
    return Capacity(
        context_length=context, kv_bytes_per_sequence=per_seq, max_seqs_by_kv=by_kv,
        max_num_seqs=deployment.max_num_seqs, num_replicas=replicas, concurrency=concurrency,
        max_context_at_concurrency=longest, formulas=formulas,
    )


def fit_problem(memory: MemoryBreakdown, capacity: Capacity) -> str | None:
    """Why the plan does not fit, with the numbers; None when it does."""
    if memory.kv_pool_bytes <= 0:
        return (
            f"weights {fmt_bytes(memory.weight_bytes)} + activations {fmt_bytes(memory.activation_bytes)} + "
            f"overhead {fmt_bytes(memory.overhead_bytes)} exceed the usable {fmt_bytes(memory.usable_bytes)} "
            "per device"
        )
    if capacity.max_seqs_by_kv == 0:
        return (
            f"one {capacity.context_length}-token sequence needs {fmt_bytes(capacity.kv_bytes_per_sequence)} of "
            f"KV per device but the pool holds {fmt_bytes(memory.kv_pool_bytes)}"
        )
    if capacity.concurrency_per_replica > capacity.max_seqs_by_kv:
        need = capacity.concurrency_per_replica * capacity.kv_bytes_per_sequence
        return (
            f"{capacity.concurrency_per_replica} sequences of {capacity.context_length} tokens per replica need "
            f"{fmt_bytes(need)} of KV per device but the pool holds {fmt_bytes(memory.kv_pool_bytes)} "
            f"({capacity.max_seqs_by_kv} fit)"
        )
    return None
