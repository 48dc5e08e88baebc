"""The FlashInfer adapter (attention_backends/flashinfer.py) against a contract double of FlashInfer, on the CPU.

FlashInfer cannot run here (CUDA kernels). The double implements what FlashInfer documents for
`BatchPrefillWithPagedKVCacheWrapper` (flashinfer/prefill.py docstrings, docs "KV layout" / "mask layout"), as
plain loops written for this test:
  - `plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
    head_dim_qk, page_size, ..., custom_mask=None, causal=False, sm_scale=None, q_data_type, kv_data_type)`:
    request i has qo_indptr[i+1] - qo_indptr[i] queries and page_size * (pages - 1) + last_page_len keys read
    from its pages in order; `custom_mask` is every request's [qo_len, kv_len] bool mask flattened row-major and
    concatenated (False = masked out); `causal` (no custom mask) is bottom-right aligned; sm_scale defaults to
    1 / sqrt(head_dim); `backend="auto"` is fixed at the first plan (fa3 here, as on Hopper), and fa3 refuses a
    custom mask;
  - `run(q, (k_cache, v_cache))`: q [qo_indptr[-1], Hq, D] of the planned dtype (float16 / bfloat16 only), caches
    NHD [num_pages, page_size, Hkv, D]; query head h reads KV head h // (Hq / Hkv) -> [qo_indptr[-1], Hq, D].
The selection's device check (`selection.is_cuda`) is forced where the adapter must be chosen.
"""

from __future__ import annotations

import math
import subprocess
import sys
import types

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.config import EngineConfig
from diffuserve.model.layers.attention import Attention, paged_attention
from diffuserve.model.layers.attention_backends import flashinfer as adapter
from diffuserve.model.layers.attention_backends import selection
from diffuserve.model.layers.attention_backends.batched import BatchedBackend
from diffuserve.model.layers.attention_backends.flashinfer import FlashInferBackend
from diffuserve.model.layers.attention_backends.interface import PagedAttentionInputs
from diffuserve.reference.attention_steps import AttentionStep, StepShape, random_step
from tests.engine.test_oracle_mutations import apply_source_mutation
from tests.model.test_attention_backends import MIXES, SCALE, oracle

HALF = (torch.float16, torch.bfloat16)


class FakeWrapper:
    def __init__(self, calls: list[str], float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", **kwargs):
        assert float_workspace_buffer.dtype == torch.uint8 and kv_layout in ("NHD", "HND")
        assert set(kwargs) <= {"use_cuda_graph", "backend"}, kwargs
        self.calls, self.layout, self.backend = calls, kv_layout, kwargs.get("backend", "auto")

    def plan(
        self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
        head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
        pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
        rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
    ):  # fmt: skip
        self.calls.append(f"plan:{self.backend}:{'masked' if custom_mask is not None else 'plain'}")
        if self.backend == "auto":
            self.backend = "fa3"  # fixed at the first plan, as on an SM90 device
        if self.backend == "fa3" and custom_mask is not None:
            raise NotImplementedError("fa3 takes no custom mask")
        for t in (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len):
            assert t.dtype == torch.int32 and t.dim() == 1
        batch = len(qo_indptr) - 1
        assert len(paged_kv_indptr) == batch + 1 and len(paged_kv_last_page_len) == batch
        assert len(paged_kv_indices) == int(paged_kv_indptr[-1]) and num_qo_heads % num_kv_heads == 0
        last = paged_kv_last_page_len.tolist()
        assert all(1 <= n <= page_size for n in last)
        pages = paged_kv_indptr.tolist()
        self.kv_lens = [page_size * (pages[i + 1] - pages[i] - 1) + last[i] for i in range(batch)]
        self.qo = qo_indptr.tolist()
        self.indices, self.pages = paged_kv_indices.tolist(), pages
        if custom_mask is not None:
            sizes = [(self.qo[i + 1] - self.qo[i]) * self.kv_lens[i] for i in range(batch)]
            assert custom_mask.dtype == torch.bool and custom_mask.numel() == sum(sizes)
        self.mask, self.causal = custom_mask, causal
        self.heads = (num_qo_heads, num_kv_heads, head_dim_qk, page_size)
        self.scale = sm_scale if sm_scale is not None else 1 / math.sqrt(head_dim_qk)
        self.dtypes = (q_data_type, kv_data_type if kv_data_type is not None else q_data_type)

    def run(self, q, paged_kv_cache):
        self.calls.append("run")
        k_cache, v_cache = paged_kv_cache
        num_qo_heads, num_kv_heads, head_dim, page_size = self.heads
        assert q.dtype in HALF and (q.dtype, k_cache.dtype) == self.dtypes and v_cache.dtype == k_cache.dtype
        assert q.shape == (self.qo[-1], num_qo_heads, head_dim)
        assert k_cache.dim() == 4 and k_cache.shape[1:] == (page_size, num_kv_heads, head_dim)
        out = torch.zeros(q.shape, dtype=torch.float32)
        mask_offset = 0
        for i in range(len(self.qo) - 1):
            qo_len, kv_len = self.qo[i + 1] - self.qo[i], self.kv_lens[i]
            tokens = [(p, t) for p in self.indices[self.pages[i] : self.pages[i + 1]] for t in range(page_size)]
            tokens = tokens[:kv_len]
            if self.mask is not None:
                mask = self.mask[mask_offset : mask_offset + qo_len * kv_len].view(qo_len, kv_len)
                mask_offset += qo_len * kv_len
            elif self.causal:
                mask = torch.ones(qo_len, kv_len, dtype=torch.bool).tril(kv_len - qo_len)
            else:
                mask = torch.ones(qo_len, kv_len, dtype=torch.bool)
            for h in range(num_qo_heads):
                kv_head = h // (num_qo_heads // num_kv_heads)
                keys = torch.stack([k_cache[p, t, kv_head] for p, t in tokens]).float()
                values = torch.stack([v_cache[p, t, kv_head] for p, t in tokens]).float()
                for r in range(qo_len):
                    scores = (keys @ q[self.qo[i] + r, h].float()) * self.scale
                    weights = scores.masked_fill(~mask[r], float("-inf")).softmax(dim=0)
                    out[self.qo[i] + r, h] = weights @ values
        return out.to(q.dtype)


def fake_flashinfer(calls: list[str]) -> types.ModuleType:
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithPagedKVCacheWrapper = lambda *a, **k: FakeWrapper(calls, *a, **k)  # type: ignore[attr-defined]
    return module


def _half(step: AttentionStep, dtype: torch.dtype = torch.bfloat16) -> AttentionStep:
    base = step.inputs
    inputs = PagedAttentionInputs(
        base.slot_mapping, base.sequences, [base.k_caches[0].to(dtype)], [base.v_caches[0].to(dtype)]
    )
    return AttentionStep(step.q.to(dtype), step.k.to(dtype), step.v.to(dtype), inputs)


def _attend(backend, step: AttentionStep, layers: int = 1) -> torch.Tensor:
    for _ in range(layers):
        out = paged_attention(step.q, step.k, step.v, step.inputs, 0, SCALE, backend)
    return out


def _close(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """Within bfloat16's rounding of the output (an indexing mistake is off by O(1))."""
    return bool(((out.double() - expected).abs() <= 2e-2 + 1e-2 * expected.abs()).all())


@pytest.mark.parametrize("mix", list(MIXES))
def test_the_adapter_matches_the_oracle(mix):
    calls: list[str] = []
    backend = FlashInferBackend(fake_flashinfer(calls))
    for seed in range(2):
        step = _half(random_step(MIXES[mix], StepShape(padding_rows=2), seed))
        expected, k_expected, _ = oracle(step)
        out = _attend(backend, step, layers=2)
        assert _close(out, expected) and torch.equal(step.inputs.k_caches[0], k_expected)
    masked = any(s.mask is not None for s in step.inputs.sequences)
    assert [c.split(":")[0] for c in calls] == ["plan", "run", "run"] * 2  # one plan per step, every layer runs
    assert all(c.endswith("fa2:masked") if masked else c.endswith("plain") for c in calls if c != "run")


def test_masked_and_plain_steps_use_separate_wrappers():
    """A plain step first (auto -> fa3, fixed), then a masked one: its own fa2 wrapper takes the custom mask."""
    calls: list[str] = []
    backend = FlashInferBackend(fake_flashinfer(calls))
    for mix in ("sdar-blocks", "prefill-fused-blocks", "sdar-blocks"):
        step = _half(random_step(MIXES[mix], StepShape(), 0))
        assert _close(_attend(backend, step), oracle(step)[0])
    assert calls == ["plan:auto:plain", "run", "plan:fa2:masked", "run", "plan:fa3:plain", "run"]


def test_sequences_out_of_row_order_are_gathered():
    step = _half(random_step(MIXES["everything"], StepShape(), 4))
    base = step.inputs
    reordered = PagedAttentionInputs(base.slot_mapping, base.sequences[::-1], base.k_caches, base.v_caches)
    out = _attend(FlashInferBackend(fake_flashinfer([])), AttentionStep(step.q, step.k, step.v, reordered))
    assert _close(out, oracle(step)[0])


def test_a_transposed_custom_mask_fails(monkeypatch):
    apply_source_mutation(monkeypatch, adapter, "flat.append(mask.reshape(-1))", "flat.append(mask.t().reshape(-1))")
    step = _half(random_step(MIXES["everything"], StepShape(), 5))
    assert not _close(_attend(FlashInferBackend(fake_flashinfer([])), step), oracle(step)[0])


def test_selection(monkeypatch):
    cpu = torch.device("cpu")
    with pytest.raises(
        ValueError, match=r"^attention_backend: flashinfer needs a CUDA device, the model is on cpu; use"
    ):
        selection.select("flashinfer", cpu, torch.bfloat16)
    assert isinstance(selection.select("auto", cpu, torch.bfloat16), BatchedBackend)
    monkeypatch.setattr(selection, "is_cuda", lambda device: True)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # installed nowhere: the import fails
    assert isinstance(selection.select("auto", cpu, torch.bfloat16), BatchedBackend)
    with pytest.raises(ValueError) as missing:
        selection.select("flashinfer", cpu, torch.bfloat16)
    message = str(missing.value)
    assert "\n" not in message
    assert message.startswith("attention_backend: flashinfer does not import (ModuleNotFoundError")
    assert "diffuserve[cuda-kernels]" in message and "--attention-backend auto or batched" in message
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer([]))
    assert isinstance(selection.select("auto", cpu, torch.bfloat16), FlashInferBackend)
    assert isinstance(selection.select("auto", cpu, torch.float32), BatchedBackend)
    with pytest.raises(ValueError, match=r"^attention_backend: flashinfer computes in float16 or bfloat16, the model"):
        selection.select("flashinfer", cpu, torch.float32)
    with pytest.raises(ValueError, match=r"^attention_backend: 'xformers' is not one of auto, loop, batched, flash"):
        selection.select("xformers", cpu, torch.float32)
    with pytest.raises(ValueError, match=r"^attention_backend: must be auto, loop, batched or flashinfer, got 'x'"):
        EngineConfig(model="m", attention_backend="x")


def test_the_engine_runs_the_adapter(monkeypatch, tiny_model_dir):
    """`--attention-backend flashinfer` reaches every attention layer, and greedy tokens equal the loop's (bf16)."""
    monkeypatch.setattr(selection, "is_cuda", lambda device: True)
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer(calls))
    prompts = [{"prompt_token_ids": list(range(1 + 5 * i, 12 + 9 * i))} for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    tokens = {}
    for name in ("loop", "flashinfer"):
        llm = LLM(str(tiny_model_dir), dtype="bfloat16", attention_backend=name, max_model_len=128, num_pages=64)
        layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, Attention)]
        assert layers and all(m.attention_backend.name == name for m in layers)
        tokens[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert tokens["flashinfer"] == tokens["loop"] and "plan:fa2:masked" in calls


def test_the_cli_refuses_flashinfer_on_the_cpu_in_one_line(tiny_model_dir):
    command = [sys.executable, "-m", "diffuserve", "generate", "--model", str(tiny_model_dir), "--device", "cpu"]
    result = subprocess.run(
        [*command, "--attention-backend", "flashinfer", "hi"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "attention_backend: flashinfer needs a CUDA device, the model is on cpu" in result.stderr
