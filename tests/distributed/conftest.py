"""Tiny clover_moe checkpoints shaped for 2 and 4 ranks, written once per session: 8 query heads over 2 K/V heads
and 4 GDN key heads over 8 value heads (2 per key head), so that 4 ranks split the query and GDN heads and
replicate the K/V heads; with and without the four block-diffusion tensors (without: autoregressive)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint

CLOVER_PARALLEL_SHAPE = dict(num_attention_heads=8, linear_num_key_heads=4, linear_num_value_heads=8)


@pytest.fixture(scope="session")
def clover_dirs(tmp_path_factory) -> dict[bool, Path]:
    """diffusion tensors present (True) or absent (False) -> checkpoint directory (fp32, seed 5, peaky head)."""
    root = tmp_path_factory.mktemp("clover-parallel")
    config = make_clover_moe_config(**CLOVER_PARALLEL_SHAPE)
    return {
        diffusion: write_clover_moe_checkpoint(
            root / f"diffusion-{diffusion}", config, seed=5, init_std=0.05, logit_scale=8.0, diffusion=diffusion
        )
        for diffusion in (True, False)
    }
