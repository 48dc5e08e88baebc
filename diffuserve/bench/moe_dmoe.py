"""`diffuserve bench moe --coreset-rules cumulative:0.6 cumulative:0.3`: dMoE's cumulative coreset rule on a random
256-expert dMoE (LLaDA2's group-limited router, top-8 from 4 of 8 groups, small widths, so it runs on a CPU): the
engine generating for one request (batch 1, a fixed number of steps per block) with per-token routing and under
each rule. Per MoE layer and denoising forward: the distinct experts the block's rows touch (what dMoE's `generate`
reports as its unique experts) and the routed-expert bytes they read; beside them the planner's prediction
(planner/coreset.py: the rule's mean coreset, then roofline.experts_per_block), from uniform routing and calibrated
with the per-token run's measured experts per block, with its difference from the engine's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diffuserve.model.layers.moe.coreset_rule import parse_coreset_rule
from diffuserve.planner.coreset import planned_coreset_size
from diffuserve.planner.model_spec import spec_from_config
from diffuserve.planner.roofline import experts_per_block
from diffuserve.reference.llada2_checkpoint import DMOE, write_llada2_checkpoint

DMOE_SHAPE: dict[str, Any] = dict(
    DMOE,
    num_experts=256,
    num_experts_per_tok=8,
    n_group=8,
    topk_group=4,
    moe_intermediate_size=16,
)
"""dMoE-16B's router shape (256 experts, top-8 from the 4 best of 8 groups) at llada2-tiny's widths."""
INIT_STD = 0.3
"""Random weights this wide give the router scores that differ from position to position (at the checkpoints'
usual 0.02 the expert bias alone decides most routing)."""
EXPERT_DTYPE_BYTES = 4
"""The random checkpoint is fp32."""


def bench_dmoe(root: Path, rules: list[str], block_length: int, steps: int, max_tokens: int) -> list[dict]:
    """One row for per-token routing, then one per rule: measured experts and bytes per forward, the planner's."""
    from diffuserve import LLM, SamplingParams

    model_dir = write_llada2_checkpoint(root / "dmoe-256", DMOE_SHAPE, seed=0, init_std=INIT_STD, logit_scale=4.0)
    config = json.loads((model_dir / "config.json").read_text())
    prompt = [(7 * i + 3) % 250 + 1 for i in range(block_length)]
    params = SamplingParams(decoder="fixed", steps=steps, max_tokens=max_tokens, ignore_eos=True)
    rows: list[dict[str, Any]] = []
    for rule in ["0", *rules]:
        llm = LLM(str(model_dir), num_pages=64, max_num_seqs=1, expert_stats=True, block_expert_coreset=rule)
        llm.generate({"prompt_token_ids": prompt}, params)
        experts = llm.engine.stats().experts
        assert experts is not None, "expert_stats is on"
        rows.append({"rule": rule, "experts_per_forward": experts.experts_per_block_forward})
    calibrated = rows[0]["experts_per_forward"]
    for row in rows:
        row.update(_planned(config, block_length, row["rule"], calibrated, row["experts_per_forward"]))
    return rows


def expert_bytes(config: dict) -> int:
    """One routed expert's weights, gate, up [I, H] and down [H, I], times the MoE layers."""
    layers = config["num_hidden_layers"] - config.get("first_k_dense_replace", 0)
    return 3 * config["hidden_size"] * config["moe_intermediate_size"] * EXPERT_DTYPE_BYTES * layers


def _planned(config: dict, block_length: int, text: str, calibrated: float, measured: float) -> dict[str, Any]:
    """The measured bytes, and the planner's experts and bytes of one preview forward, uniform and calibrated."""
    spec = spec_from_config(config)
    rule = parse_coreset_rule(text)
    out: dict[str, Any] = {"expert_bytes_per_forward": measured * expert_bytes(config)}
    for name, per_block in (("uniform", None), ("calibrated", calibrated)):
        size = planned_coreset_size(spec, rule, block_length, per_block) if rule is not None else 0
        planned = experts_per_block(spec, block_length, size, per_block)
        out[f"planned_coreset_{name}"] = size
        out[f"planned_experts_{name}"] = planned
        out[f"planned_bytes_{name}"] = planned * expert_bytes(config)
        out[f"planned_error_{name}"] = planned / measured - 1 if measured else None
    return out


def print_dmoe_table(rows: list[dict]) -> None:
    print(
        f"\n{'rule':>34}{'experts/fwd':>13}{'KB/fwd':>9}{'planned C':>11}{'planned KB':>12}{'error':>8}"
        f"{'calibrated C':>14}{'KB':>8}{'error':>8}"
    )
    for r in rows:
        rule = parse_coreset_rule(r["rule"])
        print(
            f"{rule.describe() if rule else 'per token':>34}{r['experts_per_forward']:>13.2f}"
            f"{r['expert_bytes_per_forward'] / 1e3:>9.1f}{r['planned_coreset_uniform'] or '-':>11}"
            f"{r['planned_bytes_uniform'] / 1e3:>12.1f}{_pct(r['planned_error_uniform']):>8}"
            f"{r['planned_coreset_calibrated'] or '-':>14}{r['planned_bytes_calibrated'] / 1e3:>8.1f}"
            f"{_pct(r['planned_error_calibrated']):>8}"
        )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"
