"""Block expert coreset routing in the planner: a preview forward's blocks each touch C (1 - (1 - k/C)^n) experts
per MoE layer (n the independent top-k draws that give the block's union over all E); bytes and tokens/s
follow; `diffuserve plan --block-expert-coreset C` shows batch 1 with it beside per-token routing. Checked by
hand."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from diffuserve.planner.hardware import custom_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_presets import load_model
from diffuserve.planner.plan import Plan, make_plan
from diffuserve.planner.roofline import experts_per_block
from diffuserve.planner.units import GiB
from tests.planner.test_cli import _run
from tests.planner.toy import HAND_CHECKED_WORKLOAD, toy_spec

UNION_32 = 256 * (1 - (31 / 32) ** 32)
"""Clover (E 256, k 8): distinct experts of one 32-token block under uniform routing, 163.3."""


def _plan(workload: Workload) -> Plan:
    """The toy on the roofline tests' exact hardware (tests/planner/toy.py, hand_checked_plan)."""
    hardware = custom_hardware(8 * GiB, 1e12, 100e12)
    costs = CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0)
    return make_plan(toy_spec(), hardware, Deployment(), workload, Efficiency(1.0, 1.0, 0.0), costs)


def test_experts_per_block_draws_the_union_inside_the_coreset():
    spec, _ = load_model("Clover-35B-A3B")
    assert experts_per_block(spec, 32, 0) == pytest.approx(UNION_32)
    assert experts_per_block(spec, 32, 48) == pytest.approx(48 * (1 - (5 / 6) ** 32))  # n = S = 32 draws
    assert experts_per_block(spec, 32, 256) == pytest.approx(UNION_32)  # C = E: today's routing
    assert experts_per_block(spec, 32, 8) == 8  # k = C: every position takes the whole coreset
    draws = math.log(1 - 20 / 256) / math.log(1 - 8 / 256)  # a measured union of 20: 2.56 draws
    assert experts_per_block(spec, 32, 48, per_block=20.0) == pytest.approx(48 * (1 - (5 / 6) ** draws))
    assert experts_per_block(spec, 32, 256, per_block=20.0) == 20.0


def test_decode_bytes_follow_the_coreset():
    """Toy (E 8, k 2, 4 sequences x S 16 per forward, 100,663,296 expert bytes): C = 2 per block ->
    touched 1 - (1 - 2/8)^4 = 0.68359375 of the experts; without it 1 - (1 - 2/8)^64 (all but 1e-8)."""
    load = replace(HAND_CHECKED_WORKLOAD, experts_touched_fraction=None)
    today, coreset = (_plan(replace(load, block_expert_coreset=c)) for c in (0, 2))
    assert coreset.decode.forward.experts_touched == pytest.approx(0.68359375)
    saved = (today.decode.forward.experts_touched - 0.68359375) * 100_663_296
    assert today.decode.forward.weight_bytes - coreset.decode.forward.weight_bytes == pytest.approx(saved)
    assert coreset.decode.tokens_per_s_total > today.decode.tokens_per_s_total
    assert today.coreset is None and coreset.coreset is not None


def test_plan_shows_batch_1_beside_per_token_routing(capsys):
    """Clover at batch 1: 47.86 / 256 = 18.7 % of the experts with C = 48, 163.3 / 256 = 63.8 % without."""
    out = _run(capsys, "Clover-35B-A3B", "--block-expert-coreset", "48")
    (line,) = [x for x in out.splitlines() if x.startswith("Coreset")]
    assert "C = 48" in line and "experts touched 18.7%" in line and "with per-token routing (63.8%" in line
    document = json.loads(_run(capsys, "Clover-35B-A3B", "--block-expert-coreset", "48", "--json"))
    figures = document["block_expert_coreset"]
    expected = 48 * (1 - (5 / 6) ** 32) / 256
    assert figures["batch1_with_coreset"]["forward"]["experts_touched"] == pytest.approx(expected)
    assert figures["batch1_per_token_routing"]["forward"]["experts_touched"] == pytest.approx(UNION_32 / 256)
    faster = figures["batch1_with_coreset"]["tokens_per_s_per_seq"]
    assert faster == pytest.approx(figures["speedup"] * figures["batch1_per_token_routing"]["tokens_per_s_per_seq"])
    assert figures["speedup"] > 1
    assert "Coreset" not in _run(capsys, "Clover-35B-A3B")


def test_negative_coreset_is_one_line():
    with pytest.raises(ValueError, match="block_expert_coreset: must be >= 0"):
        Workload(context_length=64, prompt_tokens=16, output_tokens=16, block_length=16, block_expert_coreset=-1)
