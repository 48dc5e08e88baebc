"""The diffusion_gemma family's record: DiffusionGemma-26B-A4B (transformers' `DiffusionGemmaForBlockDiffusion`);
see model.py."""

from diffuserve.model.families.diffusion_gemma.config import (
    cache_layout,
    diffusion_gemma_args_from_hf,
    generation_defaults,
)
from diffuserve.model.families.diffusion_gemma.model import DiffusionGemmaForBlockDiffusion
from diffuserve.model.families.diffusion_gemma.settings import SETTINGS
from diffuserve.model.families.diffusion_gemma.weights import (
    diffusion_gemma_checkpoint_tensors,
    diffusion_gemma_weight_target,
)
from diffuserve.model.family import ModelFamily

FAMILY = ModelFamily(
    "diffusion_gemma",
    DiffusionGemmaForBlockDiffusion,
    diffusion_gemma_args_from_hf,
    diffusion_gemma_weight_target,
    diffusion_gemma_checkpoint_tensors,
    cache_layout=cache_layout,
    generation_defaults=generation_defaults,
    tensor_parallel=False,  # its attention and experts have no tensor-parallel packing yet
    settings=SETTINGS,
)
