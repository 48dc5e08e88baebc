"""Calibration: the one schema of the `"calibration"` object that `diffuserve bench` writes into its JSON line
(diffuserve/bench/calibration.py builds one and calls `to_json`) and `diffuserve plan --calibrate` reads
(diffuserve/planner/calibrate.py calls `from_json`).

Owns the field names, which are required, their validation (every missing key named by its dotted path) and
the planner's view of them (HardwareSpec, Efficiency, Deployment, ModelSpec). Pure Python, no torch: the bench
imports it, never the other way round. Knows nothing of how the bench measures; docs/planning/calibration.md
says what each key means.

    {"calibration": {
        "schema_version": 1,
        "model_config": {...config.json of the model the bench ran...},
        "weight_dtype": "fp32", "kv_dtype": "fp32",
        "hardware": {"name": "...", "memory_bytes": ..., "bandwidth_bytes_per_s": ..., "flops_per_s": ...},
        "workload": {"num_seqs": 8, "prompt_tokens": 256, "output_tokens": 256, "block_length": 32},
        "achieved_bandwidth_fraction": 0.6, "achieved_flops_fraction": 0.3, "step_overhead_s": 0.004,
        "tpf": 2.4, "experts_touched_per_block": 9.5,       (null: uniform routing is assumed)
        "measured_decode_tokens_per_s": 410.0,
        "measured_forward_time_s": 0.047,                                   (optional)
        "deployment": {"tensor_parallel_size": 1, "max_num_seqs": 64, "max_num_batched_tokens": 4096},  (optional)
        "fit": {"num_decode_steps": 120, "rms_relative_error": 0.05, ...}   (optional, the bench's fit report)
    }}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diffuserve.planner.hardware import HardwareSpec, custom_hardware
from diffuserve.planner.inputs import Deployment, Efficiency
from diffuserve.planner.model_spec import ModelSpec, spec_from_config

SCHEMA_VERSION = 1
REQUIRED_KEYS = (
    "model_config",
    "weight_dtype",
    "kv_dtype",
    "hardware.memory_bytes",
    "hardware.bandwidth_bytes_per_s",
    "hardware.flops_per_s",
    "workload.num_seqs",
    "workload.prompt_tokens",
    "workload.output_tokens",
    "workload.block_length",
    "achieved_bandwidth_fraction",
    "achieved_flops_fraction",
    "step_overhead_s",
    "tpf",
    "experts_touched_per_block",
    "measured_decode_tokens_per_s",
)
"""Dotted paths inside the "calibration" object."""
NULLABLE_KEYS = ("experts_touched_per_block",)
"""Keys that must be present but may be null (a dense model, or a bench that did not count experts)."""


@dataclass(frozen=True)
class Calibration:
    """One bench run: what ran (model, dtypes, hardware, workload), the fitted knobs, and what it measured.
    Field names are the JSON keys (`hardware_name` .. `hardware_flops_per_s` are the "hardware" object's,
    `num_seqs` .. `block_length` the "workload" object's)."""

    model_config: dict[str, Any]
    weight_dtype: str
    kv_dtype: str
    hardware_memory_bytes: int
    hardware_bandwidth_bytes_per_s: float
    hardware_flops_per_s: float
    num_seqs: int
    prompt_tokens: int
    output_tokens: int
    block_length: int
    achieved_bandwidth_fraction: float
    achieved_flops_fraction: float
    step_overhead_s: float
    tpf: float
    experts_touched_per_block: float | None
    measured_decode_tokens_per_s: float
    measured_forward_time_s: float | None = None
    deployment_fields: dict[str, int] = field(default_factory=dict)
    """The "deployment" object: Deployment field names (tensor_parallel_size, max_num_seqs, ...)."""
    fit: dict[str, Any] = field(default_factory=dict)
    """The bench's report on its fit (samples, error, runs used); the planner does not read it."""
    hardware_name: str = "this machine (measured)"

    def __post_init__(self) -> None:
        # Builds the planner's views once so that a bad value fails at parse time, naming its field.
        _ = (self.hardware, self.efficiency, self.deployment)

    @property
    def hardware(self) -> HardwareSpec:
        return custom_hardware(
            self.hardware_memory_bytes, self.hardware_bandwidth_bytes_per_s, self.hardware_flops_per_s
        )

    @property
    def efficiency(self) -> Efficiency:
        return Efficiency(self.achieved_bandwidth_fraction, self.achieved_flops_fraction, self.step_overhead_s)

    @property
    def deployment(self) -> Deployment:
        return Deployment(weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype, **self.deployment_fields)

    @property
    def spec(self) -> ModelSpec:
        return spec_from_config(self.model_config, "bench model")

    def to_json(self) -> dict[str, Any]:
        """The "calibration" object, schema_version included (a fresh dict: callers may add to "fit")."""
        data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "model_config": self.model_config,
            "weight_dtype": self.weight_dtype,
            "kv_dtype": self.kv_dtype,
            "hardware": {
                "name": self.hardware_name,
                "memory_bytes": self.hardware_memory_bytes,
                "bandwidth_bytes_per_s": self.hardware_bandwidth_bytes_per_s,
                "flops_per_s": self.hardware_flops_per_s,
            },
            "workload": {
                "num_seqs": self.num_seqs,
                "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens,
                "block_length": self.block_length,
            },
            "achieved_bandwidth_fraction": self.achieved_bandwidth_fraction,
            "achieved_flops_fraction": self.achieved_flops_fraction,
            "step_overhead_s": self.step_overhead_s,
            "tpf": self.tpf,
            "experts_touched_per_block": self.experts_touched_per_block,
            "measured_decode_tokens_per_s": self.measured_decode_tokens_per_s,
            "measured_forward_time_s": self.measured_forward_time_s,
            "deployment": dict(self.deployment_fields),
            "fit": dict(self.fit),
        }
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        """Validates a "calibration" object; ValueError names every missing key, or the bad value."""
        missing = missing_keys(data)
        if missing:
            raise ValueError(
                f"calibrate: missing key(s) {', '.join('calibration.' + key for key in missing)}; "
                "see docs/planning/calibration.md for the contract"
            )
        version = data.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"calibrate: schema_version {version} is not supported; this planner reads {SCHEMA_VERSION}"
            )
        hw, load = data["hardware"], data["workload"]
        try:
            return cls(
                model_config=data["model_config"],
                weight_dtype=data["weight_dtype"],
                kv_dtype=data["kv_dtype"],
                hardware_memory_bytes=int(hw["memory_bytes"]),
                hardware_bandwidth_bytes_per_s=float(hw["bandwidth_bytes_per_s"]),
                hardware_flops_per_s=float(hw["flops_per_s"]),
                num_seqs=int(load["num_seqs"]),
                prompt_tokens=int(load["prompt_tokens"]),
                output_tokens=int(load["output_tokens"]),
                block_length=int(load["block_length"]),
                achieved_bandwidth_fraction=float(data["achieved_bandwidth_fraction"]),
                achieved_flops_fraction=float(data["achieved_flops_fraction"]),
                step_overhead_s=float(data["step_overhead_s"]),
                tpf=float(data["tpf"]),
                experts_touched_per_block=_optional_float(data["experts_touched_per_block"]),
                measured_decode_tokens_per_s=float(data["measured_decode_tokens_per_s"]),
                measured_forward_time_s=_optional_float(data.get("measured_forward_time_s")),
                deployment_fields=dict(data.get("deployment") or {}),
                fit=dict(data.get("fit") or {}),
                hardware_name=str(hw.get("name") or "this machine (measured)"),
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"calibrate: {e}") from e


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


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class CalibrationCheck:
    """The planner's prediction of a bench run beside what the run measured (planner/calibrate.py makes one)."""

    predicted_tokens_per_s: float
    measured_tokens_per_s: float
    predicted_forward_s: float
    measured_forward_s: float | None
    formulas: tuple[str, ...]

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted_tokens_per_s - self.measured_tokens_per_s) / self.measured_tokens_per_s
