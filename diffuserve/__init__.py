"""diffuserve: serve block-diffusion Mixture-of-Experts language models, exactly and fast."""

from diffuserve.config import EngineConfig
from diffuserve.engine.llm import LLM
from diffuserve.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "EngineConfig", "SamplingParams", "__version__"]
