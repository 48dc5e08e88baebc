"""Capacity (max sequences at the context, max context at the concurrency) and bad-input messages."""

from __future__ import annotations

import pytest

from diffuserve.planner.hardware import custom_hardware, get_hardware
from diffuserve.planner.inputs import CostInputs, Deployment, Efficiency, Workload
from diffuserve.planner.model_presets import load_model
from diffuserve.planner.plan import make_plan
from diffuserve.planner.units import GiB
from tests.planner.toy import toy_spec

HW = custom_hardware(2 * GiB, 1e12, 100e12)
COSTS = CostInputs(gpu_hour_price=2.0, capex_per_gpu=10_000)


def _deployment(**changes):
    return Deployment(
        **{"gpu_memory_utilization": 0.5, "activation_bytes": 50_331_648, "runtime_overhead_bytes": 0, **changes}
    )


def _plan(context=4096, concurrency=None, spec=None, hardware=HW, **deployment):
    workload = Workload(
        context_length=context,
        prompt_tokens=context // 2,
        output_tokens=context // 4,
        block_length=16,
        tpf=2.0,
        concurrency=concurrency,
    )
    return make_plan(spec or toy_spec(), hardware, _deployment(**deployment), workload, Efficiency(), COSTS)


def test_max_sequences_by_hand():
    """Usable 2 GiB x 0.5 = 1,073,741,824; minus weights 125,816,832 and activations 50,331,648 -> pool
    897,593,344 B. One 4096-token sequence: 4096 x 4096 B = 16,777,216 -> floor(53.5) = 53 sequences."""
    plan = _plan()
    assert plan.memory.kv_pool_bytes == 897_593_344
    assert plan.capacity.kv_bytes_per_sequence == 16_777_216
    assert plan.capacity.max_seqs_by_kv == 53
    assert plan.capacity.concurrency == 53 and plan.capacity.max_concurrency == 53


def test_max_context_at_concurrency_by_hand():
    """50 sequences: pool / 50 = 17,951,866.88 B each / 4096 B per token = 4382.8 tokens -> 273 whole pages of
    16 = 4368 tokens."""
    plan = _plan(concurrency=50)
    assert plan.capacity.max_context_at_concurrency == 4368


def test_replicas_multiply_capacity():
    plan = _plan(num_gpus=2)
    assert plan.capacity.num_replicas == 2 and plan.capacity.max_concurrency == 106


def test_too_many_sequences_names_numbers_and_fixes():
    """60 x 16 MiB = 960 MiB of KV vs a 856 MiB pool: suggests fewer sequences (53), a shorter context
    (897,593,344 / 60 / 4096 = 3652.3 tokens -> 228 pages of 16 = 3648) and FP8 KV."""
    with pytest.raises(ValueError) as error:
        _plan(concurrency=60)
    message = str(error.value)
    assert "60 sequences of 4096 tokens" in message and "960.0 MiB" in message and "53 fit" in message
    assert "--concurrency 53" in message
    assert "--context-length 3648" in message
    assert "--kv-cache-dtype fp8" in message


def test_model_that_does_not_fit_suggests_more_gpus_and_fp8():
    """LLaDA2.0-flash in bf16 (191.6 GiB) on one H100: 4 GPUs at tp 4, or 2 with FP8 weights."""
    spec, _ = load_model("LLaDA2.0-flash")
    workload = Workload(context_length=32768, prompt_tokens=31744, output_tokens=1024, block_length=32)
    with pytest.raises(ValueError) as error:
        make_plan(spec, get_hardware("H100"), Deployment(), workload, Efficiency(), COSTS)
    message = str(error.value)
    assert "191.6 GiB" in message and "exceed the usable 71.68 GiB" in message
    assert "--num-gpus 4 --tensor-parallel-size 4" in message and "--num-gpus 2" in message


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(context_length=0), "context_length: must be > 0"),
        (dict(tpf=-1.0), "tpf: must be > 0"),
        (dict(tpf=17.0), "exceeds the block length 16"),
        (dict(prompt_tokens=5000), "exceeds context_length 4096"),
        (dict(experts_touched_fraction=1.5), r"experts_touched_fraction: must be in \(0, 1\]"),
    ],
)
def test_bad_workload_values(changes, match):
    values = dict(context_length=4096, prompt_tokens=2048, output_tokens=1024, block_length=16)
    with pytest.raises(ValueError, match=match):
        Workload(**{**values, **changes})


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(num_gpus=0), "num_gpus: must be > 0"),
        (dict(gpu_memory_utilization=1.2), "gpu_memory_utilization"),
        (dict(weight_dtype="int3"), "weight_dtype: 'int3' is not one of"),
    ],
)
def test_bad_deployment_values(changes, match):
    with pytest.raises(ValueError, match=match):
        Deployment(**changes)


def test_context_above_model_maximum():
    with pytest.raises(ValueError, match=r"exceeds toy's maximum of 8192 tokens.*--context-length 8192"):
        _plan(context=16384)


@pytest.mark.parametrize(
    "deployment, match",
    [
        (dict(num_gpus=3, tensor_parallel_size=3), "does not divide the 8 attention heads"),
        (dict(num_gpus=6, expert_parallel_size=6), "does not divide the 8 experts"),
        (dict(num_gpus=4, tensor_parallel_size=2), None),
        (dict(num_gpus=2, tensor_parallel_size=4), "tensor_parallel_size: 4 does not divide num_gpus 2"),
    ],
)
def test_parallel_sizes_must_divide_heads_and_experts(deployment, match):
    if match is None:
        assert _plan(**deployment).capacity.num_replicas == 2
    else:
        with pytest.raises(ValueError, match=match):
            _plan(**deployment)
