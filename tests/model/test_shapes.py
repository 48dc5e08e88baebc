"""model/shapes.py: the cache arithmetic of every kind, and the one-function rule: the engine's cache sizing, the
planner and the bench all take their K/V and state bytes from the same spec methods, so patching one method moves
all three (they agree by construction, not by three copies compared)."""

from __future__ import annotations

import dataclasses

import pytest

from diffuserve.bench.flops import model_cost
from diffuserve.model.families.clover_moe.config import cache_layout, clover_moe_args_from_hf
from diffuserve.model.shapes import CacheLayout, CanvasState, PagedKV, RecurrentState, SlidingWindowKV, attention_layout
from diffuserve.planner.inputs import Deployment
from diffuserve.planner.memory import kv_bytes_per_sequence, kv_bytes_per_token
from diffuserve.planner.model_spec import spec_from_config
from diffuserve.planner.recurrent_state import state_bytes_per_sequence
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config
from diffuserve.worker.cache.allocation import slot_bytes_for

GDN = RecurrentState(num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4)


def test_each_kind_counts_its_bytes_per_rank():
    kv = PagedKV(num_kv_heads=2, head_dim=256, dtype="bf16")
    assert kv.bytes_per_token() == 2 * 2 * 256 * 2
    assert kv.bytes_per_token(2) == 2 * 256 * 2
    assert kv.bytes_per_token(4) == kv.bytes_per_token(2)  # 2 KV heads over 4 ranks: each keeps one (replicated)
    assert PagedKV(2, 256, "fp8").bytes_per_token() == kv.bytes_per_token() // 2
    assert GDN.bytes_per_sequence() == 32 * 128 * 128 * 4 + 3 * 8192 * 2
    assert GDN.bytes_per_sequence(2) * 2 == GDN.bytes_per_sequence()
    assert GDN.conv_dim(4) == 8192 // 4


def test_a_window_keeps_the_window_and_the_block_in_whole_pages():
    window = SlidingWindowKV(8, 128, "bf16", window=1000)
    assert window.tokens_kept(context=100, block_length=32, page_size=64) == 128
    assert window.tokens_kept(context=100_000, block_length=32, page_size=64) == 1088  # ceil((1000 + 32) / 64) pages
    assert PagedKV(8, 128).tokens_kept(100_000, 32, 64) == 100_032


def test_layout_groups_and_indices():
    layout = cache_layout(clover_moe_args_from_hf(make_clover_moe_config(num_hidden_layers=8)), "fp32")
    assert layout.groups == ["state", "kv"]
    assert layout.group_layers("kv") == [3, 7] and layout.index_in_group(7) == 1
    assert layout.kv_bytes_per_token() == 2 * layout.paged("kv")[0].bytes_per_token()
    assert layout.state_bytes_per_sequence() == 6 * layout.recurrent[0].bytes_per_sequence()
    assert attention_layout(3, 4, 8, "bf16") == CacheLayout((PagedKV(4, 8, "bf16"),) * 3)


def test_every_layout_transform_keeps_every_other_field():
    """Each `with_*` transform changes what it names and keeps every other field of the layout (a transform that
    rebuilt the layout from `layers` alone dropped DiffusionGemma's canvas under `--kv-cache-dtype fp8`)."""
    layout = CacheLayout((GDN, PagedKV(2, 8, "bf16"), SlidingWindowKV(2, 8, "bf16", window=16)), CanvasState(8, 4))
    assert all(f.name == "layers" or getattr(layout, f.name) is not None for f in dataclasses.fields(layout))
    transforms = {name: getattr(layout, name) for name in dir(CacheLayout) if name.startswith("with_")}
    assert set(transforms) == {"with_kv_dtype"}, "a new transform: give it an argument below"
    changed = transforms["with_kv_dtype"]("fp8")
    assert [getattr(s, "dtype", None) for s in changed.layers] == [None, "fp8", "fp8"]
    for field in dataclasses.fields(layout):
        if field.name != "layers":
            assert getattr(changed, field.name) == getattr(layout, field.name), field.name


def test_engine_planner_and_bench_share_one_function(monkeypatch):
    config = make_clover_moe_config(num_hidden_layers=8)
    args = clover_moe_args_from_hf(config)
    spec = spec_from_config(config)
    monkeypatch.setattr(PagedKV, "bytes_per_token", lambda self, tp=1: 1000 * tp)
    monkeypatch.setattr(RecurrentState, "bytes_per_sequence", lambda self, tp=1: 7 * tp)
    deployment = Deployment()
    assert kv_bytes_per_token(deployment, spec.attention[0]) == 2 * 1000  # planner: 2 attention layers
    assert kv_bytes_per_sequence(spec, deployment, 64, 4) == 2 * 1000 * 64
    assert state_bytes_per_sequence(spec, deployment) == 6 * 7  # planner: 6 GDN layers
    cost = model_cost(args, weight_itemsize=4, kv_itemsize=4)
    assert (cost.kv_bytes_per_token, cost.state_bytes_per_seq) == (2 * 1000, 6 * 7)  # bench
    layout = cache_layout(args, "fp32")
    assert slot_bytes_for(layout, args.hidden_size, 1) == 6 * 7 + args.hidden_size * 4  # engine: a slot
    assert layout.kv_bytes_per_token() == 2 * 1000  # engine: a page's bytes per token


@pytest.mark.parametrize("tp", [1, 2])
def test_the_planner_and_the_engine_layout_agree_on_the_published_shape(tp):
    from tests.model.test_clover_moe_config import REAL_SHAPE

    layout = cache_layout(clover_moe_args_from_hf(REAL_SHAPE), "bf16")
    spec, deployment = spec_from_config(REAL_SHAPE), Deployment(num_gpus=tp, tensor_parallel_size=tp)
    assert kv_bytes_per_token(deployment, spec.attention[0]) == layout.kv_bytes_per_token(tp)
    assert state_bytes_per_sequence(spec, deployment) == layout.state_bytes_per_sequence(tp)
