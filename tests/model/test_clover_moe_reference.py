"""The naive clover_moe reference decoder: deterministic in block-diffusion and autoregressive modes, the
threshold / top-1 fallback rule, EOS truncation, and the prediction-shift switch; its AR mode equals
transformers' greedy generate."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from diffuserve.model.families.clover_moe.config import hybrid_args
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.loader import load_model
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_ar_decode, reference_block_decode

PROMPT = [72, 101, 108, 108, 111, 44]  # 6 tokens: the first block (length 4) is complete, the second half prompt


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    config = make_clover_moe_config(block_length=4)
    return write_clover_moe_checkpoint(
        tmp_path_factory.mktemp("ref") / "m", config, seed=7, init_std=0.1, logit_scale=20.0
    )


def _with_shift(model, shift: bool) -> None:
    clover = model.clover  # a DenseClover reads its served model's args
    hybrid = dataclasses.replace(hybrid_args(clover.args), prediction_shift=shift)
    clover.args = clover.args.replace(extra={**clover.args.extra, "hybrid": hybrid})


def _count_previews(model):
    calls = []
    original = model.forward_preview
    model.forward_preview = lambda *a, **k: calls.append(1) or original(*a, **k)
    return calls


@pytest.mark.parametrize("shift", [True, False])
def test_block_decode_is_deterministic(model_dir, shift):
    model = DenseClover(load_model(model_dir)[1])
    _with_shift(model, shift)
    settings = ReferenceSettings(max_new_tokens=10, threshold=0.5)
    first = reference_block_decode(model, PROMPT, settings)
    assert first == reference_block_decode(model, PROMPT, settings)
    assert len(first) == 10 and model.args.mask_token_id not in first
    assert len(set(first)) > 1


def test_shift_switch_changes_which_row_predicts(model_dir):
    model = DenseClover(load_model(model_dir)[1])
    settings = ReferenceSettings(max_new_tokens=10, threshold=0.5)
    shifted = reference_block_decode(model, PROMPT, settings)
    assert hybrid_args(model.args).prediction_shift  # the default
    _with_shift(model, False)
    assert reference_block_decode(model, PROMPT, settings) != shifted


@pytest.mark.parametrize("threshold, expected_steps", [(0.0, 3), (1.1, 10)])
def test_threshold_and_top1_fallback(model_dir, threshold, expected_steps):
    """Threshold 0 accepts a whole block per step (blocks: 2 masks, 4, 4); above 1 only the top-1 fallback
    accepts, one token per step."""
    model = DenseClover(load_model(model_dir)[1])
    calls = _count_previews(model)
    out = reference_block_decode(model, PROMPT, ReferenceSettings(max_new_tokens=10, threshold=threshold))
    assert len(out) == 10 and len(calls) == expected_steps


def test_eos_truncates(model_dir):
    model = DenseClover(load_model(model_dir)[1])
    settings = ReferenceSettings(max_new_tokens=10, threshold=0.5)
    full = reference_block_decode(model, PROMPT, settings)
    eos = full[5]
    stopped = reference_block_decode(model, PROMPT, ReferenceSettings(10, 0.5, eos_token_ids=(eos,)))
    assert stopped == full[: full.index(eos) + 1]


def test_sampling_is_reproducible_with_a_seed(model_dir):
    model = DenseClover(load_model(model_dir)[1])
    settings = ReferenceSettings(max_new_tokens=8, threshold=0.5, temperature=1.0)
    runs = [reference_block_decode(model, PROMPT, settings, torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert runs[0] == runs[1] and len(runs[2]) == 8


def test_ar_decode_equals_transformers_greedy(model_dir):
    transformers = pytest.importorskip("transformers")
    from tests.model.test_clover_moe_parity import _hf_model

    model = DenseClover(load_model(model_dir)[1])
    ours = reference_ar_decode(model, PROMPT, ReferenceSettings(max_new_tokens=12))
    assert ours == reference_ar_decode(model, PROMPT, ReferenceSettings(max_new_tokens=12))
    hf = _hf_model(model_dir)
    expected = hf.generate(
        torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert transformers is not None and ours == expected[0, len(PROMPT) :].tolist()
