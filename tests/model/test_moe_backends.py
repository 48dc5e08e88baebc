"""The fast expert backends against the per-expert loop (the reference): padded bmm in fp32 and bf16, with idle
experts, one token, and uneven runs; `auto`'s choice; the engine's tokens with each backend at temperature 0."""

from __future__ import annotations

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.config import EngineConfig
from diffuserve.model.layers.moe import dispatch
from diffuserve.model.layers.moe.dispatch import check_backend, prefers_bmm, run_experts
from diffuserve.model.layers.moe.layer import SparseMoeBlock, set_moe_backend, softmax_topk


def _case(num_tokens: int, experts: int, top_k: int, dtype: torch.dtype, idle: int = 0, seed: int = 0):
    """Routing over the first `experts - idle` experts only (the rest stay idle)."""
    g = torch.Generator().manual_seed(seed)
    hidden, inter = 32, 16
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.3).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=g) * 0.3).to(dtype)
    weights, ids = softmax_topk(torch.randn(num_tokens, experts - idle, generator=g), top_k, norm_topk_prob=True)
    return x, weights.to(dtype), ids, gate_up, down


@pytest.mark.parametrize(
    ("num_tokens", "experts", "top_k", "idle"),
    [(1, 4, 2, 0), (37, 6, 2, 1), (64, 8, 3, 0), (128, 16, 2, 5), (5, 16, 4, 0)],
)
def test_bmm_matches_the_loop_in_fp32(num_tokens, experts, top_k, idle):
    case = _case(num_tokens, experts, top_k, torch.float32, idle)
    loop = run_experts("loop", *case)
    for backend in ("bmm", "auto", "grouped_mm"):  # grouped_mm: the loop where PyTorch has no fast kernel
        assert torch.allclose(run_experts(backend, *case), loop, atol=1e-5, rtol=1e-5), backend


def test_bmm_matches_the_loop_in_bf16_with_fp32_routing_weights():
    x, weights, ids, gate_up, down = _case(96, 8, 2, torch.bfloat16)
    loop = run_experts("loop", x, weights.float(), ids, gate_up, down)
    fast = run_experts("bmm", x, weights.float(), ids, gate_up, down)
    assert fast.dtype == loop.dtype == torch.bfloat16
    assert torch.allclose(fast.float(), loop.float(), atol=2e-2)


def test_auto_on_cpu_uses_bmm_for_spread_bf16_routing_only(monkeypatch):
    calls = []
    original = dispatch.padded_bmm_experts
    monkeypatch.setattr(dispatch, "padded_bmm_experts", lambda *a: calls.append(1) or original(*a))
    run_experts("auto", *_case(64, 8, 2, torch.float32))  # fp32 on CPU: the loop (docs/serving/moe.md)
    assert calls == []
    run_experts("bmm", *_case(64, 8, 2, torch.float32))
    assert calls == [1]
    x, weights, ids, gate_up, down = _case(64, 8, 2, torch.bfloat16)
    run_experts("auto", x, weights, ids, gate_up, down)  # bf16, every expert touched, runs of similar length
    assert calls == [1, 1]
    few = torch.stack([ids[:, 0] % 3, ids[:, 0] % 3 + 3], dim=1)  # 6 of 8 experts touched, uneven runs: bmm
    run_experts("auto", x, weights, few, gate_up, down)
    assert calls == [1, 1, 1]
    run_experts("auto", x, weights, ids % 3, gate_up, down)  # 3 of 8 touched: the loop
    assert calls == [1, 1, 1]


def test_auto_rule_wants_most_experts_touched_and_on_cuda_little_padding():
    assert prefers_bmm(16, touched=16, longest=8, assignments=64, on_cuda=True)  # 128 padded rows for 64: 2x
    assert not prefers_bmm(16, touched=16, longest=9, assignments=64, on_cuda=True)  # 144 rows: over 2x
    assert prefers_bmm(16, touched=16, longest=9, assignments=64, on_cuda=False)  # bf16 on CPU: padding is cheap
    assert not prefers_bmm(16, touched=7, longest=2, assignments=14, on_cuda=False)  # under half touched


def test_unknown_backend_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="moe_backend: 'fast' is not one of auto, loop, bmm, grouped_mm"):
        check_backend("fast")
    with pytest.raises(ValueError, match="moe_backend: must be auto, loop, bmm or grouped_mm, got 'fast'"):
        EngineConfig("m", moe_backend="fast")


def test_set_moe_backend_reaches_every_moe_layer():
    model = torch.nn.Sequential(SparseMoeBlock(8, 4, 2, 4, True), SparseMoeBlock(8, 4, 2, 4, True))
    set_moe_backend(model, "bmm")
    assert [m.backend for m in model] == ["bmm", "bmm"]


def test_engine_tokens_match_the_loop_backend(tiny_model_dir_b32):
    backend = "bmm"
    prompts = [[(7 * i + j) % 250 + 1 for j in range(5 + 9 * i)] for i in range(4)]
    params = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.0)
    outs = {}
    for name in ("loop", backend):
        llm = LLM(str(tiny_model_dir_b32), num_pages=256, max_num_seqs=4, moe_backend=name, enforce_eager=True)
        outs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outs["loop"] == outs[backend]
