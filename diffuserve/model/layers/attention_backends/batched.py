"""The batched attention backend ("batched", the default off CUDA kernels): the step's sequences in a few padded
SDPA calls instead of one per sequence, on any device.

Sequences are grouped by query length (a step has few: blocks, fused commits + blocks, prefill chunks, scoring
variants), and a group is cut where its key lists would pad more than 2x, so padding at most doubles the work.
On the CPU a group is also cut where its gathered K/V would outgrow a core's L2 cache (`CPU_GROUP_BYTES`): one
SDPA over a 20 MB gather ran slower than 64 per-sequence calls whose K/V stay cached (docs/benchmarks/throughput.md,
"Batched attention"), so the gain is in the Python and launch overhead of short-context sequences:

    group (Lq, S sequences)   q     [S, Hkv, G * Lq, D]     G query heads of a KV head folded into the length
                              keys  [S, Hkv, L, D]          gathered through a padded slot table [S, L]
                              mask  [S, 1, G * Lq, L]       each sequence's own mask; padded keys never seen

The groups, slot tables and masks are built once per step (`PagedAttentionInputs.derived`) and shared by every
layer; each layer then runs one gather and one SDPA per group. Same maths as the loop backend: a masked key adds
exactly zero to a softmax, so only the order of float sums differs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from diffuserve.model.layers.attention_backends.interface import AttentionBackend, PagedAttentionInputs, SequenceSlice

MAX_KEY_PADDING = 2
"""A group's longest key list is at most this many times its shortest."""
CPU_GROUP_BYTES = 2 << 20
"""On the CPU: the gathered K and V of one group (S * L rows of Hkv * D each), unless one sequence alone has more.
Measured at 1-8 MiB on the development machine (2 MiB: the fastest, 1.3-3x the loop at 16-64 short sequences)."""


@dataclass(frozen=True)
class QueryGroup:
    """Sequences of one query length, padded to the longest key list among them: one SDPA call per layer."""

    query_len: int
    rows: torch.Tensor
    """[S * Lq] long: the batch rows of the group's queries, sequence after sequence."""
    key_slots: torch.Tensor
    """[S, L] long; a padding key reads one of its sequence's own slots and is masked out."""
    mask: torch.Tensor | None
    """[S, 1, G * Lq, L] bool (rows repeated per folded head); None when every query sees all L keys."""


class BatchedBackend(AttentionBackend):
    name = "batched"

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: PagedAttentionInputs, scale: float
    ) -> torch.Tensor:
        num_rows, num_heads, head_dim = q.shape
        num_kv_heads = k_cache.shape[1]
        group = num_heads // num_kv_heads
        out = q.new_empty(num_rows, num_heads * head_dim)
        max_keys = None
        if q.device.type == "cpu":
            max_keys = max(1, CPU_GROUP_BYTES // (2 * num_kv_heads * head_dim * q.element_size()))
        plan = inputs.derived((self.name, group, max_keys), lambda: query_groups(inputs.sequences, group, max_keys))
        for g in plan:
            num_seqs, q_len = g.key_slots.shape[0], g.query_len
            queries = q.index_select(0, g.rows).view(num_seqs, q_len, num_kv_heads, group, head_dim)
            queries = queries.permute(0, 2, 3, 1, 4).reshape(num_seqs, num_kv_heads, group * q_len, head_dim)
            slots = g.key_slots.flatten()
            keys = k_cache.index_select(0, slots).view(num_seqs, -1, num_kv_heads, head_dim)  # [S, L, Hkv, D]
            values = v_cache.index_select(0, slots).view(num_seqs, -1, num_kv_heads, head_dim)
            keys, values = keys.to(q.dtype).transpose(1, 2), values.to(q.dtype).transpose(1, 2)  # [S, Hkv, L, D]
            o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=g.mask, scale=scale)
            o = o.view(num_seqs, num_kv_heads, group, q_len, head_dim).permute(0, 3, 1, 2, 4)
            out.index_copy_(0, g.rows, o.reshape(num_seqs * q_len, num_heads * head_dim))
        return out


def query_groups(
    sequences: tuple[SequenceSlice, ...], heads_per_kv: int, max_keys: int | None = None
) -> list[QueryGroup]:
    """The step's sequences as padded groups (see the module docstring); masks repeated for `heads_per_kv`;
    `max_keys`: the most padded key rows (S * L) of a group, None for no bound."""
    by_length: dict[int, list[SequenceSlice]] = defaultdict(list)
    for seq in sequences:
        by_length[seq.query_len].append(seq)
    groups = []
    for members in by_length.values():
        members.sort(key=lambda s: -s.num_keys)
        start = 0
        for i in range(1, len(members) + 1):
            longest = members[start].num_keys
            if (
                i == len(members)
                or members[i].num_keys * MAX_KEY_PADDING < longest
                or (max_keys is not None and (i + 1 - start) * longest > max_keys)
            ):
                groups.append(_group(members[start:i], heads_per_kv))
                start = i
    return groups


def _group(members: list[SequenceSlice], heads_per_kv: int) -> QueryGroup:
    q_len = members[0].query_len
    device = members[0].keys.device
    key_lens = [s.num_keys for s in members]
    slots = _slot_table(members, key_lens)  # [S, L]
    starts = torch.tensor([s.query_start for s in members], device=device)
    rows = (starts[:, None] + torch.arange(q_len, device=device)).flatten()  # [S * Lq]: one build, not S aranges
    if all(s.mask is None for s in members) and min(key_lens) == max(key_lens):
        return QueryGroup(q_len, rows, slots, None)
    lengths = torch.tensor(key_lens, device=device)
    mask = torch.arange(slots.shape[1], device=device)[None, None, :] < lengths[:, None, None]  # [S, 1, L]
    mask = mask.expand(-1, q_len, -1).clone()  # [S, Lq, L]
    for i, seq in enumerate(members):
        if seq.mask is not None:
            mask[i, :, : key_lens[i]] = seq.mask
    return QueryGroup(q_len, rows, slots, mask.repeat(1, heads_per_kv, 1)[:, None])


def _slot_table(members: list[SequenceSlice], key_lens: list[int]) -> torch.Tensor:
    """[S, L] long: each member's key slots, padded to the longest. Members that share one key tensor (a step's own
    sequences) are gathered from it in one index, a padding position reading its row's first slot (masked out);
    others are padded one by one."""
    keys = members[0].keys
    if any(s.keys is not keys for s in members):
        return pad_sequence([s.key_slots for s in members], batch_first=True)
    device = keys.device
    lengths = torch.tensor(key_lens, device=device)
    starts = torch.tensor([s.key_start for s in members], device=device)
    offsets = torch.arange(max(key_lens), device=device)[None, :]  # [1, L]
    index = starts[:, None] + torch.where(offsets < lengths[:, None], offsets, 0)  # [S, L]
    return keys[index]
