"""The fp8 K/V oracle: e4m3 rounding written out as arithmetic (no fp8 dtype, no cast), and the dense reference
attention with every K and V it attends over rounded so. The engine's fp8 cache (`--kv-cache-dtype fp8`) must
decode like this: same rounding, one scale of 1.0 per tensor, attention in the model's dtype.

e4m3 (float8_e4m3fn): 3 mantissa bits, exponents -6..8, subnormals below 2^-6 in steps of 2^-9, largest finite
448; round to nearest, ties to even; the engine saturates larger magnitudes at 448.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import torch

from diffuserve.model.families.clover_moe import dense as clover_dense
from diffuserve.model.layers import attention

E4M3_MAX = 448.0
E4M3_MIN_EXPONENT = -6
MANTISSA_BITS = 3


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest e4m3 value (ties to even), saturated at +-448, in x's dtype."""
    magnitude = x.double().abs().clamp(max=E4M3_MAX)
    exponent = torch.floor(torch.log2(magnitude.clamp(min=2.0**-30))).clamp(min=E4M3_MIN_EXPONENT)
    step = torch.exp2(exponent - MANTISSA_BITS)  # the spacing of e4m3 values in [2^e, 2^(e+1))
    rounded = (torch.round(magnitude / step) * step).clamp(max=E4M3_MAX)  # torch.round: half to even
    return (torch.sign(x.double()) * rounded).to(x.dtype)


@contextmanager
def fp8_kv_reference() -> Iterator[None]:
    """Within it, the models' dense (no-cache) attention sees e4m3-rounded K and V: what the reference decoders
    and prompt scoring run on, for every family (attention.py's layer, and clover's gated attention as
    model/families/clover_moe/dense.py reads it)."""
    dense = attention.dense_attention

    def rounded(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: attention.DenseAttentionInputs, scale: float
    ) -> torch.Tensor:
        return dense(q, e4m3_round(k), e4m3_round(v), inputs, scale)

    with (
        mock.patch.object(attention, "dense_attention", rounded),
        mock.patch.object(clover_dense, "dense_attention", rounded),
    ):
        yield
