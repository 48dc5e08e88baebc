"""Renoise decoding (uniform-noise diffusion over a canvas, the rule DiffusionGemma was trained for), as pure
functions over tensors.

One canvas of C positions starts as C uniformly random tokens. Each step, from the step's logits [C, V]:

    1. temperature   linear in the steps left: t = t_min + (t_max - t_min) * (N - s) / N at step s = 0..N-1
                     (so t_max at the first step, t_min + (t_max - t_min) / N at the last), N = max_denoising_steps
    2. sample        every position draws a token from softmax(logits / t)            (the request's generator)
    3. accept        positions in ascending entropy (of softmax(logits / t)) while the sum of the entropies
                     accepted so far, *without* the largest of them, stays <= entropy_bound: the first
                     (lowest-entropy) position is always accepted. Accepted positions take the drawn token,
                     the others keep the canvas's
    4. renoise       every position not accepted gets a fresh uniform token            (the request's generator)
    5. stop          when the argmax canvas equals those of the previous `stability_threshold` steps and the
                     mean entropy is below `confidence_threshold`, or after N steps; the canvas's tokens are
                     then the last step's argmax (not the sampled canvas)

The next step's self-conditioning input is the model's soft embedding of this step's tempered logits (the model
computes it: `self_conditioning_input`). Random draws happen in transformers' order (initial canvas; then per step the
sample, then the renoise tokens), so one generator per request reproduces transformers' `generate` for that
request. The arithmetic follows transformers' `LinearTemperatureScheduleLogitsProcessor`, `EntropyBoundSampler`
and `StableAndConfidentStoppingCriteria` (generation_diffusion_gemma.py) operation by operation, fp32 included.
Knows nothing of models, requests or caches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffuserve.decoding.renoise_knobs import RenoiseDefaults


@dataclass(frozen=True)
class DenoiseStep:
    """What one step decided for one canvas."""

    canvas: torch.Tensor
    """[C] long: the next step's input (accepted draws, the kept tokens, renoised positions)."""
    argmax: torch.Tensor
    """[C] long: the argmax of the step's logits: the canvas's tokens if it stops here."""
    logits: torch.Tensor
    """[C, V] fp32: the tempered logits, the source of the next step's self-conditioning."""
    accepted: torch.Tensor
    """[C] bool."""
    entropy: torch.Tensor
    """[C] fp32 (nats) of the tempered distribution."""


def random_canvas(length: int, vocab_size: int, generator: torch.Generator | None) -> torch.Tensor:
    """[length] uniform random token ids (the initial canvas, and the renoise draws), on the generator's device."""
    device = generator.device if generator is not None else None
    return torch.randint(0, vocab_size, (1, length), generator=generator, device=device)[0]


def step_temperature(step: int, knobs: RenoiseDefaults) -> torch.Tensor:
    """0-dim fp32 temperature of step `step` (0-based); computed in fp32 tensors as the reference does."""
    remaining = torch.tensor(knobs.max_denoising_steps - step, dtype=torch.int32)
    return knobs.t_min + ((knobs.t_max - knobs.t_min) * (remaining / knobs.max_denoising_steps))


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> entropy [...] of softmax(logits): -sum p log p, as `torch.distributions.Categorical`
    computes it (normalised logits, clamped at the dtype's minimum, times the softmax of the normalised logits)."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = torch.softmax(normalized, dim=-1)
    return -(torch.clamp(normalized, min=torch.finfo(logits.dtype).min) * probs).sum(-1)


def entropy_bound_accept(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """entropy [..., C] -> [..., C] bool: the lowest-entropy positions whose entropy sum, less its largest term
    (the running maximum of an ascending sort is the current term), is at most `bound`."""
    ordered, order = torch.sort(entropy, dim=-1)
    chosen = torch.cumsum(ordered, dim=-1) - ordered <= bound
    return torch.scatter(torch.zeros_like(chosen), -1, order, chosen)


def renoise(canvas: torch.Tensor, accepted: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """[C]: `canvas` where accepted, `noise` elsewhere."""
    return torch.where(accepted, canvas, noise)


def denoise_step(
    logits: torch.Tensor, canvas: torch.Tensor, step: int, knobs: RenoiseDefaults, generator: torch.Generator | None
) -> DenoiseStep:
    """One step for one canvas: raw logits [C, V] fp32 of `canvas` [C] at step `step` -> DenoiseStep (the
    module docstring's 1-4; draws: C samples, then C renoise tokens)."""
    tempered = logits / step_temperature(step, knobs)
    probs = torch.softmax(tempered, dim=-1, dtype=torch.float32)
    drawn = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)  # [C]
    entropy = token_entropy(tempered)
    accepted = entropy_bound_accept(entropy, knobs.entropy_bound)
    kept = torch.where(accepted, drawn, canvas)
    noise = random_canvas(canvas.shape[0], logits.shape[-1], generator).to(canvas.device)
    return DenoiseStep(renoise(kept, accepted, noise), tempered.argmax(dim=-1), tempered, accepted, entropy)


def empty_history(knobs: RenoiseDefaults, length: int, device: torch.device | None = None) -> torch.Tensor:
    """[S, C] long of -1: no argmax canvas seen yet (S = stability_threshold)."""
    return torch.full((knobs.stability_threshold, length), -1, dtype=torch.long, device=device)


def should_stop(history: torch.Tensor, result: DenoiseStep, knobs: RenoiseDefaults) -> tuple[bool, torch.Tensor]:
    """Step 5 without the step cap -> (stop now, the history with this step's argmax appended)."""
    stable = bool((history == result.argmax[None, :]).all())  # vacuously true when S = 0
    if history.shape[0]:
        history = torch.cat([history[1:], result.argmax[None, :]])
    confident = bool(result.entropy.mean() < knobs.confidence_threshold)
    return stable and confident, history
