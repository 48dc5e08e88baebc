"""transformers' own DiffusionGemma as the oracle: tiny random checkpoints written by its `save_pretrained`, and
its `generate` with every canvas recorded.

`write_hf_checkpoint` builds `DiffusionGemmaForBlockDiffusion` from a small text config, gives *every* weight and
buffer a seeded random value (norm weights, router scales, per-expert scales and the encoder's and decoder's
layer scalars around 1, each its own, so a swapped or skipped one shows), and saves it with its
`generation_config.json`. `recorded_generate` runs `model.generate` with its sampler wrapped so that each
denoising step's input canvas and accepted positions are kept; within `hf_kv_fp8`, its attention sees its K and
V rounded to e4m3 by plain arithmetic (the fp8 K/V oracle, reference/reference_kv_fp8.py). Needs transformers 5.x
(imported lazily); never imported by what serves.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from diffuserve.reference.reference_counter_draws import counter_draws
from diffuserve.reference.reference_kv_fp8 import e4m3_round

TINY_TEXT: dict[str, Any] = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=1,
    sliding_window=8,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=16,
    max_position_embeddings=512,
)
"""5 sliding + 1 full layer (the default 5 : 1 pattern), sliding window 8, full layers 1 KV head x 16."""
PUBLISHED_STYLE: dict[str, Any] = dict(eos_token_id=[1, 7], pad_token_id=0, max_new_tokens=40)
"""The published generation_config.json's kinds of fields; its denoising knobs left to the defaults (48 steps,
entropy bound 0.1, t 0.8 -> 0.4, stability 1, confidence 0.005)."""
FAST: dict[str, Any] = dict(
    PUBLISHED_STYLE,
    max_denoising_steps=12,
    sampler_config={"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 1.0},
    confidence_threshold=2.0,
)
"""Fewer steps, more tokens accepted per step, and a confidence the random model reaches; with canvases of 4
(`FAST_CANVAS`) its argmax canvas also settles, so canvases stop early."""
FAST_CANVAS = 4
TINY_VISION: dict[str, Any] = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8
)


def _randomize(model: Any, seed: int, init_std: float, logit_scale: float, feedback: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if not tensor.is_floating_point() or name.endswith(("inv_freq", "embed_scale")):
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            is_scale = name.endswith(("norm.weight", "layer_scalar", ".scale", "per_expert_scale"))
            tensor.copy_(1.0 + 0.3 * noise if is_scale else init_std * noise)
        model.model.decoder.norm.weight.mul_(logit_scale)  # the final norm scales the logits, nothing else
        model.model.decoder.self_conditioning.down_proj.weight.mul_(feedback)


def write_hf_checkpoint(
    out_dir: str | Path,
    text: dict[str, Any] | None = None,
    canvas_length: int = 16,
    seed: int = 0,
    init_std: float = 0.05,
    logit_scale: float = 8.0,
    feedback: float = 1.0,
    generation: dict[str, Any] | None = None,
) -> Path:
    """A transformers-written checkpoint of a tiny random DiffusionGemma (`TINY_TEXT` updated by `text`);
    `generation`: the generation_config.json fields (DiffusionGemmaGenerationConfig names)."""
    import transformers

    text_config = transformers.DiffusionGemmaTextConfig(**{**TINY_TEXT, **(text or {})})
    vision = transformers.Gemma4VisionConfig(**TINY_VISION)
    config = transformers.DiffusionGemmaConfig(
        text_config=text_config.to_dict(), vision_config=vision.to_dict(), canvas_length=canvas_length
    )
    if not text_config.num_experts:
        config._experts_implementation = "eager"  # the grouped_mm default cannot run 0 experts (torch.histc)
    model = transformers.DiffusionGemmaForBlockDiffusion(config).eval()
    _randomize(model, seed, init_std, logit_scale, feedback)
    # A deep copy: the config class pops `_cls_name` out of the caller's nested sampler_config dict.
    model.generation_config = transformers.DiffusionGemmaGenerationConfig(**copy.deepcopy(generation or {}))
    out = Path(out_dir)
    model.save_pretrained(out)
    return out


def load_hf_model(model_dir: str | Path, dtype: torch.dtype = torch.float32) -> Any:
    import transformers

    kwargs: dict[str, Any] = {}
    config = transformers.AutoConfig.from_pretrained(model_dir)
    if not config.text_config.num_experts:
        kwargs["experts_implementation"] = "eager"
    model = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir, dtype=dtype, **kwargs)
    return model.eval()


@dataclass
class GenerateRecord:
    """Per denoising step (all canvases in order): the canvas the step denoised and its accepted positions."""

    canvases: list[torch.Tensor] = field(default_factory=list)
    accepted: list[torch.Tensor] = field(default_factory=list)


def recorded_generate(model: Any, prompt: list[int], seed: int, **kwargs: Any) -> tuple[torch.Tensor, GenerateRecord]:
    """transformers' `generate` for one prompt, drawing by the engine's counter rule keyed by `seed`
    (reference_counter_draws) -> (sequences [1, L], the record). The sampler is transformers' own, its draws
    replaced and wrapped only to copy what it sees."""
    record = GenerateRecord()
    with counter_draws(model, [seed], len(prompt)):
        prepare = model._prepare_sampler

        def recording_sampler(generation_config: Any) -> Any:
            sampler = prepare(generation_config)

            class RecordingSampler(type(sampler)):  # type: ignore[misc]
                def accept_canvas(self, current_canvas, denoiser_canvas, logits, cur_step):
                    accepted = super().accept_canvas(current_canvas, denoiser_canvas, logits, cur_step)
                    record.canvases.append(current_canvas[0].clone())
                    record.accepted.append(self.accepted_token_mask[0].clone())
                    return accepted

            sampler.__class__ = RecordingSampler
            return sampler

        model._prepare_sampler = recording_sampler
        try:
            out = model.generate(torch.tensor([prompt]), **kwargs)
        finally:
            model._prepare_sampler = prepare
    return out.sequences, record


@contextmanager
def hf_kv_fp8() -> Iterator[None]:
    """Within it, every attention layer of transformers' DiffusionGemma attends over K and V rounded to e4m3 (after
    their norms and rotary, as the engine writes them into an fp8 cache): the oracle of `--kv-cache-dtype fp8`."""
    from unittest import mock

    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as modeling

    functions = modeling.ALL_ATTENTION_FUNCTIONS

    class Rounded:
        def get_interface(self, name: str, default: Any) -> Any:
            attend = functions.get_interface(name, default)

            def rounded(module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any) -> Any:
                return attend(module, q, e4m3_round(k), e4m3_round(v), *args, **kw)

            return rounded

    with mock.patch.object(modeling, "ALL_ATTENTION_FUNCTIONS", Rounded()):
        yield
