"""The sdar family's record: SDAR / SDAR-MoE and plain Qwen3 / Qwen3-MoE checkpoints (Qwen3 weight names)."""

from diffuserve.model.config import qwen3_args_from_hf
from diffuserve.model.families.sdar.model import SDARForBlockDiffusion
from diffuserve.model.families.sdar.settings import SETTINGS
from diffuserve.model.family import ModelFamily
from diffuserve.model.weight_names import qwen3_checkpoint_tensors, qwen3_weight_target

FAMILY = ModelFamily(
    "sdar", SDARForBlockDiffusion, qwen3_args_from_hf, qwen3_weight_target, qwen3_checkpoint_tensors, settings=SETTINGS
)
