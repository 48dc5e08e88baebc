"""What would make a plan fit: more devices, FP8 weights, FP8 KV, a shorter context or fewer sequences.

Owns the search over those alternatives and the one-line error that lists them with their numbers. Knows
nothing of how memory is computed: it re-evaluates candidates through the callable it is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from diffuserve.planner.capacity import Capacity, fit_problem, max_context
from diffuserve.planner.inputs import Deployment, Workload, check_fits_model
from diffuserve.planner.memory import MemoryBreakdown
from diffuserve.planner.model_spec import ModelSpec

Evaluate = Callable[[Deployment, Workload], tuple[MemoryBreakdown, Capacity]]
MAX_TENSOR_PARALLEL = 64


def not_fit_error(
    problem: str,
    spec: ModelSpec,
    hardware_name: str,
    deployment: Deployment,
    workload: Workload,
    memory: MemoryBreakdown,
    capacity: Capacity,
    evaluate: Evaluate,
) -> ValueError:
    """The error for a plan that does not fit, naming every alternative that would."""
    options = [
        *_more_devices(spec, deployment, workload, evaluate),
        *_cheaper_dtypes(deployment, workload, evaluate),
        *_smaller_workload(spec, deployment, workload, memory, capacity),
    ]
    where = f"{deployment.num_gpus} x {hardware_name} (tp {deployment.tensor_parallel_size})"
    fix = "; ".join(options) if options else f"nothing tried fits (up to tp {MAX_TENSOR_PARALLEL}, FP8)"
    return ValueError(f"{spec.name} does not fit on {where}: {problem}. What would fit: {fix}")


def _fits(candidate: Deployment, workload: Workload, evaluate: Evaluate) -> bool:
    memory, capacity = evaluate(candidate, workload)
    return fit_problem(memory, capacity) is None


def _more_devices(spec: ModelSpec, deployment: Deployment, workload: Workload, evaluate: Evaluate) -> list[str]:
    found = _fewest_devices(spec, deployment, workload, evaluate)
    if found is None:
        return []
    option = f"more GPUs: --num-gpus {found.num_gpus} --tensor-parallel-size {found.tensor_parallel_size}"
    if deployment.weight_dtype in ("fp32", "bf16", "fp16"):
        fp8 = _fewest_devices(spec, replace(deployment, weight_dtype="fp8"), workload, evaluate)
        if fp8 is not None and fp8.num_gpus < found.num_gpus:
            option += (
                f" (or --num-gpus {fp8.num_gpus} --tensor-parallel-size {fp8.tensor_parallel_size} with "
                "--weight-dtype fp8)"
            )
    return [option]


def _fewest_devices(
    spec: ModelSpec, deployment: Deployment, workload: Workload, evaluate: Evaluate
) -> Deployment | None:
    """The smallest larger tensor-parallel size (a power of two) that the model's heads allow and that fits."""
    tp = deployment.tensor_parallel_size * 2
    while tp <= MAX_TENSOR_PARALLEL:
        candidate = replace(
            deployment,
            tensor_parallel_size=tp,
            num_gpus=tp * deployment.num_replicas,
            expert_parallel_size=tp if deployment.expert_parallel_size > 1 else 1,
        )
        try:
            check_fits_model(spec, candidate, workload)
        except ValueError:
            tp *= 2
            continue
        if _fits(candidate, workload, evaluate):
            return candidate
        tp *= 2
    return None


def _cheaper_dtypes(deployment: Deployment, workload: Workload, evaluate: Evaluate) -> list[str]:
    """FP8 weights, FP8 K/V, and, where neither alone fits, both: every way on the same devices."""
    options = []
    float_weights = deployment.weight_dtype in ("fp32", "bf16", "fp16")
    fp8_weights = float_weights and _fits(replace(deployment, weight_dtype="fp8"), workload, evaluate)
    fp8_kv = deployment.kv_dtype != "fp8" and _fits(replace(deployment, kv_dtype="fp8"), workload, evaluate)
    if fp8_weights:
        options.append("FP8 weights: --weight-dtype fp8")
    if fp8_kv:
        options.append("FP8 KV cache: --kv-cache-dtype fp8")
    both = replace(deployment, weight_dtype="fp8", kv_dtype="fp8")
    if (
        float_weights
        and deployment.kv_dtype != "fp8"
        and not (fp8_weights or fp8_kv)
        and _fits(both, workload, evaluate)
    ):
        options.append("FP8 weights and KV cache: --weight-dtype fp8 --kv-cache-dtype fp8")
    return options


def _smaller_workload(
    spec: ModelSpec, deployment: Deployment, workload: Workload, memory: MemoryBreakdown, capacity: Capacity
) -> list[str]:
    if memory.kv_pool_bytes <= 0:
        return []
    options = []
    per_replica = max(1, capacity.concurrency_per_replica)
    longest = max_context(spec, deployment, memory.kv_pool_bytes, per_replica, workload.block_length, workload.decoder)
    if 0 < longest < workload.context_length:
        options.append(f"a shorter context: --context-length {longest} for {per_replica} sequence(s) per replica")
    if 0 < capacity.max_seqs_by_kv < capacity.concurrency_per_replica:
        options.append(f"fewer sequences: --concurrency {capacity.max_seqs_by_kv * capacity.num_replicas}")
    return options
