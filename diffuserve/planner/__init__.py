"""Capacity and cost planner for block-diffusion MoE models: pure Python, stdlib only, never imports torch.

spec, preset = load_model("Clover-35B-A3B")
plan = make_plan(spec, get_hardware("H200"), Deployment(), Workload(131072, 130048, 1024, 32),
                 Efficiency(), CostInputs(gpu_hour_price=3.5, capex_per_gpu=35_000), preset)
print("\\n".join(plan.explain()))
"""

from diffuserve.planner.hardware import HARDWARE_PRESETS, HardwareSpec, custom_hardware, get_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_presets import MODEL_PRESETS, load_model
from diffuserve.planner.model_spec import ModelSpec, spec_from_config
from diffuserve.planner.plan import Plan, make_plan

__all__ = [
    "HARDWARE_PRESETS",
    "MODEL_PRESETS",
    "CostInputs",
    "Deployment",
    "Efficiency",
    "HardwareSpec",
    "ModelSpec",
    "Plan",
    "Workload",
    "custom_hardware",
    "get_hardware",
    "load_model",
    "make_plan",
    "spec_from_config",
]
