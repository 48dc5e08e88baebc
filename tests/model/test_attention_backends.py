"""The attention backends (loop, batched) against a naive oracle written here, on hand-built steps of every shape
the engine's runners make (diffuserve/reference/attention_steps.py: SDAR blocks, prefill chunks, fused commits,
hybrid commit rows beside whole blocks, autoregressive rows, prompt scoring's variants, bucket padding rows), GQA
and not, named mixes and randomized ones.

The oracle: for each sequence, K/V heads repeated per query head, a float64 softmax over the keys its mask lets a
query see; the step's K/V written into a copy of the cache by plain indexing. Padding rows must come back exactly
zero and the cache must hold exactly the step's K/V at its slots and nothing else new. Mutations of the batched
backend (a padded key made visible, the folded heads' mask rows mis-ordered) must fail the comparison.
"""

from __future__ import annotations

import random

import pytest
import torch

from diffuserve.model.layers.attention import paged_attention
from diffuserve.model.layers.attention_backends import batched
from diffuserve.model.layers.attention_backends.batched import BatchedBackend
from diffuserve.model.layers.attention_backends.interface import PagedAttentionInputs
from diffuserve.model.layers.attention_backends.loop import LoopBackend
from diffuserve.reference.attention_steps import KINDS, AttentionStep, StepShape, random_kinds, random_step
from tests.engine.test_oracle_mutations import apply_source_mutation

ATOL = 1e-5
SCALE = 0.3
BACKENDS = {"loop": LoopBackend, "batched": BatchedBackend}
MIXES = {
    "sdar-blocks": ["block"] * 6,
    "prefill-fused-blocks": ["prefill", "fused", "block", "fused", "prefill", "block", "prefill"],
    "hybrid": ["hybrid", "hybrid", "block", "hybrid", "hybrid"],
    "autoregressive": ["autoregressive"] * 4,
    "scoring": ["block", "fused", "variants", "causal_variants", "variants", "hybrid"],
    "everything": list(KINDS) * 2,
}
HEADS = {"gqa": (4, 2), "mha": (4, 4), "gqa-4": (8, 2), "one-kv-head": (3, 1)}


def oracle(step: AttentionStep, scale: float = SCALE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [N + pad, Hq * D], k_cache, v_cache after the step's write), computed naively in float64."""
    inputs = step.inputs
    k_cache, v_cache = inputs.k_caches[0].clone(), inputs.v_caches[0].clone()
    n = inputs.slot_mapping.shape[0]
    k_cache[inputs.slot_mapping] = step.k[:n].to(k_cache.dtype)
    v_cache[inputs.slot_mapping] = step.v[:n].to(v_cache.dtype)
    heads, head_dim = step.q.shape[1:]
    out = torch.zeros(step.q.shape[0], heads, head_dim, dtype=torch.float64)
    for seq in inputs.sequences:
        rows = slice(seq.query_start, seq.query_start + seq.query_len)
        group = heads // k_cache.shape[1]
        keys = k_cache[seq.key_slots].double().repeat_interleave(group, dim=1)  # [L, Hq, D]
        values = v_cache[seq.key_slots].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", step.q[rows].double(), keys) * scale
        if seq.mask is not None:
            scores = scores.masked_fill(~seq.mask[None], float("-inf"))
        out[rows] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), values)
    return out.flatten(1), k_cache, v_cache


def run(backend_name: str, step: AttentionStep) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, k_cache, v_cache) of paged_attention with `backend_name` on a copy of the step's caches."""
    base = step.inputs
    inputs = PagedAttentionInputs(
        base.slot_mapping, base.sequences, [base.k_caches[0].clone()], [base.v_caches[0].clone()]
    )
    out = paged_attention(step.q, step.k, step.v, inputs, 0, SCALE, BACKENDS[backend_name]())
    return out, inputs.k_caches[0], inputs.v_caches[0]


def assert_matches_oracle(backend_name: str, step: AttentionStep) -> None:
    expected, k_expected, v_expected = oracle(step)
    out, k_cache, v_cache = run(backend_name, step)
    n = step.inputs.slot_mapping.shape[0]
    assert out.shape == expected.shape and out.dtype == step.q.dtype
    assert torch.equal(out[n:], torch.zeros_like(out[n:]))  # bucket padding rows: zeros, no K/V written
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)
    assert (out.double() - expected).abs().max().item() < ATOL


@pytest.mark.parametrize("heads", list(HEADS))
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_backends_match_the_oracle(backend, mix, heads):
    num_heads, num_kv_heads = HEADS[heads]
    shape = StepShape(num_heads=num_heads, num_kv_heads=num_kv_heads, padding_rows=3)
    for seed in range(3):
        assert_matches_oracle(backend, random_step(MIXES[mix], shape, seed))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_randomized_steps_match_the_oracle(backend):
    """Random mixes of 1-12 sequences over random block lengths, page sizes, head counts and padding."""
    rng = random.Random(7)
    for seed in range(60):
        block = rng.choice([1, 2, 4, 8])
        kv_heads = rng.choice([1, 2])
        shape = StepShape(
            block_length=block,
            page_size=block * rng.choice([1, 2, 4]),
            num_heads=kv_heads * rng.choice([1, 2, 3]),
            num_kv_heads=kv_heads,
            head_dim=rng.choice([8, 16]),
            max_blocks=rng.choice([2, 5, 9]),
            padding_rows=rng.choice([0, 0, 1, 7]),
        )
        assert_matches_oracle(backend, random_step(random_kinds(rng, 12), shape, seed))


def test_a_cache_in_another_dtype_is_read_as_the_loop_reads_it():
    """K/V kept in bfloat16 under float32 queries: both backends attend over the same rounded values."""
    step = random_step(MIXES["everything"], StepShape(), 3)
    base = step.inputs
    rounded = AttentionStep(
        step.q,
        step.k,
        step.v,
        PagedAttentionInputs(
            base.slot_mapping, base.sequences, [base.k_caches[0].bfloat16()], [base.v_caches[0].bfloat16()]
        ),
    )
    loop, _, _ = run("loop", rounded)
    batched_out, k_cache, _ = run("batched", rounded)
    assert k_cache.dtype == torch.bfloat16 and batched_out.dtype == torch.float32
    assert (loop - batched_out).abs().max().item() < ATOL


def test_the_batched_plan_is_built_once_per_step(monkeypatch):
    """Every layer of a step reads the groups the first one built; a new step builds its own."""
    builds = []
    real = batched.query_groups
    monkeypatch.setattr(batched, "query_groups", lambda *args: builds.append(1) or real(*args))
    step = random_step(MIXES["everything"], StepShape(), 0)
    backend = BatchedBackend()
    for _ in range(3):
        paged_attention(step.q, step.k, step.v, step.inputs, 0, SCALE, backend)
    assert len(builds) == 1
    fresh = PagedAttentionInputs(
        step.inputs.slot_mapping, step.inputs.sequences, step.inputs.k_caches, step.inputs.v_caches
    )
    paged_attention(step.q, step.k, step.v, fresh, 0, SCALE, backend)
    assert len(builds) == 2


@pytest.mark.parametrize("max_keys", [None, 40, 1])
def test_groups_pad_keys_at_most_twofold_and_stay_within_their_bound(max_keys):
    step = random_step(["block"] * 10 + ["fused"] * 5, StepShape(max_blocks=20), 1)
    groups = batched.query_groups(step.inputs.sequences, 2, max_keys)
    assert sum(g.key_slots.shape[0] for g in groups) == 15
    for g in groups:
        lengths = [s.key_slots.shape[0] for s in step.inputs.sequences if s.query_start in g.rows.tolist()]
        assert max(lengths) <= batched.MAX_KEY_PADDING * min(lengths) and g.key_slots.shape[1] == max(lengths)
        assert max_keys is None or len(lengths) == 1 or g.key_slots.numel() <= max_keys
    if max_keys == 1:
        assert len(groups) == 15


@pytest.mark.parametrize("group_bytes", [1, 6000])
def test_small_cpu_groups_match_the_oracle(monkeypatch, group_bytes):
    """The L2 bound cutting groups into single sequences, or into a few each."""
    monkeypatch.setattr(batched, "CPU_GROUP_BYTES", group_bytes)
    for seed in range(3):
        assert_matches_oracle("batched", random_step(MIXES["everything"], StepShape(padding_rows=1), seed))


@pytest.mark.parametrize(
    "old, new",
    [
        ("< lengths[:, None, None]", "<= lengths[:, None, None]"),  # one padded key made visible
        ("mask.repeat(1, heads_per_kv, 1)", "mask.repeat_interleave(heads_per_kv, dim=1)"),  # folded rows mis-ordered
        ("index = starts[:, None] + ", "index = "),  # every sequence reads the first one's keys from the shared run
    ],
    ids=["padding-off-by-one", "folded-mask-rows", "shared-keys-offset"],
)
def test_mutations_of_the_batched_backend_fail(monkeypatch, old, new):
    apply_source_mutation(monkeypatch, batched, old, new)
    failures = 0
    for seed in range(4):
        try:
            assert_matches_oracle("batched", random_step(MIXES["everything"], StepShape(padding_rows=2), seed))
        except AssertionError:
            failures += 1
    assert failures >= 3
