"""Renders a Plan: the human summary (a dozen lines) and the JSON document of `--json`.

Owns wording and layout only; every number comes from the Plan. Knows nothing of how numbers are computed.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from diffuserve.planner.plan import ACTIVE_DEFINITION, Plan
from diffuserve.planner.units import fmt_bytes, fmt_count, fmt_flops, fmt_money, fmt_time


def render_text(plan: Plan) -> list[str]:
    """The summary a person reads first; `Plan.explain()` holds the arithmetic behind each number."""
    spec, dep, load = plan.spec, plan.deployment, plan.workload
    return [
        f"{spec.name} on {dep.num_gpus} x {plan.hardware.name} (tp {dep.tensor_parallel_size}, ep "
        f"{dep.expert_parallel_size}) | weights {dep.weight_dtype} | KV {dep.kv_dtype} | context "
        f"{load.context_length:,} | block {load.block_length} | {_tpf(plan)}",
        _parameter_line(plan),
        *_memory_lines(plan),
        *_capacity_lines(plan),
        *_replica_lines(plan),
        *_hybrid_lines(plan),
        *_decode_lines(plan),
        *_coreset_lines(plan),
        f"Prefill     {load.prompt_tokens:,} prompt tokens in {fmt_time(plan.prefill.t_prefill)}; "
        f"TTFT {fmt_time(plan.prefill.ttft)} (first block after {plan.prefill.first_block_forwards} forwards)",
        *_rate_lines(plan),
        *_cost_lines(plan),
        *_calibration_lines(plan),
        f"Assumed     MBU {plan.efficiency.bandwidth_fraction}, MFU {plan.efficiency.flops_fraction}, step "
        f"overhead {fmt_time(plan.efficiency.step_overhead_s)}, TPF {load.tpf} "
        f"({_tpf_source(plan)})",
    ]


def _tpf(plan: Plan) -> str:
    load = plan.workload
    return f"verified decoding, TPF {load.tpf:.3g}" if load.decoder == "verified" else f"TPF {load.tpf}"


def _tpf_source(plan: Plan) -> str:
    if plan.workload.tpf_source:
        return plan.workload.tpf_source
    return "calibrated" if plan.calibration else "defaults: measure with diffuserve bench, pass --calibrate"


def _backup(plan: Plan) -> str:
    backup = plan.capacity.backup_bytes_per_sequence
    return f" + verification backup of the state {fmt_bytes(backup)}" if backup else ""


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """Every input and result as plain JSON values (bytes, seconds, tokens/s, dollars)."""
    p, spec = plan.params, plan.spec
    return {
        "model": {
            "name": spec.name,
            "architecture": spec.architecture,
            "num_layers": spec.num_layers,
            "attention_layers": spec.num_attention_layers,
            "linear_attention_layers": spec.linear_attention.num_layers if spec.linear_attention else 0,
            "total_params": p.total,
            "active_params": p.active(spec),
            "active_params_non_embedding": p.active_non_embedding(spec),
            "active_definition": ACTIVE_DEFINITION,
            "routed_expert_params": p.routed_experts,
            "published_total_params": plan.preset.published_total if plan.preset else None,
            "published_active_params": plan.preset.published_active if plan.preset else None,
        },
        "hardware": asdict(plan.hardware),
        "deployment": asdict(plan.deployment),
        "workload": asdict(plan.workload),
        "efficiency": asdict(plan.efficiency),
        "memory_per_device": {
            **_numbers(plan.memory),
            "weight_bytes": plan.memory.weight_bytes,
            "kv_pool_bytes": plan.memory.kv_pool_bytes,
        },
        "capacity": {
            **_numbers(plan.capacity),
            "bytes_per_sequence": plan.capacity.bytes_per_sequence,
            "max_concurrency": plan.capacity.max_concurrency,
        },
        "decode": {
            **_numbers(plan.decode),
            "forward": {
                **asdict(plan.decode.forward),
                "bytes": plan.decode.forward.bytes,
                "t_forward": plan.decode.forward.t_forward,
                "bound": plan.decode.forward.bound,
            },
        },
        "prefill": _numbers(plan.prefill),
        "request_rate": _numbers(plan.rate) if plan.rate else None,
        "block_expert_coreset": _coreset_dict(plan),
        "cost": {**_numbers(plan.cost), "inputs": asdict(plan.cost_inputs)},
        "calibration": (
            {**_numbers(plan.calibration), "relative_error": plan.calibration.relative_error}
            if plan.calibration
            else None
        ),
    }


def _coreset_dict(plan: Plan) -> dict[str, Any] | None:
    """The block expert coreset's part of `plan_to_dict` (None without a coreset)."""
    coreset = plan.coreset
    if coreset is None:
        return None
    return {
        "coreset": coreset.coreset,
        "rule": coreset.rule or str(coreset.coreset),
        "expert_bytes_per_forward_with_coreset": coreset.expert_bytes(coreset.with_coreset),
        "expert_bytes_per_forward_per_token": coreset.expert_bytes(coreset.per_token),
        "batch1_with_coreset": _numbers(coreset.with_coreset),
        "batch1_per_token_routing": _numbers(coreset.per_token),
        "speedup": coreset.speedup,
    }


def _numbers(result: Any) -> dict[str, Any]:
    return {key: value for key, value in asdict(result).items() if key != "formulas"}


def _parameter_line(plan: Plan) -> str:
    p, spec, preset = plan.params, plan.spec, plan.preset
    published = (
        f" (published {fmt_count(preset.published_total)} / {fmt_count(preset.published_active)})"
        if preset and preset.published_total and preset.published_active
        else ""
    )
    return (
        f"Parameters  {fmt_count(p.total)} total, {fmt_count(p.active(spec))} active{published}; active "
        f"includes embeddings + LM head ({fmt_count(p.active_non_embedding(spec))} without)"
    )


def _memory_lines(plan: Plan) -> list[str]:
    m = plan.memory
    rows = [
        ("attention/dense weights", m.dense_weight_bytes),
        ("expert weights", m.expert_weight_bytes),
        ("embeddings + LM head", m.embedding_bytes),
        ("activations + logits", m.activation_bytes),
        ("runtime overhead", m.overhead_bytes),
        ("KV cache pool", m.kv_pool_bytes),
    ]
    return [
        f"Memory per device: {fmt_bytes(m.device_bytes)}, {plan.deployment.gpu_memory_utilization:.0%} usable = "
        f"{fmt_bytes(m.usable_bytes)}",
        *(f"  {name:<26}{fmt_bytes(value):>12}" for name, value in rows),
        f"  KV per token {fmt_bytes(m.kv_bytes_per_token)} (full-attention layers); per "
        f"{plan.capacity.context_length:,}-token sequence {fmt_bytes(plan.capacity.kv_bytes_per_sequence)}"
        + (
            f" + recurrent state {fmt_bytes(m.state_bytes_per_sequence)} (constant)"
            + _backup(plan)
            + f" = {fmt_bytes(plan.capacity.bytes_per_sequence)}"
            if plan.spec.is_hybrid
            else ""
        ),
    ]


def _capacity_lines(plan: Plan) -> list[str]:
    c = plan.capacity
    engine_cap = (
        f" (engine max_num_seqs {c.max_num_seqs} caps a step; raise --max-num-seqs)"
        if c.max_seqs_by_kv > c.max_num_seqs
        else ""
    )
    return [
        f"Capacity    {c.max_seqs_by_kv * c.num_replicas} sequences fit at {c.context_length:,} tokens{engine_cap}; "
        f"at {c.concurrency} sequences the context can reach {c.max_context_at_concurrency:,} tokens",
    ]


def _replica_lines(plan: Plan) -> list[str]:
    """With more than one replica, the command that deploys them (docs/serving/gateways.md, "Behind a gateway")."""
    replicas, tp = plan.capacity.num_replicas, plan.deployment.tensor_parallel_size
    if replicas < 2:
        return []
    return [
        f"Replicas    {replicas} servers of {tp} GPU(s) behind a gateway: diffuserve serve MODEL "
        f"--tensor-parallel-size {tp} --replicas {replicas} --gateway smg (one machine; deploy/ for a cluster)"
    ]


def _hybrid_lines(plan: Plan) -> list[str]:
    """Why a hybrid matters at long context: the same pool with every layer full attention."""
    spec, c = plan.spec, plan.capacity
    if spec.linear_attention is None or c.full_attention_kv_bytes_per_sequence is None:
        return []
    fewer = f"{c.max_seqs_by_kv / c.full_attention_max_seqs:.1f}x fewer" if c.full_attention_max_seqs else "none fit"
    return [
        f"Hybrid      {spec.num_attention_layers} of {spec.num_layers} layers keep K/V ("
        f"{spec.linear_attention.num_layers} linear-attention layers: a constant state), so "
        f"{c.max_seqs_by_kv * c.num_replicas} sequences fit; with full attention in all {spec.num_layers} layers "
        f"(same heads) a {c.context_length:,}-token sequence would need "
        f"{fmt_bytes(c.full_attention_kv_bytes_per_sequence)} and {(c.full_attention_max_seqs or 0) * c.num_replicas}"
        f" would fit ({fewer})",
    ]


def _decode_lines(plan: Plan) -> list[str]:
    d, f = plan.decode, plan.decode.forward
    return [
        f"Decode      {d.concurrency} seqs/replica, {d.seqs_per_forward} per forward: T={f.tokens} tokens, experts "
        f"touched {f.experts_touched:.1%}, {fmt_bytes(f.bytes)} + {fmt_flops(f.flops)} per "
        f"forward -> {fmt_time(f.t_forward)} ({f.bound})",
        f"            {d.tokens_per_s_per_seq:,.1f} tokens/s per sequence (TPOT {fmt_time(1 / d.tokens_per_s_per_seq)})"
        f", {d.tokens_per_s_total:,.1f} tokens/s total",
    ]


def _coreset_lines(plan: Plan) -> list[str]:
    if plan.coreset is None:
        return []
    c = plan.coreset
    with_c, per_token = c.with_coreset, c.per_token
    return [
        f"Coreset     batch 1 with {c.label}: {with_c.tokens_per_s_per_seq:,.1f} tokens/s "
        f"(experts touched {with_c.forward.experts_touched:.1%}, expert weights {fmt_bytes(c.expert_bytes(with_c))} "
        f"of {fmt_bytes(with_c.forward.bytes)} per forward) vs {per_token.tokens_per_s_per_seq:,.1f} with per-token "
        f"routing ({per_token.forward.experts_touched:.1%}, expert weights {fmt_bytes(c.expert_bytes(per_token))} "
        f"of {fmt_bytes(per_token.forward.bytes)}): {c.speedup:.2f}x",
    ]


def _rate_lines(plan: Plan) -> list[str]:
    if plan.rate is None:
        return []
    r = plan.rate
    return [
        f"Rate        {r.request_rate}/s needs {r.concurrency_per_replica} seqs/replica (E2E "
        f"{fmt_time(r.e2e_latency_s)}) and {r.replicas_needed} replica(s) = {r.gpus_needed} GPU(s)"
    ]


def _cost_lines(plan: Plan) -> list[str]:
    c, inputs = plan.cost, plan.cost_inputs
    months = f"{c.break_even_months:.1f} months of 24/7 rental" if c.break_even_months else "never (vs 24/7)"
    share = (
        f"above {c.break_even_utilization:.0%} utilization vs on-demand"
        if c.break_even_utilization
        else "never vs on-demand"
    )
    return [
        f"Cost        cloud {fmt_money(c.cloud_per_million)} / 1M output tokens "
        f"({fmt_money(inputs.gpu_hour_price)}/GPU-h); on-prem {fmt_money(c.onprem_per_million)} / 1M "
        f"({fmt_money(c.onprem_hourly_per_gpu)}/GPU-h); utilization {inputs.utilization:.0%}",
        f"            on-prem breaks even after {months}, or {share}",
    ]


def _calibration_lines(plan: Plan) -> list[str]:
    if plan.calibration is None:
        return []
    c = plan.calibration
    return [
        f"Calibrated  bench run: predicted {c.predicted_tokens_per_s:,.1f} vs measured "
        f"{c.measured_tokens_per_s:,.1f} decode tokens/s ({c.relative_error:+.1%})"
    ]
