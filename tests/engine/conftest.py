"""Fixtures of the oracle tests: tiny checkpoints with an LM head at the two extremes, written once per session.
A saturating head (most fp32 confidences exactly 1.0, the one value a threshold can equal) for the strictness of
the threshold; an unconfident one (logit scale 1) for the logits-level cache checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from tests.conftest import tiny_checkpoint

SATURATING_LOGIT_SCALE = 1000.0


@pytest.fixture(scope="session")
def saturated_model_dirs(tmp_path_factory) -> dict[int, Path]:
    """sdar-moe-tiny at block lengths 4 and 32 whose LM head saturates the softmax."""
    root = tmp_path_factory.mktemp("saturated")
    return {block: tiny_checkpoint(root, f"b{block}", block, logit_scale=SATURATING_LOGIT_SCALE) for block in (4, 32)}


@pytest.fixture(scope="session")
def low_scale_dirs(tmp_path_factory) -> dict[str, Path]:
    """An sdar-moe-tiny and a tiny LLaDA2 with logit scale 1: confidences near 1 / vocab, every logit a small number."""
    root = tmp_path_factory.mktemp("low-logit-scale")
    return {
        "sdar": tiny_checkpoint(root, "sdar", block_length=4, logit_scale=1.0),
        "llada2": write_llada2_checkpoint(root / "llada2", seed=1, logit_scale=1.0),
    }
