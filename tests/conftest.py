"""Shared fixtures: tiny seeded random checkpoints written once per session (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

# Under pytest-xdist (PYTEST_XDIST_WORKER names the worker) the workers already fill the cores: the processes a test
# starts (worker ranks, `diffuserve serve`, torchrun) take one OpenMP thread each, as this process does below,
# instead of one per core each. Set before torch is imported, which reads it once.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest
import torch

from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

# Tiny models gain nothing from threads, and OpenMP threads collapse when other processes share the cores.
torch.set_num_threads(1)


def tiny_checkpoint(
    root: Path, name: str, block_length: int = 4, seed: int = 0, logit_scale: float = 40.0, **overrides
) -> Path:
    """An sdar-moe-tiny MoE (4 experts top-2, a shared expert, layer 0 dense) with a peaky LM head, so that
    threshold decoding accepts several tokens at some steps and one at others."""
    config = make_config(
        "sdar-moe-tiny",
        block_length=block_length,
        **{"first_k_dense_replace": 1, "shared_expert_intermediate_size": 48, **overrides},
    )
    return write_random_checkpoint(root / name, config, seed=seed, logit_scale=logit_scale)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("models"), "tiny-b4", block_length=4)


@pytest.fixture(scope="session")
def tiny_model_dir_b32(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("models"), "tiny-b32", block_length=32)


@pytest.fixture(scope="session")
def tiny_llada2_dir(tmp_path_factory) -> Path:
    """A tiny LLaDA2.0 (BailingMoeV2) checkpoint with a peaky LM head."""
    return write_llada2_checkpoint(tmp_path_factory.mktemp("llada2") / "tiny", seed=1, logit_scale=40.0)


ONE_WORKER = "tests/distributed"
"""Tests that start 2 to 4 rank processes each: under pytest-xdist they run one after another on one worker, as one
scope (two of them at once would put up to 8 busy processes on 2 cores)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (scripts/run.sh): a file's tests on one worker, and every file of ONE_WORKER together."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return ONE_WORKER if scope.startswith(ONE_WORKER + "/") else scope

    return Scheduling(config, log)
