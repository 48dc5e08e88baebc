"""Turns one recorded engine run into its reported figures: throughput (aggregate, token-weighted), NFE, TPF,
per-request latencies, efficiency against the machine's measured rates, engine overhead, and the MoE figures.

Definitions (docs/benchmarks/index.md repeats them):
- tokens/s = all generated tokens / wall time of the run, prefill included (never a mean of per-request rates);
  decode tokens/s = tokens that became final in decode steps (no prompt tokens) / those steps' wall time;
- TTFT = arrival -> first committed block; E2E = arrival -> finish; TPOT = (E2E - TTFT) / (tokens - 1);
- efficiency over decode steps: FLOPs / wall time vs the probe's matmul rate, bytes / wall time vs its bandwidth;
- overhead = 1 - (time inside the model's forward and LM head) / (step wall time), over decode steps;
- hybrid models: the GDN layers' time per decode step vs their floor: the larger of their bytes (mixer
  weights + state read and written) at the probe's bandwidth and their FLOPs at its matmul rate.
Knows nothing of how the run was driven.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from diffuserve.bench.engine_run import RunRecord, StepRecord
from diffuserve.bench.flops import ModelCost
from diffuserve.bench.probes import MachineRates
from diffuserve.bench.report import distribution
from diffuserve.worker.experts import ExpertStatsSnapshot


def latencies(record: RunRecord) -> dict[str, dict[str, float | None]]:
    """Per-request TTFT, E2E and TPOT distributions, in seconds."""
    ttft, e2e, tpot = [], [], []
    for out in record.outputs:
        m = out.metrics
        if m.first_token_time is None or m.finished_time is None:
            continue
        ttft.append(m.first_token_time - m.arrival_time)
        e2e.append(m.finished_time - m.arrival_time)
        num_tokens = sum(len(c.token_ids) for c in out.outputs)
        if num_tokens > 1:
            tpot.append((e2e[-1] - ttft[-1]) / (num_tokens - 1))
    return {"ttft_s": distribution(ttft), "e2e_s": distribution(e2e), "tpot_s": distribution(tpot)}


def decode_tokens_per_s(steps: list[StepRecord]) -> float:
    decode = [s for s in steps if s.prefill_tokens == 0]
    seconds = sum(s.wall_s for s in decode)
    return sum(s.generated_tokens for s in decode) / seconds if seconds else 0.0


def efficiency(
    steps: list[StepRecord], cost: ModelCost, rates: MachineRates, experts_touched_per_layer: float
) -> dict[str, float | None]:
    """Achieved FLOP/s and bytes/s of the decode steps against the probes, and the engine's overhead share."""
    decode = [s for s in steps if s.prefill_tokens == 0] or steps
    wall = sum(s.wall_s for s in decode)
    model = sum(s.model_s for s in decode)
    flops = sum(cost.step_flops(s.num_tokens, s.num_logit_rows, s.attention_pairs) for s in decode)
    nbytes = sum(cost.step_bytes(experts_touched_per_layer, s.kv_tokens_read, s.num_seqs) for s in decode)
    if not wall:
        return {
            "flops_per_s": None,
            "matmul_fraction": None,
            "model_matmul_fraction": None,
            "bytes_per_s": None,
            "bandwidth_fraction": None,
            "overhead_fraction": None,
            "overhead_s_per_step": None,
        }
    return {
        "flops_per_s": flops / wall,
        "matmul_fraction": flops / wall / rates.flops_per_s,
        "model_matmul_fraction": flops / model / rates.flops_per_s if model else None,
        "bytes_per_s": nbytes / wall,
        "bandwidth_fraction": nbytes / wall / rates.bandwidth_bytes_per_s,
        "overhead_fraction": 1 - model / wall,
        "overhead_s_per_step": (wall - model) / len(decode),
    }


def gdn_roofline(steps: list[StepRecord], cost: ModelCost, rates: MachineRates) -> dict[str, float] | None:
    """Hybrid models: the GDN layers' time per decode step against their floor, the larger of their bytes (their
    mixers' weights and each sequence's state read and written once) at the probe's bandwidth and their FLOPs
    at its matmul rate. None for attention-only models."""
    decode = [s for s in steps if s.prefill_tokens == 0] or steps
    if not cost.gdn_weight_bytes or not decode:
        return None
    measured = sum(s.gdn_s for s in decode) / len(decode)
    floor_bytes = sum(cost.gdn_step_bytes(s.num_seqs) for s in decode) / len(decode)
    floor_flops = sum(cost.gdn_step_flops(s.num_tokens) for s in decode) / len(decode)
    floor = max(floor_bytes / rates.bandwidth_bytes_per_s, floor_flops / rates.flops_per_s)
    return {
        "gdn_s_per_step": measured,
        "gdn_floor_s_per_step": floor,
        "gdn_bytes_per_step": floor_bytes,
        "gdn_bytes_floor_s_per_step": floor_bytes / rates.bandwidth_bytes_per_s,
        "gdn_flops_per_step": floor_flops,
        "gdn_flops_floor_s_per_step": floor_flops / rates.flops_per_s,
        "gdn_floor_fraction": floor / measured if measured else 0.0,
        "gdn_share_of_step": measured / (sum(s.wall_s for s in decode) / len(decode)),
    }


def run_summary(
    record: RunRecord, cost: ModelCost, rates: MachineRates, experts: ExpertStatsSnapshot | None
) -> dict[str, Any]:
    """The JSON figures of one run (what every offline subcommand reports per configuration)."""
    steps = record.steps
    touched = experts.experts_touched_per_step if experts else 0.0
    decode = record.decode_steps
    return {
        "num_requests": len(record.outputs),
        "generated_tokens": record.generated_tokens,
        "wall_s": record.wall_s,
        "tokens_per_s": record.tokens_per_s,
        "decode_tokens_per_s": decode_tokens_per_s(steps),
        "nfe": record.num_forwards,
        "nfe_per_request": record.num_forwards / len(record.outputs) if record.outputs else 0.0,
        "tpf": record.tokens_per_forward,
        "num_steps": len(steps),
        "mean_step_s": sum(s.wall_s for s in steps) / len(steps) if steps else 0.0,
        "mean_decode_step_s": sum(s.wall_s for s in decode) / len(decode) if decode else 0.0,
        "mean_tokens_per_step": sum(s.num_tokens for s in steps) / len(steps) if steps else 0.0,
        "mean_seqs_per_decode_step": sum(s.num_seqs for s in decode) / len(decode) if decode else 0.0,
        "latency": latencies(record),
        "efficiency": efficiency(steps, cost, rates, touched),
        "gdn": gdn_roofline(steps, cost, rates),
        "comm_s_per_step": sum(s.comm_s for s in steps) / len(steps) if steps else 0.0,
        "comm_bytes_per_step": sum(s.comm_bytes for s in steps) / len(steps) if steps else 0.0,
        "experts": asdict(experts) if experts else None,
    }
