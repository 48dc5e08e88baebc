"""PNG chart of throughput and cost against concurrency (`--chart PATH`), drawn with matplotlib if present.

Owns the concurrency sweep and the figure. matplotlib is optional and imported only here, inside
`write_chart`, so the planner stays stdlib-only; without it the user gets one line saying how to install it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from diffuserve.planner.cost import estimate_cost
from diffuserve.planner.plan import Plan
from diffuserve.planner.roofline import Roofline


@dataclass(frozen=True)
class SweepPoint:
    concurrency: int
    """Sequences per replica."""
    tokens_per_s_total: float
    tokens_per_s_per_seq: float
    cloud_per_million: float
    onprem_per_million: float


def sweep_concurrency(plan: Plan) -> list[SweepPoint]:
    """Decode throughput and cost at every concurrency from 1 to what fits (per replica)."""
    roofline = Roofline(plan.spec, plan.params, plan.hardware, plan.deployment, plan.efficiency, plan.memory)
    top = max(1, min(plan.capacity.max_seqs_by_kv, plan.deployment.max_num_seqs))
    points = []
    for num_seqs in range(1, top + 1):
        decode = roofline.decode(plan.workload, num_seqs)
        cost = estimate_cost(plan.cost_inputs, plan.deployment.num_gpus, decode.tokens_per_s_total)
        points.append(
            SweepPoint(
                num_seqs,
                decode.tokens_per_s_total,
                decode.tokens_per_s_per_seq,
                cost.cloud_per_million,
                cost.onprem_per_million,
            )
        )
    return points


def write_chart(plan: Plan, path: str | Path) -> Path:
    """Writes the PNG; ValueError (one line, with the install command) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError as e:
        raise ValueError(
            "--chart needs matplotlib, which is not installed; run `pip install 'diffuserve[plot]'` "
            "(or `pip install matplotlib`)"
        ) from e
    points = sweep_concurrency(plan)
    x = [p.concurrency for p in points]
    figure, (top, bottom) = pyplot.subplots(2, 1, figsize=(7, 7), sharex=True)
    top.plot(x, [p.tokens_per_s_total for p in points], label="total output tokens/s")
    top.plot(x, [p.tokens_per_s_per_seq for p in points], label="tokens/s per sequence")
    top.set_ylabel("tokens/s")
    top.legend()
    bottom.plot(x, [p.cloud_per_million for p in points], label="cloud $/1M output tokens")
    bottom.plot(x, [p.onprem_per_million for p in points], label="on-prem $/1M output tokens")
    bottom.set_xlabel("concurrent sequences per replica")
    bottom.set_ylabel("$ per 1M output tokens")
    bottom.legend()
    figure.suptitle(
        f"{plan.spec.name} on {plan.deployment.num_gpus} x {plan.hardware.name}, "
        f"context {plan.workload.context_length:,}"
    )
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=120)
    pyplot.close(figure)
    return out
