"""`bench compare` on a tiny clover_moe model: the engine, the naive reference, the engine recomputing every
prefix (recompute-state) and the engine rescanning the GDN prefix every step (gdn-rescan) give identical tokens
at temperature 0, the engine variants in the same denoising steps, and the gdn-rescan target of issue 14 is reported."""

from __future__ import annotations

from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from tests.bench.conftest import FAST
from tests.bench.json_schema import COMPARE, validate

VARIANTS = ["engine", "reference", "recompute-state", "gdn-rescan"]


def test_hybrid_compare_variants_agree(run_bench, tmp_path):
    model = write_clover_moe_checkpoint(tmp_path / "clover", make_clover_moe_config(), seed=5, logit_scale=20.0)
    sizes = ["--block-lengths", "32", "--prompt-tokens", "40", "--output-tokens", "40", "--repeats", "1"]
    code, result, _ = run_bench(["compare", "--model", str(model), *sizes, "--variants", *VARIANTS, *FAST])
    assert code == 0
    assert validate(result, COMPARE) == []
    (row,) = result["results"]
    assert row["identical_tokens"] is True
    assert list(row["variants"]) == VARIANTS
    nfe = {name: v["nfe"] for name, v in row["variants"].items()}
    # The reference also denoises the last block's positions past max_tokens, which the engine stops before.
    assert nfe["engine"] == nfe["recompute-state"] == nfe["gdn-rescan"] <= nfe["reference"]
    assert set(row["ratios"]) == {f"engine_vs_{n}" for n in VARIANTS[1:]}
    assert [(t["versus"], t["minimum"]) for t in result["targets"]] == [("reference", 5.0), ("gdn-rescan", 2.0)]
