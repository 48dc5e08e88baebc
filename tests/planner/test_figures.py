"""The numbers behind the web console's planner charts (planner/figures.py): a device's memory parts and the
sequences that fit against the context length, checked by hand and against the plan itself."""

from __future__ import annotations

import pytest

from diffuserve.planner.build import build_plan
from diffuserve.planner.figures import context_lengths, device_memory, fit_curve, sequences_that_fit
from diffuserve.planner.options import PlanOptions
from diffuserve.planner.units import GiB


def _plan(**flags):
    return build_plan(PlanOptions(**{"model": "Clover-35B-A3B", "hardware": "H200", **flags}))


def test_memory_parts_add_up_to_the_device_by_hand():
    """Clover-35B-A3B on one H200 at 131,072 tokens: K/V per token = 10 attention layers x 2 (K and V) x Hkv 2 x
    D 256 x 2 bytes = 20,480 B, so one sequence holds 131,072 x 20,480 B = 2.5 GiB of K/V; the plan fits 21, so the
    K/V part is 21 x 2.5 GiB = 52.5 GiB; the experts are 256 x 40 layers x 3 x 2048 x 512 x 2 B = 60 GiB."""
    plan = _plan(context_length=131072)
    parts = {part.name: part.bytes for part in device_memory(plan)}
    assert list(parts) == ["weights", "experts", "K/V", "state", "activations", "runtime", "free"]
    assert plan.capacity.concurrency == 21
    assert parts["K/V"] == 21 * 2.5 * GiB
    assert parts["experts"] == 60 * GiB
    assert parts["state"] == 21 * plan.capacity.state_bytes_per_sequence
    assert sum(parts.values()) == pytest.approx(plan.hardware.memory_bytes)
    assert parts["free"] >= plan.hardware.memory_bytes * (1 - plan.deployment.gpu_memory_utilization)


def test_curve_passes_through_the_plan_and_falls_with_the_context():
    plan = _plan(context_length=100000)
    curve = fit_curve(plan)
    assert [p.context_length for p in curve] == [1024 * 2**i for i in range(7)] + [100000, 131072]
    at_plan = next(p for p in curve if p.context_length == 100000)
    assert at_plan.sequences == sequences_that_fit(plan) == plan.capacity.max_seqs_by_kv
    assert at_plan.full_attention_sequences == plan.capacity.full_attention_max_seqs
    for shorter, longer in zip(curve, curve[1:]):
        assert longer.sequences <= shorter.sequences
        assert longer.full_attention_sequences <= shorter.full_attention_sequences
    # at 128K a full-attention Clover holds 4x the K/V per sequence (40 layers instead of 10): far fewer fit
    last = curve[-1]
    assert last.full_attention_sequences is not None and last.full_attention_sequences * 4 <= last.sequences


def test_replicas_multiply_the_sequences_and_full_attention_models_have_one_curve():
    one, four = _plan(context_length=32768), _plan(context_length=32768, num_gpus=4)
    assert sequences_that_fit(four) == 4 * sequences_that_fit(one)
    assert fit_curve(four)[0].sequences == 4 * fit_curve(one)[0].sequences
    sdar = build_plan(PlanOptions(model="SDAR-30B-A3B", hardware="H200"))
    assert all(point.full_attention_sequences is None for point in fit_curve(sdar))


def test_a_short_context_starts_the_curve_there():
    plan = _plan(context_length=512)
    assert context_lengths(plan)[0] == 512
