"""Cost per million output tokens, cloud vs. on-prem, and the break-even points, by hand."""

from __future__ import annotations

import pytest

from diffuserve.planner.cost import estimate_cost
from diffuserve.planner.inputs import CostInputs


def test_cost_by_hand():
    """Capex $35,040 over 4 years = $1.00/h; energy 1 kW x PUE 1.5 x $0.10 = $0.15/h -> on-prem $1.15/h.
    1,000 tokens/s at 50% utilization = 1.8M tokens per paid hour: cloud $2.00 / 1.8 = $1.111/1M, on-prem
    $1.15 / 1.8 = $0.6389/1M. Break-even: $35,040 / (($2.00 - $0.15) x 730 h) = 25.95 months of 24/7 rental;
    owning wins above $1.15 / $2.00 = 57.5% utilization against on-demand rental."""
    inputs = CostInputs(
        gpu_hour_price=2.0,
        capex_per_gpu=35_040,
        amortization_years=4,
        power_watts_per_gpu=1000,
        pue=1.5,
        electricity_price_per_kwh=0.10,
        utilization=0.5,
    )
    cost = estimate_cost(inputs, num_gpus=1, tokens_per_s=1000)
    assert cost.onprem_hourly_per_gpu == pytest.approx(1.15)
    assert cost.cloud_per_million == pytest.approx(2.0 / 1.8)
    assert cost.onprem_per_million == pytest.approx(1.15 / 1.8)
    assert cost.break_even_months == pytest.approx(35_040 / (1.85 * 730))
    assert cost.break_even_utilization == pytest.approx(0.575)


def test_gpu_count_scales_cost_and_energy_above_price_never_breaks_even():
    """Two GPUs at the same tokens/s cost twice as much; a $0.10/h rental is below the $0.15/h energy bill."""
    inputs = CostInputs(
        gpu_hour_price=0.10, capex_per_gpu=35_040, power_watts_per_gpu=1000, pue=1.5, electricity_price_per_kwh=0.10
    )
    one, two = estimate_cost(inputs, 1, 1000), estimate_cost(inputs, 2, 1000)
    assert two.cloud_per_million == pytest.approx(2 * one.cloud_per_million)
    assert one.break_even_months is None and one.break_even_utilization is None


def test_bad_cost_inputs():
    with pytest.raises(ValueError, match="utilization"):
        CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0, utilization=0)
    with pytest.raises(ValueError, match="capex_per_gpu: must be >= 0"):
        CostInputs(gpu_hour_price=1.0, capex_per_gpu=-1.0)
