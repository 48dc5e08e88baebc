"""The config.json keys the sdar family's parser reads or knows to be irrelevant (model/settings_check.py
reports every other one at load)."""

from diffuserve.model.known_settings import QWEN3_MOE, FamilySettings

SETTINGS = FamilySettings(
    QWEN3_MOE,
    frozenset(),
    "diffuserve decodes each block with its own decoders (SamplingParams: threshold, steps, ...) and per-token "
    "top-k routing",
)
