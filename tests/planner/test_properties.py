"""Monotonicity the planner must never violate, checked over random inputs (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from diffuserve.planner.hardware import custom_hardware
from diffuserve.planner.inputs import Deployment, Efficiency, Workload
from diffuserve.planner.model_presets import load_model
from diffuserve.planner.params import count_parameters
from diffuserve.planner.plan import evaluate_memory
from diffuserve.planner.roofline import Roofline
from diffuserve.planner.units import GiB
from tests.planner.toy import toy_spec

SPECS = {"toy": toy_spec(), "gemma": load_model("DiffusionGemma-26B-A4B")[0]}
spec_names = st.sampled_from(sorted(SPECS))
memories = st.integers(min_value=1 * GiB, max_value=400 * GiB)
contexts = st.integers(min_value=16, max_value=8192)
fp8_kv = st.booleans()


def _capacity(name: str, memory: int, context: int, kv_fp8: bool) -> int:
    spec = SPECS[name]
    workload = Workload(
        context_length=context, prompt_tokens=context // 2, output_tokens=context // 4, block_length=spec.block_length
    )
    deployment = Deployment(kv_dtype="fp8" if kv_fp8 else "bf16")
    hardware = custom_hardware(memory, 1e12, 1e14)
    _, capacity = evaluate_memory(spec, count_parameters(spec), hardware, deployment, workload)
    return capacity.max_seqs_by_kv


@settings(max_examples=60, deadline=None)
@given(spec_names, memories, memories, contexts, fp8_kv)
def test_more_memory_never_lowers_capacity(name, memory_a, memory_b, context, kv_fp8):
    low, high = sorted((memory_a, memory_b))
    assert _capacity(name, low, context, kv_fp8) <= _capacity(name, high, context, kv_fp8)


@settings(max_examples=60, deadline=None)
@given(spec_names, memories, contexts, contexts, fp8_kv)
def test_longer_context_never_raises_capacity(name, memory, context_a, context_b, kv_fp8):
    short, long = sorted((context_a, context_b))
    assert _capacity(name, memory, short, kv_fp8) >= _capacity(name, memory, long, kv_fp8)


@settings(max_examples=60, deadline=None)
@given(
    spec_names,
    st.floats(min_value=0.1, max_value=16.0),
    st.floats(min_value=0.1, max_value=16.0),
    st.integers(min_value=1, max_value=64),
    contexts,
)
def test_more_tpf_never_lowers_throughput(name, tpf_a, tpf_b, concurrency, context):
    spec = SPECS[name]
    low, high = sorted((min(tpf_a, spec.block_length), min(tpf_b, spec.block_length)))
    params = count_parameters(spec)
    hardware = custom_hardware(400 * GiB, 1e12, 1e14)
    base = Workload(
        context_length=context,
        prompt_tokens=context // 2,
        output_tokens=context // 4,
        block_length=spec.block_length,
        tpf=low,
    )
    memory, _ = evaluate_memory(spec, params, hardware, Deployment(), base)
    roofline = Roofline(spec, params, hardware, Deployment(), Efficiency(), memory)
    slow = roofline.decode(base, concurrency)
    fast = roofline.decode(replace(base, tpf=high), concurrency)
    assert slow.tokens_per_s_total <= fast.tokens_per_s_total
    assert slow.tokens_per_s_per_seq <= fast.tokens_per_s_per_seq
