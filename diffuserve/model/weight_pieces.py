"""Where the pieces of one checkpoint tensor land in a parameter (or a quantized weight's logical shape): the whole
target slice (`WeightTarget`: an expert, a row range), or, for a tensor- / expert-parallel part, the pieces that
fall in this rank's part (`ShardSpec`: full coordinates -> local ones). Pure index arithmetic over shapes, shared
by the float loader and the quantized one; knows nothing of dtypes or files.

A piece is (dst index, src index): tuples of slices, one per dimension of the parameter; the source is the
checkpoint tensor aligned with the parameter's dimensions (a per-expert tensor gets a leading dim of 1).
"""

from __future__ import annotations

from diffuserve.model.layers.linear import ShardSpec
from diffuserve.model.weight_names import WeightTarget

Index = tuple[slice, ...]


def local_pieces(
    shape: tuple[int, ...], spec: ShardSpec | None, target: WeightTarget, tensor_shape: tuple[int, ...], name: str
) -> list[tuple[Index, Index]]:
    """The (dst, src) pieces of checkpoint tensor `name` of `tensor_shape` in a local parameter of `shape`."""
    full = list(shape)
    if spec is not None:
        full[spec.dim] = spec.full_size
    starts, lengths = [0] * len(full), list(full)
    if target.expert is not None:
        starts[0], lengths[0] = target.expert, 1
    row_dim = 0 if target.expert is None else 1
    if target.rows is not None:
        starts[row_dim], lengths[row_dim] = target.row_start, target.rows
    expected = lengths[1:] if target.expert is not None else lengths
    if list(tensor_shape) != expected:
        raise ValueError(f"checkpoint: weight {name!r} has shape {list(tensor_shape)}, expected {expected}")
    if spec is None:
        dst = tuple(slice(s, s + n) for s, n in zip(starts, lengths))
        return [(dst, tuple(slice(0, n) for n in lengths))]
    pieces = []
    for src_offset, dst_offset, length in spec.pieces(starts[spec.dim], lengths[spec.dim]):
        dst_index = [slice(s, s + n) for s, n in zip(starts, lengths)]
        dst_index[spec.dim] = slice(dst_offset, dst_offset + length)
        src_index = [slice(0, n) for n in lengths]
        src_index[spec.dim] = slice(src_offset, src_offset + length)
        pieces.append((tuple(dst_index), tuple(src_index)))
    return pieces
