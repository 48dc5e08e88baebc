"""Calibration: the contract between `diffuserve bench` (writer) and `diffuserve plan --calibrate` (reader).

Owns the schema of the `"calibration"` object a bench run prints in its final JSON line, its validation (every
missing key named by its dotted path), and the predicted-vs-measured check on that run. Knows nothing of how
the bench measures; docs/planner.md#calibration says what each key means and how to measure it.

    {"calibration": {
        "schema_version": 1,
        "model_config": {...config.json of the model the bench ran...},
        "weight_dtype": "fp32", "kv_dtype": "fp32",
        "hardware": {"name": "...", "memory_bytes": ..., "bandwidth_bytes_per_s": ..., "flops_per_s": ...},
        "workload": {"num_seqs": 8, "prompt_tokens": 256, "output_tokens": 256, "block_length": 32},
        "achieved_bandwidth_fraction": 0.6, "achieved_flops_fraction": 0.3, "step_overhead_s": 0.004,
        "tpf": 2.4, "experts_touched_per_block": 9.5,
        "measured_decode_tokens_per_s": 410.0,
        "measured_forward_time_s": 0.047,                                   (optional)
        "deployment": {"tensor_parallel_size": 1, "max_num_seqs": 64, "max_num_batched_tokens": 4096}
                                                                            (optional)
    }}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffuserve.planner.hardware import HardwareSpec, custom_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_spec import ModelSpec, spec_from_config
from diffuserve.planner.plan import Plan, make_plan
from diffuserve.planner.units import fmt_time

SCHEMA_VERSION = 1
REQUIRED_KEYS = (
    "model_config", "weight_dtype", "kv_dtype",
    "hardware.memory_bytes", "hardware.bandwidth_bytes_per_s", "hardware.flops_per_s",
    "workload.num_seqs", "workload.prompt_tokens", "workload.output_tokens", "workload.block_length",
    "achieved_bandwidth_fraction", "achieved_flops_fraction", "step_overhead_s", "tpf",
    "experts_touched_per_block", "measured_decode_tokens_per_s",
)
"""Dotted paths inside the "calibration" object. `experts_touched_per_block` may be null (a dense model, or a
bench that did not count experts): the planner then assumes uniform routing."""
NULLABLE_KEYS = ("experts_touched_per_block",)


@dataclass(frozen=True)
class Calibration:
    """One bench run: what ran (model, dtypes, hardware, workload), the fitted knobs, and what it measured."""

    model_config: dict[str, Any]
    weight_dtype: str
    kv_dtype: str
    hardware: HardwareSpec
    num_seqs: int
    prompt_tokens: int
    output_tokens: int
    block_length: int
    efficiency: Efficiency
    """achieved_bandwidth_fraction, achieved_flops_fraction and step_overhead_s of the run."""
    tpf: float
    experts_touched_per_block: float | None
    measured_decode_tokens_per_s: float
    measured_forward_time_s: float | None = None
    deployment: Deployment = field(default_factory=Deployment)

    @property
    def spec(self) -> ModelSpec:
        return spec_from_config(self.model_config, "bench model")


@dataclass(frozen=True)
class CalibrationCheck:
    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    predicted_forward_s: float
    measured_forward_s: float | None
    formulas: tuple[str, ...]

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_tokens_per_s - self.measured_tokens_per_s) / self.measured_tokens_per_s


def load_calibration(path: str | Path) -> Calibration:
    """Reads a bench output file: one JSON document, or text whose last JSON line holds "calibration"."""
    text = Path(path).read_text()
    document = _last_json_object(text)
    if document is None:
        raise ValueError(f"calibrate: {path} holds no JSON object; pass the JSON line `diffuserve bench` printed")
    return parse_calibration(document.get("calibration", document))


def missing_keys(data: dict[str, Any]) -> list[str]:
    """Required dotted paths absent (or null where null is not allowed) in a "calibration" object."""
    missing = []
    for path in REQUIRED_KEYS:
        node: Any = data
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                break
        if node is None and not (path in NULLABLE_KEYS and path in data):
            missing.append(path)
    return missing


def parse_calibration(data: dict[str, Any]) -> Calibration:
    """Validates a "calibration" object and builds a Calibration; ValueError names every missing key."""
    missing = missing_keys(data)
    if missing:
        raise ValueError(
            f"calibrate: missing key(s) {', '.join('calibration.' + key for key in missing)}; "
            "see docs/planner.md (Calibration) for the contract"
        )
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ValueError(f"calibrate: schema_version {version} is not supported; this planner reads {SCHEMA_VERSION}")
    hw, load, dep = data["hardware"], data["workload"], data.get("deployment") or {}
    try:
        return Calibration(
            model_config=data["model_config"], weight_dtype=data["weight_dtype"], kv_dtype=data["kv_dtype"],
            hardware=custom_hardware(int(hw["memory_bytes"]), float(hw["bandwidth_bytes_per_s"]),
                                     float(hw["flops_per_s"])),
            num_seqs=int(load["num_seqs"]), prompt_tokens=int(load["prompt_tokens"]),
            output_tokens=int(load["output_tokens"]), block_length=int(load["block_length"]),
            efficiency=Efficiency(float(data["achieved_bandwidth_fraction"]),
                                  float(data["achieved_flops_fraction"]), float(data["step_overhead_s"])),
            tpf=float(data["tpf"]),
            experts_touched_per_block=_optional_float(data["experts_touched_per_block"]),
            measured_decode_tokens_per_s=float(data["measured_decode_tokens_per_s"]),
            measured_forward_time_s=_optional_float(data.get("measured_forward_time_s")),
            deployment=Deployment(weight_dtype=data["weight_dtype"], kv_dtype=data["kv_dtype"], **dep),
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"calibrate: {e}") from e


def plan_bench_run(calibration: Calibration) -> Plan:
    """The plan of exactly the run the bench measured, using its fitted knobs."""
    workload = Workload(
        context_length=calibration.prompt_tokens + calibration.output_tokens,
        prompt_tokens=calibration.prompt_tokens, output_tokens=calibration.output_tokens,
        block_length=calibration.block_length, tpf=calibration.tpf, concurrency=calibration.num_seqs,
        experts_touched_per_block=calibration.experts_touched_per_block,
    )
    costs = CostInputs(gpu_hour_price=calibration.hardware.cloud_price_per_hour,
                       capex_per_gpu=calibration.hardware.capex_per_device)
    return make_plan(calibration.spec, calibration.hardware, calibration.deployment, workload,
                     calibration.efficiency, costs)


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
        formulas.append(f"forward time: predicted {fmt_time(decode.forward.t_forward)} vs measured "
                        f"{fmt_time(calibration.measured_forward_time_s)}")
    return CalibrationCheck(predicted, measured, decode.forward.t_forward, calibration.measured_forward_time_s,
                            tuple(formulas))


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


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
