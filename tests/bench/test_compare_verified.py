"""`bench compare` with the verified rows on a tiny clover_moe model with the diffusion tensors: verified
decoding, one prompt at a time and all at once, gives the autoregressive variant's tokens (the run checks it and
would exit 1 otherwise) and reports its drafts' acceptance."""

from __future__ import annotations

from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from tests.bench.conftest import FAST
from tests.bench.json_schema import COMPARE, validate

VARIANTS = ["engine", "ar", "verified", "verified-batched"]


def test_compare_verified_rows_equal_autoregressive(run_bench, tmp_path):
    model = write_clover_moe_checkpoint(tmp_path / "clover", make_clover_moe_config(), seed=5, logit_scale=20.0)
    sizes = ["--block-lengths", "4", "--prompt-tokens", "12", "--output-tokens", "12", "--num-prompts", "3"]
    code, result, _ = run_bench(
        ["compare", "--model", str(model), *sizes, "--repeats", "1", "--variants", *VARIANTS, *FAST]
    )
    assert code == 0
    assert validate(result, COMPARE) == []
    (row,) = result["results"]
    assert row["verified_equals_ar"] is True and row["identical_tokens"] is None
    verified = row["variants"]["verified"]
    assert 0 <= verified["acceptance_rate"] <= 1 and verified["mean_acceptance_length"] >= 1
    assert row["variants"]["verified-batched"]["nfe"] == verified["nfe"]
