"""What block expert coreset routing buys at batch 1: one sequence decoding with the coreset (each MoE layer reads
at most C experts per preview forward, roofline.experts_per_block) beside the same sequence with per-token routing
(today's engine). The rule (model/layers/moe/coreset_rule.py) is the flag's, else the model's config.json's; the
cumulative rule (dMoE's) has no fixed C, so `planned_coreset_size` estimates its mean. Knows nothing of rendering.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from diffuserve.model.config import parse_block_expert_coreset
from diffuserve.model.layers.moe.coreset_rule import CoresetRule, parse_coreset_rule, rule_from_config
from diffuserve.planner.inputs import Workload
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.roofline import DecodeEstimate, Roofline
from diffuserve.planner.units import fmt_bytes, fmt_time


@dataclass(frozen=True)
class CoresetComparison:
    coreset: int
    """C, or the cumulative rule's estimated mean coreset."""
    with_coreset: DecodeEstimate
    """Batch 1, the block's positions routed inside a coreset of at most `coreset` experts."""
    per_token: DecodeEstimate
    """Batch 1, every position routed to its own top-k (the coreset off)."""
    rule: str = ""
    """The cumulative rule in the flag's syntax (empty: the fixed rule of C)."""
    expert_weight_bytes: float = 0.0
    """The routed experts' bytes on one device (a forward reads experts_touched of them)."""

    def expert_bytes(self, estimate: DecodeEstimate) -> float:
        """Routed-expert bytes one batch-1 preview forward reads."""
        return self.expert_weight_bytes * estimate.forward.experts_touched

    @property
    def label(self) -> str:
        """The coreset as the report names it."""
        if self.rule:
            return f"block expert coreset {self.rule} (mean C ~ {self.coreset})"
        return f"block expert coreset C = {self.coreset}"

    @property
    def speedup(self) -> float:
        return self.with_coreset.tokens_per_s_per_seq / self.per_token.tokens_per_s_per_seq

    @property
    def formulas(self) -> tuple[str, ...]:
        def line(name: str, d: DecodeEstimate) -> str:
            f = d.forward
            return (
                f"{name}: experts touched {f.experts_touched:.1%} ({fmt_bytes(self.expert_bytes(d))} of expert "
                f"weights), {fmt_bytes(f.bytes)} per forward -> "
                f"{fmt_time(f.t_forward)} -> {d.tokens_per_s_per_seq:,.1f} tokens/s"
            )

        return (
            line(f"batch 1, {self.label}", self.with_coreset),
            line("batch 1, per-token routing", self.per_token),
            f"speed-up = {self.speedup:.2f}x (preview forwards only: the commit forward of each block routes per "
            "token, which this leaves out)",
        )


def compare_coreset(roofline: Roofline, workload: Workload) -> CoresetComparison | None:
    """Batch-1 decode with and without the workload's coreset (None: the coreset is off or the model dense)."""
    if workload.block_expert_coreset <= 0 or not roofline.spec.is_moe:
        return None
    per_token = roofline.decode(replace(workload, block_expert_coreset=0), 1)
    return CoresetComparison(
        workload.block_expert_coreset,
        roofline.decode(workload, 1),
        per_token,
        workload.coreset_rule,
        roofline.memory.expert_weight_bytes,
    )


def model_config(name_or_path: str) -> dict | None:
    """config.json of a model directory or config path (None for a name that is neither: a preset's is its own)."""
    path = Path(name_or_path)
    config_path = path / "config.json" if path.is_dir() else path
    if not config_path.is_file():
        return None
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError:
        return None  # load_model has already said why


def planned_rule(flag: str | int | None, config: dict | None) -> CoresetRule | None:
    """The flag's rule (None: not given), else config.json's (None for a model without one)."""
    if flag is not None:
        return parse_coreset_rule(flag)
    return rule_from_config(config, parse_block_expert_coreset(config)) if config else None


def planned_coreset_size(spec: ModelSpec, rule: CoresetRule, block_length: int, per_block: float | None) -> int:
    """The C to plan with: the fixed rule's, or the cumulative rule's mean coreset of one window.

    The window's positions act as n independent top-k draws over the E experts (n from the measured union of a
    block's experts, else the window's positions: roofline.experts_per_block), so an expert's votes are about
    Poisson(n k / E). Walking the experts from the most voted down, the coreset takes them while their share of
    the n k votes stays within T, then the first past it; at least the guard, at most E. Votes are counted, not
    weighted by score, and the router's group limit is not modelled."""
    if rule.kind == "fixed":
        return rule.size
    experts, k = spec.num_experts, spec.num_experts_per_tok
    window = min(rule.window, block_length)
    if per_block is not None and per_block < experts:
        draws = math.log(1 - per_block / experts) / math.log(1 - k / experts) * window / block_length
    else:
        draws = float(window)
    rate = draws * k / experts  # mean votes per expert
    size, share, votes = 0.0, 0.0, rate * experts
    for count in range(int(rate + 10 * math.sqrt(rate) + 10), 0, -1):
        number = experts * math.exp(-rate) * rate**count / math.factorial(count)  # experts with `count` votes
        if share + count * number / votes > rule.threshold:
            size += (rule.threshold - share) * votes / count + 1
            break
        share += count * number / votes
        size += number
    return min(experts, max(min(rule.minimum, experts), round(size)))
