"""The FlashInfer attention backend ("flashinfer", CUDA only, `pip install flashinfer-python`): the whole step in
one varlen paged-prefill kernel call per layer, `BatchPrefillWithPagedKVCacheWrapper`.

How our metadata meets FlashInfer's documented contract (flashinfer/prefill.py, docs "KV layout" and "mask
layout"; tests/model/test_attention_backends_flashinfer.py checks the adapter against a double of it):

  - pages of one slot: our cache [num_slots, Hkv, D] is FlashInfer's NHD paged cache [num_slots, 1, Hkv, D], so
    a sequence's key slots are its `paged_kv_indices` as they are (prompt scoring's variants read a prefix then
    scratch slots, which no page table of larger pages could say), `paged_kv_last_page_len` is 1;
  - `qo_indptr` / `paged_kv_indptr` are the sequences' cumulative query and key lengths (host tensors: planning
    reads them on the CPU); queries are gathered in sequence order when the batch has them otherwise;
  - masks: a step where some sequence has a mask passes `custom_mask`, every sequence's [Lq, L] mask flattened
    row-major and concatenated (all True for a sequence without one); others plan no mask (`causal=False`).
    A masked step plans on the "fa2" kernels: `backend="auto"` fixes its choice at the first plan (fa3 on
    Hopper), and fa3 takes no custom mask;
  - the plan depends on the step only: it is made by the first layer (`PagedAttentionInputs.derived`) and every
    layer then calls `run` with its own cache, as FlashInfer's wrapper is meant to be used.

FlashInfer computes in float16 / bfloat16 only; `selection` refuses it for other dtypes. Knows nothing of requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch

from diffuserve.model.layers.attention_backends.interface import AttentionBackend, PagedAttentionInputs, SequenceSlice

WORKSPACE_BYTES = 128 << 20
"""FlashInfer's recommended float workspace (split-k partial results), one per device, shared by the wrappers."""


@dataclass(frozen=True)
class PlannedStep:
    wrapper: Any
    """The FlashInfer wrapper planned for this step."""
    rows: torch.Tensor | None
    """[N] long: batch rows in sequence order; None when the sequences already lie in row order from row 0."""


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self, flashinfer: Any) -> None:
        """`flashinfer`: the imported package (a contract double in the tests)."""
        self._flashinfer = flashinfer
        self._workspaces: dict[torch.device, torch.Tensor] = {}
        self._wrappers: dict[tuple[Any, ...], Any] = {}

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: PagedAttentionInputs, scale: float
    ) -> torch.Tensor:
        num_rows, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[1]
        shape = (num_heads, num_kv_heads, head_dim, q.dtype, k_cache.dtype, scale)
        step = inputs.derived((self.name, *shape), lambda: self._plan(inputs.sequences, shape, q.device))
        queries = q if step.rows is None else q.index_select(0, step.rows)
        paged = (k_cache.view(-1, 1, num_kv_heads, head_dim), v_cache.view(-1, 1, num_kv_heads, head_dim))
        o = step.wrapper.run(queries, paged).reshape(num_rows, num_heads * head_dim)  # [N, Hq * D]
        if step.rows is None:
            return o
        return torch.empty_like(o).index_copy_(0, step.rows, o)

    def _plan(self, sequences: tuple[SequenceSlice, ...], shape: tuple[Any, ...], device: torch.device) -> PlannedStep:
        num_heads, num_kv_heads, head_dim, q_dtype, kv_dtype, scale = shape
        q_lens = [s.query_len for s in sequences]
        kv_lens = [s.num_keys for s in sequences]
        masked = any(s.mask is not None for s in sequences)
        wrapper = self._wrapper((*shape, masked), device)
        wrapper.plan(
            torch.tensor([0, *accumulate(q_lens)], dtype=torch.int32),
            torch.tensor([0, *accumulate(kv_lens)], dtype=torch.int32),
            torch.cat([s.key_slots for s in sequences]).to(torch.int32),
            torch.ones(len(sequences), dtype=torch.int32),
            num_heads,
            num_kv_heads,
            head_dim,
            1,
            custom_mask=custom_mask(sequences) if masked else None,
            causal=False,
            sm_scale=scale,
            q_data_type=q_dtype,
            kv_data_type=kv_dtype,
        )
        if [s.query_start for s in sequences] == [0, *accumulate(q_lens)][:-1]:
            return PlannedStep(wrapper, None)
        rows = [torch.arange(s.query_start, s.query_start + s.query_len) for s in sequences]
        return PlannedStep(wrapper, torch.cat(rows).to(device))

    def _wrapper(self, key: tuple[Any, ...], device: torch.device) -> Any:
        """One wrapper per layer shape and mask use (a wrapper holds one plan at a time)."""
        if key not in self._wrappers:
            if device not in self._workspaces:
                self._workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            backend = "fa2" if key[-1] else "auto"
            self._wrappers[key] = self._flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                self._workspaces[device], "NHD", backend=backend
            )
        return self._wrappers[key]


def custom_mask(sequences: tuple[SequenceSlice, ...]) -> torch.Tensor:
    """[sum(Lq * L)] bool: every sequence's mask flattened row-major, one after another (FlashInfer's layout)."""
    flat = []
    for s in sequences:
        mask = s.mask
        if mask is None:
            mask = torch.ones(s.query_len, s.num_keys, dtype=torch.bool, device=s.keys.device)
        flat.append(mask.reshape(-1))
    return torch.cat(flat)
