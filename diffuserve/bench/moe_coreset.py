"""`diffuserve bench moe --coreset-sizes 8,16,32,48`: what block expert coreset routing saves, on a random
256-expert top-8 shape (small widths, so it runs on a CPU): the engine generating for one request (batch 1, a
fixed number of steps per block) with per-token routing (C = 0) and at each C. Per MoE layer and forward: the
distinct experts the whole forward touches (commits included, which route per token) and those the denoised
block's rows touch, and the routed-expert bytes those read. Beside them the planner's prediction of the block's
bytes (planner/roofline.py, experts_per_block), from uniform routing and calibrated with the C = 0 run's measured
experts per block, with its difference from the engine's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffuserve.planner.model_spec import spec_from_config
from diffuserve.planner.params import count_parameters
from diffuserve.planner.roofline import experts_per_block, experts_touched_fraction
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

CORESET_SHAPE: dict[str, Any] = dict(
    num_experts=256,
    num_experts_per_tok=8,
    hidden_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    first_k_dense_replace=0,
    shared_expert_intermediate_size=0,
)
"""The random shape: 256 experts top-8 as Clover's MoE layers, every layer MoE, tiny widths."""
EXPERT_DTYPE_BYTES = 4
"""The random checkpoint is fp32."""


def bench_coreset(root: Path, sizes: list[int], block_length: int, steps: int, max_tokens: int) -> list[dict]:
    """One row per C (0 first): measured experts and bytes per forward, the planner's prediction."""
    from diffuserve import LLM, SamplingParams

    config = make_config("sdar-moe-tiny", block_length=block_length, **CORESET_SHAPE)
    model_dir = write_random_checkpoint(root / "coreset-256", config, seed=0, logit_scale=4.0)
    prompt = [(7 * i + 3) % 300 + 1 for i in range(block_length)]
    params = SamplingParams(decoder="fixed", steps=steps, max_tokens=max_tokens, ignore_eos=True)
    rows = []
    for size in [0, *sizes]:
        llm = LLM(str(model_dir), num_pages=64, max_num_seqs=1, expert_stats=True, block_expert_coreset=size)
        llm.generate({"prompt_token_ids": prompt}, params)
        experts = llm.engine.stats().experts
        assert experts is not None, "expert_stats is on"
        rows.append(_row(size, experts.experts_touched_per_step, experts.experts_touched_by_blocks_per_step))
    calibrated = rows[0]["experts_per_forward_blocks"]
    for row in rows:
        row.update(_planned(config, block_length, row["coreset"], calibrated, row["expert_bytes_per_forward_blocks"]))
    return rows


def _expert_bytes() -> int:
    """One routed expert's weights: gate, up [I, H] and down [H, I]."""
    return 3 * CORESET_SHAPE["hidden_size"] * CORESET_SHAPE["moe_intermediate_size"] * EXPERT_DTYPE_BYTES


def _row(size: int, per_forward: float, by_blocks: float) -> dict[str, Any]:
    layers = CORESET_SHAPE["num_hidden_layers"]
    return {
        "coreset": size,
        "experts_per_forward": per_forward,
        "experts_per_forward_blocks": by_blocks,
        "expert_bytes_per_forward": per_forward * _expert_bytes() * layers,
        "expert_bytes_per_forward_blocks": by_blocks * _expert_bytes() * layers,
    }


def _planned(config: dict, block_length: int, size: int, calibrated: float, measured: float) -> dict[str, Any]:
    """The planner's routed-expert bytes of one batch-1 preview forward (S tokens), uniform and calibrated."""
    spec = spec_from_config(config)
    routed = count_parameters(spec).routed_experts * EXPERT_DTYPE_BYTES
    out: dict[str, Any] = {}
    for name, per_block in (("uniform", None), ("calibrated", calibrated)):
        union = experts_per_block(spec, block_length, size, per_block)
        planned = routed * experts_touched_fraction(spec, block_length, block_length, union)
        out[f"planned_bytes_{name}"] = planned
        out[f"planned_error_{name}"] = planned / measured - 1 if measured else None
    return out


def print_coreset_table(rows: list[dict]) -> None:
    print(
        f"\n{'C':>4}{'experts/fwd':>13}{'block rows':>12}{'KB/fwd':>9}{'block KB':>10}"
        f"{'planned KB':>12}{'error':>8}{'calibrated':>12}{'error':>8}"
    )
    for r in rows:
        print(
            f"{r['coreset'] or 'all':>4}{r['experts_per_forward']:>13.1f}{r['experts_per_forward_blocks']:>12.1f}"
            f"{r['expert_bytes_per_forward'] / 1e3:>9.1f}{r['expert_bytes_per_forward_blocks'] / 1e3:>10.1f}"
            f"{r['planned_bytes_uniform'] / 1e3:>12.1f}{_pct(r['planned_error_uniform']):>8}"
            f"{r['planned_bytes_calibrated'] / 1e3:>12.1f}{_pct(r['planned_error_calibrated']):>8}"
        )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"
