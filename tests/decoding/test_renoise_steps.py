"""DiffusionGemma's renoise decoding functions, by hand, over a batch of canvases: the temperature schedule,
entropies, the entropy-bound acceptance (each canvas its own bound), the stable-and-confident rule (each canvas its
own stability threshold) and what a step draws (its samples, then the noise, by the counter rule)."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from diffuserve.decoding.renoise_draws import RENOISE, SAMPLE, DrawKeys, draw_bits, sample, uniform_tokens
from diffuserve.decoding.renoise_steps import (
    CanvasKnobs,
    DenoiseStep,
    denoise_step,
    entropy_bound_accept,
    step_temperature,
    stop_rule,
    token_entropy,
)
from diffuserve.renoise_knobs import RenoiseDefaults

KNOBS = RenoiseDefaults()  # 48 steps, t 0.8 -> 0.4, bound 0.1, stability 1, confidence 0.005


def _steps(*steps: int) -> torch.Tensor:
    return torch.tensor(steps, dtype=torch.int32)


def test_temperature_is_linear_in_the_steps_left():
    """Step 0 (48 left): 0.8; step 47 (1 left): 0.4 + 0.4 / 48 = 0.408333 (never t_min itself); fp32; a canvas
    of 12 steps at step 6 beside them: 0.6."""
    knobs = CanvasKnobs.of([KNOBS, KNOBS, KNOBS, replace(KNOBS, max_denoising_steps=12)])
    t = step_temperature(_steps(0, 47, 24, 6), knobs)
    assert t.dtype == torch.float32
    assert t[0].item() == torch.tensor(0.8).item()
    assert math.isclose(t[1].item(), 0.4 + 0.4 / 48, rel_tol=1e-6)
    assert math.isclose(t[2].item(), 0.6, rel_tol=1e-6) and math.isclose(t[3].item(), 0.6, rel_tol=1e-6)


def test_entropy_by_hand():
    """Uniform over 4: ln 4; probabilities (0.5, 0.5, 0, ...): ln 2; a -inf logit contributes nothing."""
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, float("-inf"), float("-inf")]])
    assert torch.allclose(token_entropy(logits), torch.tensor([math.log(4), math.log(2)]))


def test_entropy_bound_accepts_while_the_sum_less_its_largest_term_fits():
    """Entropies (0.5, 0.01, 0.2, 0.05): ascending 0.01, 0.05, 0.2, 0.5; sums less the current term 0, 0.01,
    0.06, 0.26 -> bound 0.1 accepts the three lowest (positions 1, 3, 2); each canvas its own bound."""
    entropy = torch.tensor([0.5, 0.01, 0.2, 0.05]).expand(3, 4)
    accepted = entropy_bound_accept(entropy, torch.tensor([0.1, 0.001, 10.0]))
    assert accepted[0].tolist() == [False, True, True, True]
    assert accepted[1].tolist() == [False, True, False, False]  # the lowest, always
    assert accepted[2].all()


def _step(argmax: list[list[int]], entropy: float) -> DenoiseStep:
    """A step result with these argmax canvases and this entropy at every position (what stop_rule reads)."""
    tokens = torch.tensor(argmax)
    return DenoiseStep(tokens, tokens, torch.zeros(*tokens.shape, 5), tokens >= 0, torch.full(tokens.shape, entropy))


def _run(knobs: list[RenoiseDefaults], steps: list[tuple[list[list[int]], float]]) -> list[list[bool]]:
    """stop_rule over consecutive steps of a batch -> each step's stop flags."""
    batch = CanvasKnobs.of(knobs)
    previous = torch.full((len(knobs), 2), -1)
    runs = torch.zeros(len(knobs), dtype=torch.long)
    stops = []
    for argmax, entropy in steps:
        result = _step(argmax, entropy)
        stop, runs = stop_rule(result, previous, runs, batch)
        previous = result.argmax
        stops.append(stop.tolist())
    return stops


def test_stop_needs_a_repeated_argmax_and_a_low_mean_entropy():
    steps = [([[1, 2]], 0.001), ([[1, 2]], 0.01), ([[1, 3]], 0.001), ([[1, 3]], 0.001)]
    # not stable at the first step; stable, not confident (0.01 >= 0.005); confident, changed; both
    assert _run([KNOBS], steps) == [[False], [False], [False], [True]]


def test_stability_threshold_counts_steps_per_canvas():
    """Three canvases with stability 0 (confidence alone), 1 and 2 repeat one argmax: they stop after 1, 2 and 3
    steps."""
    knobs = [replace(KNOBS, stability_threshold=s) for s in (0, 1, 2)]
    same = ([[1, 2], [1, 2], [1, 2]], 0.001)
    assert _run(knobs, [same] * 3) == [[True, False, False], [True, True, False], [True, True, True]]


def test_a_step_samples_accepts_then_renoises_by_the_counter_rule():
    """Two canvases (own seeds, starts, steps, bounds): the accepted positions take the step's samples (inverse
    CDF of softmax(logits / t) with the SAMPLE stream's draws), the others the RENOISE stream's uniform tokens;
    the logits are tempered in place and the argmax is theirs."""
    logits = torch.randn(2, 6, 11, generator=torch.Generator().manual_seed(0))
    knobs = CanvasKnobs.of([KNOBS, replace(KNOBS, entropy_bound=5.0)])
    keys = DrawKeys.of([5, 9], [40, 3], [3, 0], torch.device("cpu"))
    tempered = logits / step_temperature(_steps(3, 0), knobs)[:, None, None]
    result = denoise_step(logits.clone(), knobs, keys)
    drawn = sample(torch.softmax(tempered, dim=-1), draw_bits(keys, SAMPLE, 6))
    noise = uniform_tokens(draw_bits(keys, RENOISE, 6), 11)
    accepted = entropy_bound_accept(token_entropy(tempered), knobs.entropy_bound)
    assert torch.equal(result.logits, tempered) and torch.equal(result.accepted, accepted)
    assert result.accepted.sum(-1).tolist()[0] < result.accepted.sum(-1).tolist()[1]  # the bounds differ
    assert result.canvas.tolist() == torch.where(accepted, drawn, noise).tolist()
    assert result.argmax.tolist() == logits.argmax(-1).tolist()
