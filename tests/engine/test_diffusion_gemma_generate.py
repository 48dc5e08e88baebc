"""Standalone DiffusionGemma generation == transformers' `generate`, draw for draw: the same canvas at every
denoising step, the same accepted positions, the same final tokens (fp32, tiny random checkpoints written by
transformers). transformers runs each request alone, drawing by the engine's counter rule keyed by the request's
seed (reference_counter_draws, in Python integers); ours runs the requests batched, each drawing by its own seed
(renoise_draws, in int64 tensors), through the paged forward (sliding layers on a ring of
W - 1 + C slots; prompts longer than the ring). Mutating the acceptance rule or the temperature schedule breaks
the match.

The test models' self-conditioning is damped (`feedback` 0.1): with full-strength random weights the
previous-step -> next-step loop multiplies any rounding difference by ~7 per step (measured), so two correct
fp32 implementations part after a few steps; at 0.1 the loop contracts and the logits stay within ~3e-4."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from diffuserve.decoding import renoise_steps as decoding
from diffuserve.decoding.renoise_steps import CanvasKnobs
from diffuserve.model.families.diffusion_gemma.config import renoise_defaults
from diffuserve.model.loader import load_model, read_model_config
from diffuserve.reference.diffusion_gemma_generate import GemmaOutput, GemmaRequest, generate
from diffuserve.reference.diffusion_gemma_hf import (
    FAST,
    FAST_CANVAS,
    PUBLISHED_STYLE,
    GenerateRecord,
    load_hf_model,
    recorded_generate,
    write_hf_checkpoint,
)
from diffuserve.renoise_knobs import RenoiseDefaults

pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


def _checkpoint(tmp_path_factory, name: str, generation: dict, canvas_length: int = 16, **text):
    out = tmp_path_factory.mktemp(name)
    model_dir = write_hf_checkpoint(out, text, canvas_length, seed=3, feedback=0.1, generation=generation)
    _, ours = load_model(model_dir)
    return load_hf_model(model_dir), ours, renoise_defaults(read_model_config(model_dir)[1])


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "published", PUBLISHED_STYLE)


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    return _checkpoint(tmp_path_factory, "fast", FAST, FAST_CANVAS)


def _hf_overrides(knobs: RenoiseDefaults, file_knobs: RenoiseDefaults) -> dict:
    """generate() kwargs that turn the checkpoint's generation config into `knobs`."""
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    names = ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold", "max_new_tokens")
    kwargs = {n: getattr(knobs, n) for n in names if getattr(knobs, n) != getattr(file_knobs, n)}
    if knobs.entropy_bound != file_knobs.entropy_bound:
        kwargs["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=knobs.entropy_bound)
    return kwargs


def _differences(expected: tuple[torch.Tensor, GenerateRecord], got: GemmaOutput) -> list[str]:
    """What differs between transformers' run and ours (empty: identical)."""
    sequences, record = expected
    found = []
    if len(record.canvases) != len(got.canvases):
        found.append(f"{len(record.canvases)} steps vs {len(got.canvases)}")
    for step, pair in enumerate(zip(record.canvases, got.canvases, record.accepted, got.accepted)):
        if not (torch.equal(pair[0], pair[1]) and torch.equal(pair[2], pair[3])):
            found.append(f"step {step}: canvas or accepted positions differ")
            break
    if sequences[0].tolist() != got.tokens:
        found.append("final tokens differ")
    return found


def test_one_request_matches_transformers_generate(published):
    """Default denoising knobs, a 40-token prompt (window 8, ring 23): every step and the tokens identical."""
    hf, ours, knobs = published
    request = GemmaRequest(list(range(2, 42)), seed=2, knobs=knobs)
    expected = recorded_generate(hf, request.prompt, request.seed)
    got = generate(ours, [request])[0]
    assert _differences(expected, got) == []
    # The second canvas committed and denoised after it (ring overwritten); no canvas stops early at 0.005.
    assert len(got.canvases) >= 2 * knobs.max_denoising_steps and len(got.canvases) % knobs.max_denoising_steps == 0


def test_batched_requests_each_match_their_own_transformers_run(fast):
    """Five requests in one batch (prompts 3 to 40 tokens, own seeds, own knobs; canvases of 4, ring 11) ==
    five transformers runs."""
    hf, ours, knobs = fast
    requests = [
        GemmaRequest([5, 6, 9], 11, knobs),
        GemmaRequest(list(range(10, 19)), 12, replace(knobs, stability_threshold=2)),
        GemmaRequest(list(range(30, 55)), 13, knobs),
        GemmaRequest(list(range(40, 80)), 14, replace(knobs, t_min=0.2, t_max=1.0, max_denoising_steps=9)),
        GemmaRequest(
            list(range(40, 80)), 15, replace(knobs, entropy_bound=0.3, stability_threshold=0, max_new_tokens=20)
        ),
    ]
    outputs = generate(ours, requests)
    for request, got in zip(requests, outputs):
        expected = recorded_generate(hf, request.prompt, request.seed, **_hf_overrides(request.knobs, knobs))
        assert _differences(expected, got) == [], request
    steps = [len(o.canvases) for o in outputs]
    canvases = [(len(o.tokens) - len(r.prompt)) // FAST_CANVAS for r, o in zip(requests, outputs)]
    # What the comparison covered: early stops (fewer steps than canvases x max steps) and an EOS-ended request.
    assert any(s < c * r.knobs.max_denoising_steps for s, c, r in zip(steps, canvases, requests))
    assert any(c < -(-r.knobs.max_new_tokens // FAST_CANVAS) for c, r in zip(canvases, requests))


def test_a_model_without_experts_matches(tmp_path_factory):
    hf, ours, knobs = _checkpoint(tmp_path_factory, "dense", FAST, FAST_CANVAS, num_experts=0, top_k_experts=0)
    request = GemmaRequest(list(range(3, 23)), 5, knobs)
    assert _differences(recorded_generate(hf, request.prompt, request.seed), generate(ours, [request])[0]) == []


def _accept_including_the_largest(entropy: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    ordered, order = torch.sort(entropy, dim=-1)
    chosen = torch.cumsum(ordered, dim=-1) <= bound[:, None]  # mutation: the sum keeps its largest term
    return torch.scatter(torch.zeros_like(chosen), -1, order, chosen)


def _temperature_rising(steps: torch.Tensor, knobs: CanvasKnobs) -> torch.Tensor:
    done = steps + 1  # mutation: steps taken instead of steps left
    return knobs.t_min + (knobs.t_span * (done / knobs.max_steps))


@pytest.mark.parametrize(
    ("name", "mutant"),
    [("entropy_bound_accept", _accept_including_the_largest), ("step_temperature", _temperature_rising)],
)
def test_mutations_break_the_match(fast, monkeypatch, name, mutant):
    hf, ours, knobs = fast
    request = GemmaRequest([5, 6, 9], 11, knobs)
    expected = recorded_generate(hf, request.prompt, request.seed)
    monkeypatch.setattr(decoding, name, mutant)
    assert _differences(expected, generate(ours, [request])[0]) != []
