"""`diffuserve plan --calibrate`: reads a bench run's "calibration" object and checks the planner's prediction
of that very run against what it measured.

Owns reading a bench output file (one JSON document, or text whose last JSON line holds "calibration") and the
predicted-vs-measured check. The schema itself is `Calibration` (planner/calibration_record.py), the class the
bench writes with. Knows nothing of how the bench measures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diffuserve.planner.calibration_record import REQUIRED_KEYS, Calibration, CalibrationCheck, missing_keys
from diffuserve.planner.inputs import CostInputs, Workload
from diffuserve.planner.plan import Plan, make_plan
from diffuserve.planner.units import fmt_time

__all__ = [
    "REQUIRED_KEYS",
    "Calibration",
    "CalibrationCheck",
    "check_calibration",
    "load_calibration",
    "missing_keys",
    "parse_calibration",
    "plan_bench_run",
]


def load_calibration(path: str | Path) -> Calibration:
    """Reads a bench output file: one JSON document, or text whose last JSON line holds "calibration"."""
    text = Path(path).read_text()
    document = _last_json_object(text)
    if document is None:
        raise ValueError(f"calibrate: {path} holds no JSON object; pass the JSON line `diffuserve bench` printed")
    return parse_calibration(document.get("calibration", document))


def parse_calibration(data: dict[str, Any]) -> Calibration:
    """Validates a "calibration" object and builds a Calibration; ValueError names every missing key."""
    return Calibration.from_json(data)


def plan_bench_run(calibration: Calibration) -> Plan:
    """The plan of exactly the run the bench measured, using its fitted knobs."""
    workload = Workload(
        context_length=calibration.prompt_tokens + calibration.output_tokens,
        prompt_tokens=calibration.prompt_tokens,
        output_tokens=calibration.output_tokens,
        block_length=calibration.block_length,
        tpf=calibration.tpf,
        concurrency=calibration.num_seqs,
        experts_touched_per_block=calibration.experts_touched_per_block,
    )
    costs = CostInputs(
        gpu_hour_price=calibration.hardware.cloud_price_per_hour, capex_per_gpu=calibration.hardware.capex_per_device
    )
    return make_plan(
        calibration.spec, calibration.hardware, calibration.deployment, workload, calibration.efficiency, costs
    )


def check_calibration(calibration: Calibration) -> CalibrationCheck:
    """Predicted vs. measured decode throughput of the bench run."""
    decode = plan_bench_run(calibration).decode
    predicted, measured = decode.tokens_per_s_total, calibration.measured_decode_tokens_per_s
    error = (predicted - measured) / measured
    formulas = [
        f"bench run: {calibration.num_seqs} seqs, prompt {calibration.prompt_tokens}, output "
        f"{calibration.output_tokens}, S {calibration.block_length}, TPF {calibration.tpf}, MBU "
        f"{calibration.efficiency.bandwidth_fraction}, MFU {calibration.efficiency.flops_fraction}, overhead "
        f"{fmt_time(calibration.efficiency.step_overhead_s)}",
        f"decode tokens/s: predicted {predicted:,.1f} vs measured {measured:,.1f} -> error {error:+.1%}",
    ]
    if calibration.measured_forward_time_s is not None:
        formulas.append(
            f"forward time: predicted {fmt_time(decode.forward.t_forward)} vs measured "
            f"{fmt_time(calibration.measured_forward_time_s)}"
        )
    return CalibrationCheck(
        predicted, measured, decode.forward.t_forward, calibration.measured_forward_time_s, tuple(formulas)
    )


def _last_json_object(text: str) -> dict[str, Any] | None:
    try:
        document = json.loads(text)
        return document if isinstance(document, dict) else None
    except json.JSONDecodeError:
        pass
    for line in reversed(text.strip().splitlines()):
        try:
            document = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(document, dict):
            return document
    return None
