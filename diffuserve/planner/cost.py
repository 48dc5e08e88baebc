"""Cost per million output tokens, cloud vs. on-premise, and the break-even between them.

Owns the money formulas. Knows nothing of models: it takes the deployment's output tokens/s and device count.
Cloud: rented devices at a price per device-hour. On-prem: capex amortised over the years on every hour of
the year, plus energy (device + host share, times PUE) for every hour the machines are powered.
"""

from __future__ import annotations

from dataclasses import dataclass

from diffuserve.planner.inputs import CostInputs
from diffuserve.planner.units import fmt_money

HOURS_PER_YEAR = 8760
HOURS_PER_MONTH = HOURS_PER_YEAR / 12


@dataclass(frozen=True)
class CostEstimate:
    num_gpus: int
    tokens_per_s: float
    onprem_hourly_per_gpu: float
    """Capex share + energy of one device for one hour, whether busy or idle."""
    cloud_per_million: float
    onprem_per_million: float
    break_even_utilization: float | None
    """Utilization above which owning beats renting on demand (only the busy hours); None if never."""
    break_even_months: float | None
    """Months of 24/7 rental that cost as much as buying and powering the devices; None if never."""
    formulas: tuple[str, ...]


def per_million_tokens(hourly_cost: float, tokens_per_s: float, utilization: float) -> float:
    """$/1M output tokens = hourly cost / (3600 x tokens/s x utilization) x 1e6."""
    return hourly_cost / (3600 * tokens_per_s * utilization) * 1e6


def estimate_cost(inputs: CostInputs, num_gpus: int, tokens_per_s: float) -> CostEstimate:
    """Both prices per million output tokens at the same utilization, plus the two break-even points."""
    u = inputs.utilization
    capex_hourly = inputs.capex_per_gpu / (inputs.amortization_years * HOURS_PER_YEAR)
    energy_hourly = inputs.power_watts_per_gpu / 1000 * inputs.pue * inputs.electricity_price_per_kwh
    onprem_hourly = capex_hourly + energy_hourly
    cloud = per_million_tokens(num_gpus * inputs.gpu_hour_price, tokens_per_s, u)
    onprem = per_million_tokens(num_gpus * onprem_hourly, tokens_per_s, u)
    margin = inputs.gpu_hour_price - energy_hourly
    months = inputs.capex_per_gpu / (margin * HOURS_PER_MONTH) if margin > 0 else None
    utilization = onprem_hourly / inputs.gpu_hour_price if inputs.gpu_hour_price > 0 else None
    if utilization is not None and utilization > 1:
        utilization = None
    formulas = (
        f"cloud $/1M = {num_gpus} GPU x {fmt_money(inputs.gpu_hour_price)}/h / (3600 x {tokens_per_s:,.1f} tok/s"
        f" x utilization {u}) x 1e6 = {fmt_money(cloud)}",
        f"on-prem $/GPU-h = capex {fmt_money(inputs.capex_per_gpu)} / ({inputs.amortization_years} y x "
        f"{HOURS_PER_YEAR} h) + {inputs.power_watts_per_gpu:.0f} W x PUE {inputs.pue} x "
        f"{fmt_money(inputs.electricity_price_per_kwh)}/kWh = {fmt_money(capex_hourly)} + "
        f"{fmt_money(energy_hourly)} = {fmt_money(onprem_hourly)}",
        f"on-prem $/1M = {num_gpus} x {fmt_money(onprem_hourly)}/h / (3600 x {tokens_per_s:,.1f} x {u}) x 1e6 "
        f"= {fmt_money(onprem)}",
        "break-even vs. 24/7 rental = capex / ((cloud $/h - energy $/h) x 730 h) = "
        + (f"{months:.1f} months" if months is not None else "never (energy costs more than the rental)"),
        "break-even utilization vs. on-demand rental = on-prem $/h / cloud $/h = "
        + (f"{utilization:.0%}" if utilization is not None else "never below 100%"),
    )
    return CostEstimate(
        num_gpus=num_gpus,
        tokens_per_s=tokens_per_s,
        onprem_hourly_per_gpu=onprem_hourly,
        cloud_per_million=cloud,
        onprem_per_million=onprem,
        break_even_utilization=utilization,
        break_even_months=months,
        formulas=formulas,
    )
