"""DiffusionGemma's renoise decoding functions, by hand: the temperature schedule, entropies, the entropy-bound
acceptance, renoising, the stable-and-confident rule and the order of a step's random draws."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from diffuserve.decoding.renoise_knobs import RenoiseDefaults
from diffuserve.decoding.renoise_steps import (
    DenoiseStep,
    denoise_step,
    empty_history,
    entropy_bound_accept,
    random_canvas,
    renoise,
    should_stop,
    step_temperature,
    token_entropy,
)

KNOBS = RenoiseDefaults()  # 48 steps, t 0.8 -> 0.4, bound 0.1, stability 1, confidence 0.005


def test_temperature_is_linear_in_the_steps_left():
    """Step 0 (48 left): 0.8; step 47 (1 left): 0.4 + 0.4 / 48 = 0.408333 (never t_min itself); fp32."""
    assert step_temperature(0, KNOBS).dtype == torch.float32
    assert step_temperature(0, KNOBS).item() == torch.tensor(0.8).item()
    assert math.isclose(step_temperature(47, KNOBS).item(), 0.4 + 0.4 / 48, rel_tol=1e-6)
    assert math.isclose(step_temperature(24, KNOBS).item(), 0.6, rel_tol=1e-6)


def test_entropy_by_hand():
    """Uniform over 4: ln 4; probabilities (0.5, 0.5, 0, ...): ln 2; a -inf logit contributes nothing."""
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, float("-inf"), float("-inf")]])
    assert torch.allclose(token_entropy(logits), torch.tensor([math.log(4), math.log(2)]))


def test_entropy_bound_accepts_while_the_sum_less_its_largest_term_fits():
    """Entropies (0.5, 0.01, 0.2, 0.05), bound 0.1: ascending 0.01, 0.05, 0.2, 0.5; sums less the current
    term 0, 0.01, 0.06, 0.26 -> the three lowest are accepted (positions 1, 3, 2)."""
    entropy = torch.tensor([0.5, 0.01, 0.2, 0.05])
    assert entropy_bound_accept(entropy, 0.1).tolist() == [False, True, True, True]
    assert entropy_bound_accept(entropy, 0.001).tolist() == [False, True, False, False]  # the lowest, always
    assert entropy_bound_accept(entropy, 10.0).all()


def test_renoise_replaces_the_positions_not_accepted():
    canvas, noise = torch.tensor([1, 2, 3]), torch.tensor([7, 8, 9])
    assert renoise(canvas, torch.tensor([True, False, True]), noise).tolist() == [1, 8, 3]


def _step(argmax: list[int], entropy: float) -> DenoiseStep:
    """A step result with this argmax canvas and this entropy at every position (what should_stop reads)."""
    length = len(argmax)
    tokens = torch.zeros(length, dtype=torch.long)
    ones = torch.ones(length, dtype=torch.bool)
    return DenoiseStep(tokens, torch.tensor(argmax), torch.zeros(length, 5), ones, torch.full((length,), entropy))


def test_stop_needs_a_repeated_argmax_and_a_low_mean_entropy():
    history = empty_history(KNOBS, 2)
    stop, history = should_stop(history, _step([1, 2], 0.001), KNOBS)
    assert not stop  # stable needs a previous step
    stop, history = should_stop(history, _step([1, 2], 0.01), KNOBS)
    assert not stop  # stable, not confident (0.01 >= 0.005)
    stop, history = should_stop(history, _step([1, 3], 0.001), KNOBS)
    assert not stop  # confident, changed
    stop, _ = should_stop(history, _step([1, 3], 0.001), KNOBS)
    assert stop


def test_stability_threshold_counts_steps():
    zero, two = replace(KNOBS, stability_threshold=0), replace(KNOBS, stability_threshold=2)
    assert should_stop(empty_history(zero, 2), _step([1, 2], 0.001), zero)[0]  # confidence alone
    history = empty_history(two, 2)
    stops = []
    for _ in range(3):
        stop, history = should_stop(history, _step([1, 2], 0.001), two)
        stops.append(stop)
    assert stops == [False, False, True]


def test_a_step_draws_the_samples_then_the_noise():
    """One generator: C multinomial draws from softmax(logits / t), then C uniform tokens for renoising."""
    logits = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    canvas = torch.arange(6)
    result = denoise_step(logits, canvas, 3, KNOBS, torch.Generator().manual_seed(42))
    generator = torch.Generator().manual_seed(42)
    tempered = logits / step_temperature(3, KNOBS)
    drawn = torch.multinomial(torch.softmax(tempered, dim=-1), 1, generator=generator).squeeze(-1)
    noise = random_canvas(6, 11, generator)
    accepted = entropy_bound_accept(token_entropy(tempered), KNOBS.entropy_bound)
    assert result.accepted.tolist() == accepted.tolist()
    assert result.canvas.tolist() == torch.where(accepted, drawn, noise).tolist()
    assert result.argmax.tolist() == logits.argmax(-1).tolist()
