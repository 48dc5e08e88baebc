"""`bench compare` on a tiny DiffusionGemma model (renoise canvases): the engine alone and batched against
transformers' own `generate` one by one and batched; the engine alone and batched give identical tokens (the same
counter-based draws), transformers' agreement is reported (its own draws), every variant generates every
requested token, and issue 27's two targets are reported."""

from __future__ import annotations

import pytest

from diffuserve.reference.diffusion_gemma_checkpoint import (
    make_diffusion_gemma_config,
    write_diffusion_gemma_checkpoint,
)
from tests.bench.conftest import FAST

pytest.importorskip("transformers")


def test_renoise_compare_against_transformers_generate(run_bench, tmp_path):
    model = write_diffusion_gemma_checkpoint(tmp_path / "gemma", make_diffusion_gemma_config(), seed=2, feedback=0.1)
    sizes = ["--prompt-tokens", "8", "--output-tokens", "24", "--num-prompts", "3", "--denoising-steps", "3"]
    code, result, table = run_bench(["compare", "--model", str(model), *sizes, "--repeats", "1", *FAST])
    assert code == 0
    (row,) = result["results"]
    assert list(row["variants"]) == ["engine", "engine-batched", "transformers", "transformers-batched"]
    assert row["identical_tokens"] is True
    agreement = row["token_agreement_with_transformers"]
    assert set(agreement) == {"engine", "engine-batched", "transformers-batched"}
    assert all(0.0 <= share <= 1.0 for share in agreement.values())
    assert {v["generated_tokens"] for v in row["variants"].values()} == {3 * 24}  # EOS ignored on both sides
    assert row["variants"]["engine"]["nfe"] == 3 * 2 * 3  # 3 requests x 2 canvases of 16 x 3 steps
    assert [(t["versus"], t["minimum"]) for t in result["targets"]] == [
        ("transformers", 3.0),
        ("transformers-batched", 8.0),
    ]
    assert result["workload"]["decoder"] == "renoise" and result["workload"]["steps"] == 3
    assert "transformers-batched" in table
