"""The JSON-line schemas of `diffuserve bench` (plain dicts in JSON Schema's vocabulary) and a small validator
for the subset they use: type (one name or a list), required, properties, items, enum, minimum."""

from __future__ import annotations

from typing import Any

from diffuserve.engine.step_phases import PHASES

NUMBER = {"type": "number"}
OPT_NUMBER = {"type": ["number", "null"]}
COUNT = {"type": "integer", "minimum": 0}
DISTRIBUTION = {
    "type": "object",
    "required": ["mean", "p50", "p90", "p99", "max"],
    "properties": {k: OPT_NUMBER for k in ("mean", "p50", "p90", "p99", "max")},
}

ENVIRONMENT = {
    "type": "object",
    "required": ["git", "hardware", "python", "load_average_start", "load_average_end"],
    "properties": {
        "git": {
            "type": "object",
            "required": ["sha", "dirty"],
            "properties": {"sha": {"type": ["string", "null"]}, "dirty": {"type": ["boolean", "null"]}},
        },
        "hardware": {
            "type": "object",
            "required": ["device", "cpu", "logical_cpus", "memory_bytes"],
            "properties": {"memory_bytes": COUNT, "device": {"type": "string"}},
        },
        "threads": COUNT,
    },
}
MACHINE = {
    "type": "object",
    "required": ["matmul_flops_per_s", "bandwidth_bytes_per_s", "dtype"],
    "properties": {"matmul_flops_per_s": NUMBER, "bandwidth_bytes_per_s": NUMBER},
}
EXPERTS = {
    "type": ["object", "null"],
    "required": ["num_experts", "experts_touched_per_step", "experts_touched_per_block", "load_imbalance"],
}
GDN = {
    "type": ["object", "null"],
    "required": [
        "gdn_s_per_step",
        "gdn_floor_s_per_step",
        "gdn_bytes_per_step",
        "gdn_flops_per_step",
        "gdn_floor_fraction",
    ],
    "properties": {
        "gdn_s_per_step": {"type": "number", "minimum": 0},
        "gdn_floor_s_per_step": {"type": "number", "minimum": 0},
        "gdn_share_of_step": {"type": "number", "minimum": 0},
    },
}
RUN = {
    "type": "object",
    "required": [
        "num_requests",
        "generated_tokens",
        "wall_s",
        "tokens_per_s",
        "decode_tokens_per_s",
        "nfe",
        "tpf",
        "num_steps",
        "latency",
        "efficiency",
        "experts",
        "gdn",
    ],
    "properties": {
        "generated_tokens": COUNT,
        "nfe": COUNT,
        "tokens_per_s": NUMBER,
        "tpf": NUMBER,
        "latency": {
            "type": "object",
            "required": ["ttft_s", "e2e_s", "tpot_s"],
            "properties": {k: DISTRIBUTION for k in ("ttft_s", "e2e_s", "tpot_s")},
        },
        "efficiency": {
            "type": "object",
            "required": ["flops_per_s", "matmul_fraction", "bytes_per_s", "bandwidth_fraction", "overhead_fraction"],
        },
        "experts": EXPERTS,
        "gdn": GDN,
    },
}
CALIBRATION = {
    "type": "object",
    "required": [
        "schema_version",
        "model_config",
        "weight_dtype",
        "kv_dtype",
        "hardware",
        "workload",
        "achieved_bandwidth_fraction",
        "achieved_flops_fraction",
        "step_overhead_s",
        "tpf",
        "experts_touched_per_block",
        "measured_decode_tokens_per_s",
    ],
    "properties": {"schema_version": {"enum": [1]}, "achieved_flops_fraction": NUMBER, "step_overhead_s": NUMBER},
}
_HEADER = ["bench", "environment", "model", "dtype", "workload"]
_HEADER_PROPS = {
    "environment": ENVIRONMENT,
    "model": {"type": "object", "required": ["path", "name"]},
    "dtype": {"type": "string"},
}

THROUGHPUT = {
    "type": "object",
    "required": [*_HEADER, "machine", "results", "speedups", "peak_memory_bytes", "calibration"],
    "properties": {
        **_HEADER_PROPS,
        "bench": {"enum": ["throughput"]},
        "machine": MACHINE,
        "calibration": CALIBRATION,
        "results": {
            "type": "array",
            "items": {**RUN, "required": [*RUN["required"], "block_length", "concurrency", "mode"]},
        },
        "speedups": {"type": "array", "items": {"type": "object", "required": ["block_length", "speedup"]}},
        "peak_memory_bytes": COUNT,
    },
}
LATENCY = {
    "type": "object",
    "required": [*_HEADER, "weight_dtype", "machine", "batch_latency_s", "result", "peak_memory_bytes", "calibration"],
    "properties": {
        **_HEADER_PROPS,
        "bench": {"enum": ["latency"]},
        "weight_dtype": {"enum": ["fp32", "bf16", "fp16", "fp8", "int8", "int4"]},
        "machine": MACHINE,
        "result": RUN,
        "batch_latency_s": DISTRIBUTION,
        "calibration": CALIBRATION,
        "peak_memory_bytes": COUNT,
    },
}
VARIANT = {
    "type": "object",
    "required": ["generated_tokens", "wall_s", "tokens_per_s", "nfe", "tpf"],
    "properties": {"generated_tokens": COUNT, "nfe": COUNT, "tokens_per_s": NUMBER},
}
COMPARE = {
    "type": "object",
    "required": [*_HEADER, "results", "targets", "peak_memory_bytes"],
    "properties": {
        **_HEADER_PROPS,
        "bench": {"enum": ["compare"]},
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["block_length", "variants", "ratios", "identical_tokens"],
                "properties": {
                    "variants": {
                        "type": "object",
                        "properties": {
                            k: VARIANT
                            for k in (
                                "engine",
                                "engine-batched",
                                "attention-loop",
                                "baseline",
                                "reference",
                                "transformers-kv",
                                "separate-commit",
                                "ar",
                            )
                        },
                    },
                    "identical_tokens": {"type": ["boolean", "null"]},
                },
            },
        },
    },
}
SWEEP_SIDE = {
    "type": "object",
    "required": ["num_requests", "generated_tokens", "wall_s", "tokens_per_s", "ttft_s", "itl_s", "peak_memory_bytes"],
    "properties": {
        "generated_tokens": COUNT,
        "tokens_per_s": NUMBER,
        "ttft_s": DISTRIBUTION,
        "itl_s": DISTRIBUTION,
        "peak_memory_bytes": {"type": ["integer", "null"], "minimum": 0},
    },
}
SWEEP = {
    "type": "object",
    "required": [*_HEADER, "machine", "results", "targets", "profiles"],
    "properties": {
        **_HEADER_PROPS,
        "bench": {"enum": ["sweep"]},
        "machine": MACHINE,
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["reading", "workload", "concurrency", "peer", "engine", "peer_result", "ratio"],
                "properties": {
                    "workload": {"enum": ["best-case", "realistic"]},
                    "concurrency": COUNT,
                    "engine": {
                        **SWEEP_SIDE,
                        "required": [*SWEEP_SIDE["required"], "overhead_fraction", "phases_us_per_request_step"],
                        "properties": {
                            **SWEEP_SIDE["properties"],
                            "overhead_fraction": OPT_NUMBER,
                            "phases_us_per_request_step": {
                                "type": "object",
                                "required": list(PHASES),
                                "properties": {name: {"type": "number", "minimum": 0} for name in PHASES},
                            },
                        },
                    },
                    "peer_result": SWEEP_SIDE,
                    "ratio": OPT_NUMBER,
                    "same_tokens": {"type": ["boolean", "null"]},
                },
            },
        },
        "targets": {"type": "array", "items": {"type": "object", "required": ["what", "value", "target", "met"]}},
        "profiles": {"type": "object"},
    },
}
SERVE_POINT = {
    "type": "object",
    "required": [
        "load",
        "concurrency",
        "request_rate",
        "num_requests",
        "completed",
        "errors",
        "duration_s",
        "request_throughput",
        "output_tokens_per_s",
        "goodput_requests_per_s",
        "ttft_s",
        "tpot_s",
        "itl_chunk_s",
        "itl_token_s",
        "e2e_s",
        "tokens_per_chunk",
        "chunk_token_counts",
    ],
    "properties": {
        **{k: DISTRIBUTION for k in ("ttft_s", "tpot_s", "itl_chunk_s", "itl_token_s", "e2e_s")},
        "errors": COUNT,
        "completed": COUNT,
        "chunk_token_counts": {"enum": ["usage", "estimated"]},
    },
}
SERVE = {
    "type": "object",
    "required": ["bench", "environment", "server", "workload", "results"],
    "properties": {
        "bench": {"enum": ["serve"]},
        "environment": ENVIRONMENT,
        "server": {"type": "object", "required": ["base_url", "endpoint", "model"]},
        "results": {"type": "array", "items": SERVE_POINT},
    },
}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, name: str) -> bool:
    if name in ("number", "integer"):
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        return numeric and (name == "number" or isinstance(value, int))
    return isinstance(value, _TYPES[name])


def validate(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    """Every violation, each as "path: problem" (empty when `value` conforms)."""
    kinds = schema.get("type")
    if kinds is not None and not any(_is(value, k) for k in ([kinds] if isinstance(kinds, str) else kinds)):
        return [f"{path}: expected {kinds}, got {type(value).__name__}"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        errors.append(f"{path}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        errors += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errors += validate(value[key], sub, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    return errors
