"""Plan: the planner's answer for one (model, hardware, deployment, workload), with `explain()`.

Owns the order of the computation (model checks -> memory -> capacity -> fit -> decode -> prefill -> rate
sizing -> cost) and the public entry point `make_plan`. Knows nothing of the command line or of rendering.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffuserve.planner.advice import not_fit_error
from diffuserve.planner.capacity import Capacity, compute_capacity, fit_problem
from diffuserve.planner.coreset import CoresetComparison, compare_coreset
from diffuserve.planner.cost import CostEstimate, estimate_cost
from diffuserve.planner.hardware import HardwareSpec
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload, check_fits_model
from diffuserve.planner.memory import MemoryBreakdown, memory_breakdown
from diffuserve.planner.model_presets import ModelPreset
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.params import ParamCounts, count_parameters
from diffuserve.planner.roofline import DecodeEstimate, PrefillEstimate, Roofline
from diffuserve.planner.sizing import RateSizing, size_for_rate
from diffuserve.planner.units import fmt_count

if TYPE_CHECKING:
    from diffuserve.planner.calibration_record import CalibrationCheck

ACTIVE_DEFINITION = "active = parameters one token uses, embeddings and LM head included, routed experts x k/E"


@dataclass(frozen=True)
class Plan:
    spec: ModelSpec
    preset: ModelPreset | None
    params: ParamCounts
    hardware: HardwareSpec
    deployment: Deployment
    workload: Workload
    efficiency: Efficiency
    memory: MemoryBreakdown
    capacity: Capacity
    decode: DecodeEstimate
    prefill: PrefillEstimate
    cost: CostEstimate
    cost_inputs: CostInputs
    rate: RateSizing | None = None
    calibration: CalibrationCheck | None = None
    coreset: CoresetComparison | None = None
    """Batch 1 with the workload's block expert coreset beside per-token routing (None: coreset off)."""

    def explain(self) -> list[str]:
        """Every formula of the plan with its numbers, section by section."""
        sections = [
            ("parameters", self._parameter_formulas()),
            ("memory per device", self.memory.formulas),
            ("capacity", self.capacity.formulas),
            ("decode forward (per device)", self.decode.formulas),
            ("prefill and time to first token", self.prefill.formulas),
            ("request rate", self.rate.formulas if self.rate else ()),
            ("block expert coreset", self.coreset.formulas if self.coreset else ()),
            ("cost", self.cost.formulas),
            ("calibration", self.calibration.formulas if self.calibration else ()),
        ]
        lines = []
        for title, formulas in sections:
            if formulas:
                lines.append(f"[{title}]")
                lines.extend(f"  {formula}" for formula in formulas)
        return lines

    def _parameter_formulas(self) -> tuple[str, ...]:
        p, spec = self.params, self.spec
        return (
            f"total = attention {fmt_count(p.attention)} + "
            + (f"linear attention (GDN) {fmt_count(p.linear_attention)} + " if spec.is_hybrid else "")
            + f"dense MLP {fmt_count(p.dense_mlp)} + shared experts "
            f"{fmt_count(p.shared_experts)} + router {fmt_count(p.router)} + routed experts "
            f"{fmt_count(p.routed_experts)} + embeddings {fmt_count(p.embeddings)} + norms {fmt_count(p.norms)} "
            f"= {fmt_count(p.total)}",
            f"{ACTIVE_DEFINITION}: {fmt_count(p.non_expert)} + {fmt_count(p.routed_experts)} x "
            f"{spec.num_experts_per_tok}/{max(spec.num_experts, 1)} = {fmt_count(p.active(spec))} "
            f"({fmt_count(p.active_non_embedding(spec))} without embeddings)",
        )


def evaluate_memory(
    spec: ModelSpec, params: ParamCounts, hardware: HardwareSpec, deployment: Deployment, workload: Workload
) -> tuple[MemoryBreakdown, Capacity]:
    """Memory and capacity of one candidate deployment (also used to search for one that fits)."""
    memory = memory_breakdown(
        spec, params, deployment, hardware.memory_bytes, hardware.runtime_overhead_bytes, workload.block_length
    )
    return memory, compute_capacity(spec, deployment, memory, workload)


def make_plan(
    spec: ModelSpec,
    hardware: HardwareSpec,
    deployment: Deployment,
    workload: Workload,
    efficiency: Efficiency,
    cost_inputs: CostInputs,
    preset: ModelPreset | None = None,
) -> Plan:
    """The full plan; raises ValueError for inputs that contradict the model or a plan that does not fit."""
    check_fits_model(spec, deployment, workload)
    if deployment.max_num_batched_tokens < workload.block_length:
        raise ValueError(
            f"max_num_batched_tokens: {deployment.max_num_batched_tokens} is below the block length "
            f"{workload.block_length}; one forward must hold at least one block"
        )
    params = count_parameters(spec)

    def evaluate(candidate: Deployment, load: Workload) -> tuple[MemoryBreakdown, Capacity]:
        return evaluate_memory(spec, params, hardware, candidate, load)

    memory, capacity = evaluate(deployment, workload)
    problem = fit_problem(memory, capacity)
    if problem:
        raise not_fit_error(problem, spec, hardware.name, deployment, workload, memory, capacity, evaluate)
    roofline = Roofline(spec, params, hardware, deployment, efficiency, memory)
    decode = roofline.decode(workload, capacity.concurrency_per_replica)
    prefill = roofline.prefill(workload, decode)
    rate = None
    if workload.request_rate:
        rate = size_for_rate(
            workload.request_rate,
            workload.output_tokens,
            prefill.t_prefill,
            prefill.first_block_forwards,
            min(capacity.max_seqs_by_kv, deployment.max_num_seqs),
            deployment.num_replicas,
            deployment.tensor_parallel_size,
            lambda num_seqs: roofline.decode(workload, num_seqs),
        )
    cost = estimate_cost(cost_inputs, deployment.num_gpus, decode.tokens_per_s_total)
    return Plan(
        spec,
        preset,
        params,
        hardware,
        deployment,
        workload,
        efficiency,
        memory,
        capacity,
        decode,
        prefill,
        cost,
        cost_inputs,
        rate,
        coreset=compare_coreset(roofline, workload),
    )
