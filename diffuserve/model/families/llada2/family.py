"""The llada2 family's record. LLaDA2.0 and LLaDA2.1 share architecture name and config; 2.1 differs only in
decoding (decoder="edit")."""

from diffuserve.model.families.llada2.config import llada2_args_from_hf
from diffuserve.model.families.llada2.model import LLaDA2ForBlockDiffusion
from diffuserve.model.families.llada2.settings import SETTINGS
from diffuserve.model.families.llada2.weights import llada2_checkpoint_tensors, llada2_weight_target
from diffuserve.model.family import ModelFamily
from diffuserve.sampling_defaults import STEPS_CAPPED_BY_MAX_TOKENS

FAMILY = ModelFamily(
    "llada2",
    LLaDA2ForBlockDiffusion,
    llada2_args_from_hf,
    llada2_weight_target,
    llada2_checkpoint_tensors,
    special_tokens={"mask_token_id": "<|mask|>", "eos_token_id": "<|endoftext|>"},
    decoding_defaults={
        "decoder": "threshold",
        "threshold": 0.95,
        "temperature": 0.0,
        STEPS_CAPPED_BY_MAX_TOKENS: True,
    },
    settings=SETTINGS,
)
