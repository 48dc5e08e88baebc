"""Verified decoding in a plan (planner/verified.py): its tokens per forward from an acceptance rate (the recursion
by hand), given, or measured (the stated source is the results file's number), and the state backup each
verifying sequence holds in the memory budget (capacity and max context by hand on the hybrid toy)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from diffuserve.planner.build import build_plan
from diffuserve.planner.hardware import custom_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.options import PlanOptions
from diffuserve.planner.plan import make_plan
from diffuserve.planner.units import GiB
from diffuserve.planner.verified import MEASURED_VERIFIED_TPF, verified_tpf, verified_tpf_from_acceptance
from tests.planner.hybrid_toy import hybrid_toy_spec
from tests.planner.toy import toy_spec

ROOT = Path(__file__).resolve().parents[2]
COSTS = CostInputs(gpu_hour_price=1.0, capex_per_gpu=1.0)


@pytest.mark.parametrize(
    ("rate", "block", "expected"),
    [
        # p = 0.5: all kept 0.5 x 2 = 1; cut after 0 kept 0.5 x 1; the head after a cut 0.5: 2 / (1 + 0.5)
        (0.5, 2, 2 / 1.5),
        # nothing kept: each check writes the causal token, the next forward one head: autoregressive
        (0.0, 4, 1.0),
        # everything kept: a block per forward
        (1.0, 4, 4.0),
        # p = 0.5625: 0.5625 x 3 = 1.6875; cuts 0.25 x 1 + 0.75 x 0.25 x 2 = 0.625; heads 0.4375; / 1.4375
        (0.75, 3, 2.75 / 1.4375),
        # block 1: no drafts, autoregressive
        (0.3, 1, 1.0),
    ],
)
def test_tpf_from_the_acceptance_rate_by_hand(rate, block, expected):
    assert verified_tpf_from_acceptance(rate, block) == pytest.approx(expected, rel=1e-12)


def test_tpf_precedence_and_the_measured_default_is_the_results_file():
    given = verified_tpf(1.7, 0.5, 2)
    assert given == (1.7, "given (--verified-tpf)")
    derived, source = verified_tpf(None, 0.5, 2)
    assert derived == pytest.approx(2 / 1.5) and "acceptance rate 0.5" in source
    measured, source = verified_tpf(None, None, 32)
    record = json.loads((ROOT / "docs" / "results" / "eval.json").read_text())
    verified = next(row for row in record["result"]["results"] if row["decoding"] == "verified")
    assert measured == MEASURED_VERIFIED_TPF == verified["tokens_per_forward"] and "eval.json" in source
    assert verified_tpf(None, None, 1)[0] == 1  # never above the block


def test_verified_holds_a_backup_of_the_state_in_the_pool():
    """The hybrid toy's hand-checked capacity (test_hybrid.py): pool 500,000,000 B, KV 2,097,152 and state
    205,824 per 4096-token sequence: 217 fit. Verified decoding adds the state's backup: 500,000,000 /
    (2,097,152 + 2 x 205,824) = 199.3 -> 199. At 217 sequences the context then reaches
    (500,000,000 / 217 - 411,648) / 512 = 3696.3 tokens -> 231 pages of 16 = 3696 (the planner refuses 217
    at 4096 and offers that context)."""
    deployment = Deployment(
        gpu_memory_utilization=0.5, activation_bytes=15_602_512, runtime_overhead_bytes=0, max_num_seqs=256
    )
    base = Workload(context_length=4096, prompt_tokens=2048, output_tokens=1024, block_length=16)
    hardware = custom_hardware(GiB, 1e12, 1e14)
    diffusion = make_plan(hybrid_toy_spec(), hardware, deployment, base, Efficiency(), COSTS).capacity
    verified = make_plan(
        hybrid_toy_spec(), hardware, deployment, replace(base, decoder="verified", tpf=1.0), Efficiency(), COSTS
    ).capacity
    assert (diffusion.max_seqs_by_kv, diffusion.backup_bytes_per_sequence) == (217, 0)
    assert verified.backup_bytes_per_sequence == verified.state_bytes_per_sequence == 205_824
    assert verified.bytes_per_sequence == 2_097_152 + 2 * 205_824
    assert verified.max_seqs_by_kv == 199
    at_217 = make_plan(
        hybrid_toy_spec(),
        hardware,
        deployment,
        replace(base, context_length=3696, decoder="verified", tpf=1.0, concurrency=217),
        Efficiency(),
        COSTS,
    )
    assert at_217.capacity.max_context_at_concurrency == 3696


def test_full_attention_models_need_no_backup():
    workload = Workload(context_length=4096, prompt_tokens=2048, output_tokens=1024, block_length=16)
    hardware, deployment = custom_hardware(8 * GiB, 1e12, 1e14), Deployment()
    plain = make_plan(toy_spec(), hardware, deployment, workload, Efficiency(), COSTS).capacity
    verified = make_plan(toy_spec(), hardware, deployment, replace(workload, decoder="verified"), Efficiency(), COSTS)
    assert verified.capacity.backup_bytes_per_sequence == 0
    assert verified.capacity.max_seqs_by_kv == plain.max_seqs_by_kv


def test_build_plan_takes_the_decoder_and_refuses_stray_flags():
    options = PlanOptions(model="Clover-35B-A3B", context_length=32768, block_length=4, tpf=2.0)
    plan = build_plan(replace(options, decoder="verified", acceptance_rate=0.5))
    expected = verified_tpf_from_acceptance(0.5, 4)
    assert plan.workload.decoder == "verified" and plan.workload.tpf == pytest.approx(expected)
    diffusion = build_plan(options)
    assert plan.decode.tokens_per_s_per_seq == pytest.approx(diffusion.decode.tokens_per_s_per_seq * expected / 2.0)
    with pytest.raises(ValueError, match="--acceptance-rate: plans verified decoding only"):
        build_plan(replace(options, acceptance_rate=0.5))
    with pytest.raises(ValueError, match=r"acceptance_rate: must be in \[0, 1\]"):
        build_plan(replace(options, decoder="verified", acceptance_rate=1.5))
    with pytest.raises(ValueError, match="decoder: 'speculative' is not one of diffusion, verified"):
        build_plan(replace(options, decoder="speculative"))
