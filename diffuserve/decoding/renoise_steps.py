"""Renoise decoding (uniform-noise diffusion over a canvas, the rule DiffusionGemma was trained for), as pure
functions over a batch of B canvases of C positions (tensors [B, C, ...]).

A canvas starts as C uniformly random tokens. Each step, from the step's logits [B, C, V]:

    1. temperature   linear in the steps left: t = t_min + (t_max - t_min) * (N - s) / N at step s = 0..N-1
                     (so t_max at the first step, t_min + (t_max - t_min) / N at the last), N = max_denoising_steps
    2. sample        every position draws a token from softmax(logits / t)
    3. accept        positions in ascending entropy (of softmax(logits / t)) while the sum of the entropies
                     accepted so far, *without* the largest of them, stays <= entropy_bound: the first
                     (lowest-entropy) position is always accepted. Accepted positions take the drawn token,
                     the others keep the canvas's
    4. renoise       every position not accepted gets a fresh uniform token
    5. stop          when the argmax canvas equals those of the previous `stability_threshold` steps and the
                     mean entropy is below `confidence_threshold`, or after N steps; the canvas's tokens are
                     then the last step's argmax (not the sampled canvas)

Every canvas has its own step and knobs (`CanvasKnobs`, one tensor row each). The random numbers are the
counter-based draws of renoise_draws (keyed by the canvas's seed, start, step and position), so a canvas decodes
the same whatever else is in the batch. The next step's self-conditioning input is the model's soft embedding of
this step's tempered logits (the model computes it). The arithmetic follows transformers'
`LinearTemperatureScheduleLogitsProcessor`, `EntropyBoundSampler` and `StableAndConfidentStoppingCriteria`
(generation_diffusion_gemma.py) operation by operation, fp32 included, row by row. Knows nothing of models,
requests or caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.decoding.renoise_draws import INITIAL, RENOISE, SAMPLE, DrawKeys, draw_bits, sample, uniform_tokens
from diffuserve.renoise_knobs import RenoiseDefaults


@dataclass(frozen=True)
class CanvasKnobs:
    """The knobs of a batch of B canvases, [B] each: the temperature schedule's, the acceptance bound and the
    stop rule's."""

    max_steps: torch.Tensor
    """int32."""
    t_min: torch.Tensor
    """fp32."""
    t_span: torch.Tensor
    """fp32: t_max - t_min (computed in double, as the reference's Python floats are, then rounded)."""
    entropy_bound: torch.Tensor
    """fp32."""
    confidence: torch.Tensor
    """fp32: confidence_threshold."""
    stability: torch.Tensor
    """long: stability_threshold."""

    @staticmethod
    def of(knobs: list[RenoiseDefaults], device: torch.device | None = None) -> CanvasKnobs:
        floats = torch.tensor(
            [[k.t_min, k.t_max - k.t_min, k.entropy_bound, k.confidence_threshold] for k in knobs],
            dtype=torch.float32,
            device=device,
        ).T  # [4, B]
        ints = torch.tensor([[k.max_denoising_steps, k.stability_threshold] for k in knobs], device=device).T
        return CanvasKnobs(ints[0].to(torch.int32), floats[0], floats[1], floats[2], floats[3], ints[1])


@dataclass(frozen=True)
class DenoiseStep:
    """What one step decided for a batch of canvases."""

    canvas: torch.Tensor
    """[B, C] long: the next step's input (accepted draws, the kept tokens, renoised positions)."""
    argmax: torch.Tensor
    """[B, C] long: the argmax of the step's logits: the canvas's tokens if it stops here."""
    logits: torch.Tensor
    """[B, C, V] fp32: the tempered logits, the source of the next step's self-conditioning."""
    accepted: torch.Tensor
    """[B, C] bool."""
    entropy: torch.Tensor
    """[B, C] fp32 (nats) of the tempered distribution."""


def initial_canvas(keys: DrawKeys, length: int, vocab_size: int) -> torch.Tensor:
    """[B, length] uniform random token ids: the canvases' first inputs (keys' steps are 0)."""
    return uniform_tokens(draw_bits(keys, INITIAL, length), vocab_size)


def step_temperature(steps: torch.Tensor, knobs: CanvasKnobs) -> torch.Tensor:
    """steps [B] int32 (0-based) -> [B] fp32 temperatures, in fp32 tensors as the reference computes them."""
    remaining = knobs.max_steps - steps
    return knobs.t_min + (knobs.t_span * (remaining / knobs.max_steps))


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> entropy [...] of softmax(logits): -sum p log p, as `torch.distributions.Categorical`
    computes it (normalised logits, clamped at the dtype's minimum, times the softmax of the normalised logits).
    The clamp and product run in place: two [..., V] temporaries, not four."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalized, dim=-1)
    return -normalized.clamp_(min=torch.finfo(logits.dtype).min).mul_(probs).sum(-1)


def entropy_bound_accept(entropy: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """entropy [B, C], bound [B] -> [B, C] bool: the lowest-entropy positions whose entropy sum, less its largest
    term (the running maximum of an ascending sort is the current term), is at most the canvas's bound."""
    ordered, order = torch.sort(entropy, dim=-1)
    chosen = torch.cumsum(ordered, dim=-1) - ordered <= bound[:, None]
    return torch.scatter(torch.zeros_like(chosen), -1, order, chosen)


def denoise_step(logits: torch.Tensor, knobs: CanvasKnobs, keys: DrawKeys) -> DenoiseStep:
    """One step for a batch: raw logits [B, C, V] fp32 (divided by the temperatures in place: the tempered
    logits are that tensor) at the keys' steps -> DenoiseStep (the module docstring's 1-4: an accepted position
    takes its draw, every other a renoise token, so the step's input canvas is not needed)."""
    tempered = logits.div_(step_temperature(keys.steps.to(torch.int32), knobs)[:, None, None])
    drawn = sample(torch.softmax(tempered, dim=-1, dtype=torch.float32), draw_bits(keys, SAMPLE, logits.shape[1]))
    entropy = token_entropy(tempered)
    accepted = entropy_bound_accept(entropy, knobs.entropy_bound)
    noise = uniform_tokens(draw_bits(keys, RENOISE, logits.shape[1]), logits.shape[-1])
    return DenoiseStep(torch.where(accepted, drawn, noise), tempered.argmax(dim=-1), tempered, accepted, entropy)


def stop_rule(
    result: DenoiseStep, previous: torch.Tensor, runs: torch.Tensor, knobs: CanvasKnobs
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 5 without the step cap. previous [B, C]: each canvas's argmax of its previous step (-1 before any);
    runs [B] long: how many steps in a row ended on `previous` (0 before any) -> (stop [B] bool, the runs
    counting this step). Stable = the last stability_threshold + 1 argmax canvases are equal (the reference's
    history of the last S canvases all equal to this one: a run of S + 1; S = 0 is always stable)."""
    same = (previous == result.argmax).all(dim=-1)
    runs = torch.where(same, runs + 1, torch.ones_like(runs))
    confident = result.entropy.mean(dim=-1) < knobs.confidence
    return (runs > knobs.stability) & confident, runs
