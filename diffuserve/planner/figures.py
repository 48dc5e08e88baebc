"""What a plan's pictures show, as numbers: one device's memory as a stack of parts at the planned concurrency,
and how many sequences fit as the context grows (the hybrid model beside the same model in full attention).

Pure Python over a `Plan` and the capacity module's own functions, so a picture never disagrees with the plan:
at the plan's context the curve is the plan's capacity. Knows nothing of drawing (the web console draws these,
`diffuserve plan --chart` its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.planner.capacity import full_attention_equivalent, max_sequences, sequence_bytes
from diffuserve.planner.memory import kv_bytes_per_sequence
from diffuserve.planner.plan import Plan

SHORTEST_CONTEXT = 1024
"""The curve starts at this many tokens (or at the plan's context, if shorter) and doubles from there."""


@dataclass(frozen=True)
class MemoryPart:
    name: str
    bytes: float
    """Per device."""


@dataclass(frozen=True)
class FitPoint:
    context_length: int
    sequences: int
    """Sequences of this many tokens whose K/V (and state) fit, over all replicas."""
    full_attention_sequences: int | None
    """The same for the model with every layer full attention (hybrid models only)."""


def sequences_that_fit(plan: Plan) -> int:
    """Sequences of the plan's context that fit the whole deployment (what `diffuserve plan` prints)."""
    return plan.capacity.max_seqs_by_kv * plan.capacity.num_replicas


def device_memory(plan: Plan) -> list[MemoryPart]:
    """One device's memory, bottom to top, adding up to the device: weights, routed experts, the K/V and state
    of the planned sequences, activations, the runtime, and what is left (the unused pool and the memory
    outside gpu_memory_utilization). Every device of a replica holds the same parts (tensor or expert parallel)."""
    memory, capacity = plan.memory, plan.capacity
    seqs = capacity.concurrency_per_replica
    parts = [
        MemoryPart("weights", memory.dense_weight_bytes + memory.embedding_bytes),
        MemoryPart("experts", memory.expert_weight_bytes),
        MemoryPart("K/V", seqs * capacity.kv_bytes_per_sequence),
        MemoryPart("state", seqs * (capacity.state_bytes_per_sequence + capacity.backup_bytes_per_sequence)),
        MemoryPart("activations", memory.activation_bytes),
        MemoryPart("runtime", memory.overhead_bytes),
    ]
    used = sum(part.bytes for part in parts)
    return [*parts, MemoryPart("free", memory.device_bytes - used)]


def context_lengths(plan: Plan) -> list[int]:
    """Doubling context lengths up to the model's maximum, with the plan's own context among them."""
    top = plan.spec.max_position_embeddings
    own = plan.workload.context_length
    lengths = {own, top}
    length = min(SHORTEST_CONTEXT, own)
    while length < top:
        lengths.add(length)
        length *= 2
    return sorted(lengths)


def fit_curve(plan: Plan) -> list[FitPoint]:
    """Sequences that fit the plan's K/V pool at each of `context_lengths(plan)`."""
    spec, deployment, block = plan.spec, plan.deployment, plan.workload.block_length
    pool, replicas = plan.memory.kv_pool_bytes, plan.capacity.num_replicas
    full = full_attention_equivalent(spec) if spec.is_hybrid else None
    points = []
    for context in context_lengths(plan):
        seqs = max_sequences(pool, sequence_bytes(spec, deployment, context, block, plan.workload.decoder))
        full_seqs = (
            None
            if full is None
            else replicas * max_sequences(pool, kv_bytes_per_sequence(full, deployment, context, block))
        )
        points.append(FitPoint(context, replicas * seqs, full_seqs))
    return points
