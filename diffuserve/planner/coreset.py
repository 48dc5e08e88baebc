"""What block expert coreset routing buys at batch 1: one sequence decoding with the coreset (each MoE layer reads
at most C experts per preview forward, roofline.experts_per_block) beside the same sequence with per-token routing
(today's engine). Knows nothing of rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from diffuserve.planner.inputs import Workload
from diffuserve.planner.roofline import DecodeEstimate, Roofline
from diffuserve.planner.units import fmt_bytes, fmt_time


@dataclass(frozen=True)
class CoresetComparison:
    coreset: int
    with_coreset: DecodeEstimate
    """Batch 1, the block's positions routed inside a coreset of at most `coreset` experts."""
    per_token: DecodeEstimate
    """Batch 1, every position routed to its own top-k (the coreset off)."""

    @property
    def speedup(self) -> float:
        return self.with_coreset.tokens_per_s_per_seq / self.per_token.tokens_per_s_per_seq

    @property
    def formulas(self) -> tuple[str, ...]:
        def line(name: str, d: DecodeEstimate) -> str:
            f = d.forward
            return (
                f"{name}: experts touched {f.experts_touched:.1%}, {fmt_bytes(f.bytes)} per forward -> "
                f"{fmt_time(f.t_forward)} -> {d.tokens_per_s_per_seq:,.1f} tokens/s"
            )

        return (
            line(f"batch 1, coreset C = {self.coreset}", self.with_coreset),
            line("batch 1, per-token routing", self.per_token),
            f"speed-up = {self.speedup:.2f}x (preview forwards only: the commit forward of each block routes per "
            "token, which this leaves out)",
        )


def compare_coreset(roofline: Roofline, workload: Workload) -> CoresetComparison | None:
    """Batch-1 decode with and without the workload's coreset (None: the coreset is off or the model dense)."""
    if workload.block_expert_coreset <= 0 or not roofline.spec.is_moe:
        return None
    per_token = roofline.decode(replace(workload, block_expert_coreset=0), 1)
    return CoresetComparison(workload.block_expert_coreset, roofline.decode(workload, 1), per_token)
