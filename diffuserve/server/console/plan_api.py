"""`diffuserve plan` over HTTP: `POST /plan` runs the planner on the body's inputs, `GET /plan/presets` lists what
it can plan. The web console's planner page calls them; so can anyone.

The body becomes the command's own arguments: `diffuserve plan`'s defaults with the given fields set, planned by
the command's `build_plan`, so the answer's `plan` is the `--json` document of the same inputs, number for
number. The figures beside it (a device's memory, sequences that fit against the context) come from
`planner/figures.py`. A plan the planner refuses (a context past the model's maximum, a deployment that does not
fit) is a 400 carrying the planner's own message. Only presets and the served model can be planned: a client
never names a path on the server. Knows no formula.
"""

from __future__ import annotations

from dataclasses import asdict

from diffuserve.planner.build import build_plan
from diffuserve.planner.figures import device_memory, fit_curve, sequences_that_fit
from diffuserve.planner.hardware import HARDWARE_PRESETS
from diffuserve.planner.inputs import DECODERS, KV_BYTES, WEIGHT_BYTES
from diffuserve.planner.model_presets import MODEL_PRESETS
from diffuserve.planner.options import DEFAULT_HARDWARE, PlanOptions
from diffuserve.planner.report import plan_to_dict, render_text
from diffuserve.server.console.plan_models import FitPointOut, MemoryPartOut, PlanPresets, PlanRequest, PlanResponse
from diffuserve.server.errors import bad_request, from_value_error

DEFAULT_MODEL = "Clover-35B-A3B"
KV_CACHE_DTYPES = ["auto", *KV_BYTES]


class Planner:
    """Plans presets and the served model (`model_name`, whose config.json is in `model_dir`)."""

    def __init__(self, model_name: str, model_dir: str) -> None:
        self.model_name, self.model_dir = model_name, model_dir

    def presets(self) -> PlanPresets:
        return PlanPresets(
            models=list(MODEL_PRESETS),
            served_model=self.model_name,
            hardware=list(HARDWARE_PRESETS),
            weight_dtypes=list(WEIGHT_BYTES),
            kv_cache_dtypes=KV_CACHE_DTYPES,
            default_model=DEFAULT_MODEL,
            default_hardware=DEFAULT_HARDWARE,
        )

    def plan(self, body: PlanRequest) -> PlanResponse:
        try:
            plan = build_plan(self.arguments(body))
        except ValueError as e:
            raise from_value_error(e) from e
        return PlanResponse(
            plan=plan_to_dict(plan),
            summary=render_text(plan),
            sequences_that_fit=sequences_that_fit(plan),
            device_memory=[MemoryPartOut(**asdict(part)) for part in device_memory(plan)],
            fit_curve=[FitPointOut(**asdict(point)) for point in fit_curve(plan)],
        )

    def arguments(self, body: PlanRequest) -> PlanOptions:
        """The plan options of the body (the fields it gives; the defaults `diffuserve plan` has for the rest)."""
        weight_dtype = body.weight_dtype
        return PlanOptions(
            model=self._model(body.model),
            hardware=_choice("hardware", body.hardware, list(HARDWARE_PRESETS)),
            weight_dtype=None if weight_dtype is None else _choice("weight_dtype", weight_dtype, WEIGHT_BYTES),
            kv_cache_dtype=_choice("kv_cache_dtype", body.kv_cache_dtype, KV_CACHE_DTYPES),
            num_gpus=body.num_gpus,
            concurrency=body.concurrency,
            context_length=body.context_length,
            tensor_parallel_size=body.tensor_parallel_size,
            expert_parallel_size=body.expert_parallel_size,
            decoder=_choice("decoder", body.decoder, list(DECODERS)),
            verified_tpf=body.verified_tpf,
            acceptance_rate=body.acceptance_rate,
        )

    def _model(self, name: str) -> str:
        if name in MODEL_PRESETS:
            return name
        if name == self.model_name:
            return self.model_dir
        raise bad_request(
            f"model: {name!r} is neither a preset ({', '.join(MODEL_PRESETS)}) nor the served model "
            f"({self.model_name!r}); pick one of those",
            "model",
        )


def _choice(field: str, value: str, allowed: list[str] | dict[str, float]) -> str:
    if value not in allowed:
        raise bad_request(f"{field}: got {value!r}, must be one of {', '.join(allowed)}", field)
    return value
