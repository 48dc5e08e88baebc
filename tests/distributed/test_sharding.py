"""Sharded loading without processes: each rank's slices, put back together, are the single-process weights
(q | k | v and gate | up segments split per segment; experts split by width or whole), by hand and for a real
checkpoint."""

from __future__ import annotations

import pytest
import torch

from diffuserve.distributed.group import ParallelGroup
from diffuserve.model.layers.linear import ShardSpec
from diffuserve.model.loader import build_model, load_args, load_model, load_weights
from diffuserve.model.tensor_parallel import check_parallel_sizes


def test_shard_pieces_by_hand():
    # q | k | v rows of lengths 4 | 2 | 2, two ranks: rank 1 holds q[2:4], k[1:2], v[1:2] at local rows 0-1, 2, 3.
    spec = ShardSpec(0, (4, 2, 2), rank=1, size=2)
    assert spec.pieces(0, 8) == [(2, 0, 2), (5, 2, 1), (7, 3, 1)]
    assert spec.pieces(4, 2) == [(1, 2, 1)]  # the k_proj tensor alone: its row 1 -> local row 2
    assert spec.pieces(0, 2) == []  # rank 0's half of q


def _shards(model_dir, expert_parallel: bool) -> list[dict[str, torch.Tensor]]:
    family, args = load_args(model_dir)
    out = []
    for rank in range(2):
        group = ParallelGroup(rank, 2, expert_parallel)  # loading needs no process group
        model = build_model(family, args, 64, torch.float32, "cpu", group)
        load_weights(model, family, args, model_dir)
        out.append(dict(model.named_parameters()))
    return out


def _joined(name: str, shards: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """Undo the split: per rank, cut its local tensor into its segment pieces, then interleave by segment."""
    spec = getattr(shards[0][name], "shard", None)
    if spec is None:
        return shards[0][name].data
    pieces: list[list[torch.Tensor]] = [[] for _ in spec.segments]
    for shard in shards:
        local = shard[name].data
        parts = local.split([s // spec.size for s in spec.segments], dim=spec.dim)
        for i, part in enumerate(parts):
            pieces[i].append(part)
    return torch.cat([torch.cat(p, dim=spec.dim) for p in pieces], dim=spec.dim)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_rank_slices_put_together_are_the_full_weights(tiny_model_dir, expert_parallel):
    _, full = load_model(tiny_model_dir, max_model_len=64)
    shards = _shards(tiny_model_dir, expert_parallel)
    expert_spec = shards[1]["model.layers.1.mlp.experts.down_proj"].shard
    assert expert_spec.dim == (0 if expert_parallel else 2)
    for name, param in full.named_parameters():
        assert torch.equal(_joined(name, shards), param.data), name


def test_expert_parallel_needs_experts_and_divisible_sizes(tiny_model_dir):
    _, args = load_args(tiny_model_dir)
    check_parallel_sizes(args, 2, expert_parallel=True)
    with pytest.raises(ValueError, match="does not divide the model's 4 experts"):
        check_parallel_sizes(args.replace(num_heads=6, num_kv_heads=3, intermediate_size=96), 3, True)
    with pytest.raises(ValueError, match="the model has no experts"):
        check_parallel_sizes(args.replace(num_experts=0), 2, expert_parallel=True)
