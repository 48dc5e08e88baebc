"""The fp8 K/V cache (`--kv-cache-dtype fp8`): attention pages in e4m3, read back in the model's dtype.

The oracle is the dense reference attention with its K and V rounded by plain arithmetic
(reference/reference_kv_fp8.py: no fp8 dtype, no cast): the engine decodes what it decodes, token for token, on an
attention family (chunked prefill included) and on Clover's block diffusion; the rounding itself equals the plain
rule on every e4m3 value, every tie between two of them and beyond the range; DiffusionGemma's canvases match
transformers' generate with its attention's K/V rounded the same way. The bytes: the engine's K/V per
token at fp8 are the planner's `--kv-cache-dtype fp8` figure and half the bf16 ones; the GDN state keeps fp32.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.cli import plan as planner_cli
from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.layers.attention import write_kv
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.parity import check_parity
from diffuserve.reference.reference_clover_moe import ReferenceSettings, reference_block_decode
from diffuserve.reference.reference_kv_fp8 import e4m3_round, fp8_kv_reference
from diffuserve.reference.reference_model import load_reference
from tests.conftest import tiny_checkpoint


def _through_cache(x: torch.Tensor) -> torch.Tensor:
    """x [n] written into an fp8 cache and read back in x's dtype, as an attention layer does."""
    cache = torch.zeros(x.shape[0], 1, 1, dtype=torch.float8_e4m3fn)
    write_kv(cache, torch.arange(x.shape[0]), x[:, None, None])
    return cache.to(x.dtype)[:, 0, 0]


def test_cache_rounds_like_the_plain_e4m3_rule():
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = codes[~codes.isnan()].unique()  # [253]: every finite e4m3 value
    ties = (values[1:] + values[:-1]) / 2  # halfway between neighbours: ties go to the even code
    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(4000, generator=generator) * torch.logspace(-4, 3, 4000)
    beyond = torch.tensor([449.0, -460.0, 500.0, -1e4, 3e38])
    x = torch.cat([values, ties, spread, beyond])
    assert torch.equal(_through_cache(x), e4m3_round(x))
    assert torch.equal(_through_cache(x.bfloat16()), e4m3_round(x.bfloat16()))
    assert _through_cache(beyond).abs().max() == 448  # saturated, never NaN
    assert not torch.equal(e4m3_round(x), x)  # the rule rounds (a reference that did not would fail above)


@pytest.fixture(scope="module")
def sdar_dir(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("kv8"), "sdar", shared_expert_intermediate_size=64)


PROMPTS = [[(i * 37 + j * 11) % 250 + 1 for j in range(3 + 9 * i)] for i in range(5)]
PARAMS = [SamplingParams(threshold=0.7, max_tokens=6 + 5 * i, ignore_eos=True) for i in range(5)]


def test_fp8_kv_engine_decodes_like_the_rounded_reference(sdar_dir):
    """Whole prefill: the same tokens and forwards as the reference whose dense attention sees e4m3-rounded K/V;
    chunked (a 16-token budget splits the longer prompts, one forward more): the same tokens. The unrounded
    reference differs (the test sees the rounding)."""
    reference = load_reference(sdar_dir)
    llm = LLM(str(sdar_dir), num_pages=256, max_num_seqs=8, kv_cache_dtype="fp8")
    chunked = LLM(str(sdar_dir), num_pages=256, max_num_seqs=8, kv_cache_dtype="fp8", max_num_batched_tokens=16)
    with fp8_kv_reference():
        run = check_parity(llm, reference, PROMPTS, PARAMS)
        chunked_run = check_parity(chunked, reference, PROMPTS, PARAMS)
    assert not run.mismatches, "\n".join(run.mismatches)
    assert chunked_run.engine_tokens == [r.token_ids for r in chunked_run.references] == run.engine_tokens
    unrounded = check_parity(llm, reference, PROMPTS, PARAMS)
    assert unrounded.mismatches, "fp8 K/V decoded exactly like 32-bit K/V: these prompts cannot tell them apart"


def _clover_dir(tmp_path, dtype: str = "float32"):
    config = make_clover_moe_config(
        block_length=4, moe_intermediate_size=64, shared_expert_intermediate_size=64, torch_dtype=dtype
    )
    return write_clover_moe_checkpoint(tmp_path / f"clover-{dtype}", config, seed=12, init_std=0.1, logit_scale=20.0)


def test_fp8_kv_clover_block_diffusion_matches_the_rounded_reference_decoder(tmp_path):
    model_dir = _clover_dir(tmp_path)
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, decoder="threshold", threshold=0.5)
    prompts = [[5, 9, 14, 2, 7, 30, 11], [3, 1, 4, 1, 5, 9, 2, 6, 5] * 3]
    llm = LLM(str(model_dir), device="cpu", max_model_len=256, kv_cache_dtype="fp8", max_num_batched_tokens=12)
    got = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params)]
    model = llm.engine.runner.executor.model
    settings = ReferenceSettings(max_new_tokens=9, threshold=0.5)
    with fp8_kv_reference():
        expected = [reference_block_decode(DenseClover(model), p, settings) for p in prompts]
    assert got == expected


def test_fp8_kv_diffusion_gemma_matches_transformers_with_rounded_kv(tmp_path):
    """DiffusionGemma's renoise canvases over fp8 pages == transformers' generate whose attention sees e4m3-rounded
    K/V, draw for draw; and not the unrounded run (the canvas state survives the layout's fp8 transform)."""
    pytest.importorskip("transformers")
    from diffuserve.reference.diffusion_gemma_hf import (
        FAST,
        FAST_CANVAS,
        hf_kv_fp8,
        load_hf_model,
        recorded_generate,
        write_hf_checkpoint,
    )

    model_dir = write_hf_checkpoint(tmp_path / "dg", None, FAST_CANVAS, seed=3, feedback=0.1, generation=FAST)
    hf, prompt = load_hf_model(model_dir), list(range(10, 19))
    llm = LLM(str(model_dir), dtype="float32", max_model_len=160, page_size=4, kv_cache_dtype="fp8")
    got = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=16, seed=12))[0].outputs[0].token_ids
    with hf_kv_fp8():
        rounded = recorded_generate(hf, prompt, 12, max_new_tokens=16)[0][0, len(prompt) :].tolist()
    unrounded = recorded_generate(hf, prompt, 12, max_new_tokens=16)[0][0, len(prompt) :].tolist()
    assert got == rounded != unrounded


def _planned(capsys, model_dir: str, kv_dtype: str) -> dict:
    parser = argparse.ArgumentParser()
    planner_cli.add_arguments(parser)
    args = parser.parse_args([model_dir, "--context-length", "1024", "--kv-cache-dtype", kv_dtype, "--json"])
    assert planner_cli.run(args) == 0
    return json.loads(capsys.readouterr().out)["memory_per_device"]


def _engine_bytes(model_dir: str, kv_cache_dtype: str) -> tuple[float, int, torch.dtype]:
    executor = LLM(model_dir, max_model_len=256, num_pages=40, kv_cache_dtype=kv_cache_dtype).engine.runner.executor
    kv = executor.caches.paged["kv"]
    per_token = kv.num_bytes / (executor.sizes.num_pages * executor.page_size)
    return per_token, executor.caches.state.state_bytes_per_slot(), kv.k_caches[0].dtype


def test_fp8_kv_bytes_are_the_planners_and_half_of_bf16(tmp_path, capsys):
    model_dir = str(_clover_dir(tmp_path, "bfloat16"))
    fp8, fp8_state, fp8_dtype = _engine_bytes(model_dir, "fp8")
    bf16, bf16_state, _ = _engine_bytes(model_dir, "auto")
    assert fp8_dtype == torch.float8_e4m3fn and fp8 == bf16 / 2
    assert fp8_state == bf16_state  # the GDN state is fp32 either way
    assert _planned(capsys, model_dir, "fp8")["kv_bytes_per_token"] == fp8
    assert _planned(capsys, model_dir, "auto")["kv_bytes_per_token"] == bf16


def test_bad_kv_cache_dtype_is_one_line(sdar_dir):
    with pytest.raises(ValueError, match=r"kv_cache_dtype: must be auto or fp8 \(e4m3\), got 'int8'"):
        LLM(str(sdar_dir), kv_cache_dtype="int8")
    result = subprocess.run(
        [sys.executable, "-m", "diffuserve", "generate", "--model", str(sdar_dir), "--kv-cache-dtype", "e5m2", "hi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "kv_cache_dtype: must be auto or fp8" in result.stderr
