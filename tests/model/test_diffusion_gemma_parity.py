"""diffusion_gemma: one forward's canvas logits == transformers' `DiffusionGemmaForBlockDiffusion` (fp32, 1e-4).

Checkpoints are written by transformers' own `save_pretrained` (every weight and buffer random, the encoder's and
decoder's layer scalars each their own); our loader reads them. The reference runs its encoder over the prompt
and its decoder over the canvas (with or without the previous step's self-conditioning logits); ours runs both
roles in one dense forward under the masks of diffusion_gemma_masks. Prompts shorter and longer than the sliding
window (8), the 5 : 1 layer pattern once and twice, MoE on and off (transformers' MoE-off is num_experts 0)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from diffuserve.model.families.diffusion_gemma.config import FULL, SLIDING, gemma_args
from diffuserve.model.families.diffusion_gemma.masks import dense_inputs
from diffuserve.model.loader import load_model
from diffuserve.model.shapes import window_group
from diffuserve.model.step_inputs import CanvasInputs, StepInputs
from diffuserve.reference.diffusion_gemma_hf import load_hf_model, write_hf_checkpoint

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf

ATOL = 1e-4
CANVAS = 16
CASES = {
    "5:1, MoE": {},
    "MoE off": dict(num_experts=0, top_k_experts=0),
    "12 layers (two 5:1 groups), GQA 4:1": dict(num_hidden_layers=12, num_key_value_heads=1),
    "own RoPE per kind": dict(
        rope_parameters={
            SLIDING: {"rope_type": "default", "rope_theta": 500.0},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 50_000.0},
        }
    ),
}


def _ours(model, args, prompt: torch.Tensor, canvas: torch.Tensor, sc_logits: torch.Tensor | None) -> torch.Tensor:
    ids = torch.cat([prompt, canvas], dim=1)  # [1, P + C]: committed rows, then the canvas
    positions = torch.arange(ids.shape[1])
    is_canvas = positions >= prompt.shape[1]
    attn = dense_inputs(gemma_args(args), positions, is_canvas)
    rows = is_canvas.nonzero().flatten()  # the canvas's rows of the flattened [1, P + C] batch
    soft = torch.zeros(CANVAS, args.hidden_size) if sc_logits is None else model.self_conditioning_input(sc_logits[0])
    windows = {window_group(model.sliding_window): attn.sliding}  # the group the model reads, whatever the mask
    step = StepInputs(attn.full, windows, canvas=CanvasInputs(rows, soft))
    hidden = model(ids, positions[None], step)
    return model.compute_logits(hidden[:, prompt.shape[1] :])


@pytest.mark.parametrize("case", list(CASES))
def test_canvas_logits_match_transformers(tmp_path, case):
    model_dir = write_hf_checkpoint(tmp_path / "m", CASES[case], canvas_length=CANVAS, seed=5)
    hf = load_hf_model(model_dir)
    args, ours = load_model(model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for prompt_len in (5, 20):  # window 8: inside it, and across it (the canvas sees only 7 of 20)
            prompt = torch.randint(0, args.vocab_size, (1, prompt_len), generator=generator)
            canvas = torch.randint(0, args.vocab_size, (1, CANVAS), generator=generator)
            previous = 3 * torch.randn(1, CANVAS, args.vocab_size, generator=generator)
            for sc_logits in (None, previous):
                expected = hf(input_ids=prompt, decoder_input_ids=canvas, self_conditioning_logits=sc_logits).logits
                got = _ours(ours, args, prompt, canvas, sc_logits)
                assert (got - expected).abs().max().item() < ATOL, (prompt_len, sc_logits is None)


def test_float64_is_the_same_arithmetic(tmp_path):
    """In float64 (transformers' eager experts) the two forwards agree to the last bits (measured: exactly, on
    this and on the 12-layer diffusiongemma-bench shape, where fp32 rounding grows ~2x per random layer to 6e-3):
    what differs in fp32 is rounding, not the computation."""
    import transformers

    model_dir = write_hf_checkpoint(tmp_path / "m", canvas_length=CANVAS, seed=5)
    hf = transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir, experts_implementation="eager")
    args, ours = load_model(model_dir)
    hf, ours = hf.eval().double(), ours.double()
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, args.vocab_size, (1, 20), generator=generator)
    canvas = torch.randint(0, args.vocab_size, (1, CANVAS), generator=generator)
    previous = 3 * torch.randn(1, CANVAS, args.vocab_size, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        expected = hf(input_ids=prompt, decoder_input_ids=canvas, self_conditioning_logits=previous).logits
        assert (_ours(ours, args, prompt, canvas, previous) - expected).abs().max().item() < 1e-12


def test_each_part_matters(tmp_path):
    """The comparison can fail: ours without the sliding window, without self-conditioning, or with the
    decoder's layer scalars on the encoder rows misses transformers' logits by far more than the tolerance."""
    model_dir = write_hf_checkpoint(tmp_path / "m", canvas_length=CANVAS, seed=5)
    hf = load_hf_model(model_dir)
    args, ours = load_model(model_dir)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, args.vocab_size, (1, 20), generator=generator)
    canvas = torch.randint(0, args.vocab_size, (1, CANVAS), generator=generator)
    previous = 3 * torch.randn(1, CANVAS, args.vocab_size, generator=generator)
    with torch.no_grad():
        expected = hf(input_ids=prompt, decoder_input_ids=canvas, self_conditioning_logits=previous).logits
        assert (_ours(ours, args, prompt, canvas, previous) - expected).abs().max().item() < ATOL
        no_sc = _ours(ours, args, prompt, canvas, None)
        unwindowed = args.replace(extra={"gemma": replace(gemma_args(args), sliding_window=10**6)})
        no_window = _ours(ours, unwindowed, prompt, canvas, previous)
        for layer in ours.model.layers:
            layer.encoder_layer_scalar.copy_(layer.layer_scalar)
        one_scalar = _ours(ours, args, prompt, canvas, previous)
    for wrong in (no_sc, no_window, one_scalar):
        assert (wrong - expected).abs().max().item() > 100 * ATOL


def test_transformers_checkpoint_names_all_load(tmp_path):
    """Every tensor of a transformers checkpoint is either loaded or one we mean to skip (vision tower)."""
    from diffuserve.model.families.diffusion_gemma.weights import diffusion_gemma_weight_target
    from diffuserve.model.loader import iter_checkpoint

    model_dir = write_hf_checkpoint(tmp_path / "m", canvas_length=CANVAS)
    args, _ = load_model(model_dir)
    skipped = [name for name, _ in iter_checkpoint(model_dir) if diffusion_gemma_weight_target(name, args) is None]
    assert skipped and all(
        name.startswith(("model.encoder.vision_tower.", "model.encoder.embed_vision.")) for name in skipped
    )


def test_our_writer_round_trips_through_transformers(tmp_path):
    """A checkpoint our writer produces (bench shapes) loads in transformers with the same logits: the name
    map is right both ways."""
    from diffuserve.reference.diffusion_gemma_checkpoint import (
        make_diffusion_gemma_config,
        write_diffusion_gemma_checkpoint,
    )

    model_dir = write_diffusion_gemma_checkpoint(tmp_path / "m", make_diffusion_gemma_config(), seed=7)
    hf = load_hf_model(model_dir)
    args, ours = load_model(model_dir)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, args.vocab_size, (1, 12), generator=generator)
    canvas = torch.randint(0, args.vocab_size, (1, CANVAS), generator=generator)
    with torch.no_grad():
        expected = hf(input_ids=prompt, decoder_input_ids=canvas).logits
        assert (_ours(ours, args, prompt, canvas, None) - expected).abs().max().item() < ATOL
