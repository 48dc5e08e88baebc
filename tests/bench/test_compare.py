"""A tiny `bench compare` run: the JSON validates; the engine, its eager per-expert-loop baseline, the
transformers recompute reference, transformers with a KV cache under the SDAR scheme and the separate-commit
variant give identical tokens at temperature 0; the NFE of each variant is what its method implies (separate
commit adds forwards; AR is one forward per token)."""

from __future__ import annotations

import pytest

from tests.bench.conftest import FAST, plot_args, pngs
from tests.bench.json_schema import COMPARE, validate

pytest.importorskip("transformers")


def test_compare_variants_agree(bench_model_dir, run_bench, tmp_path):
    code, result, text = run_bench(
        [
            "compare",
            "--model",
            str(bench_model_dir),
            "--block-lengths",
            "4",
            "8",
            "--prompt-tokens",
            "6",
            "--output-tokens",
            "12",
            "--num-prompts",
            "2",
            "--repeats",
            "2",
            *FAST,
            *plot_args(tmp_path),
        ]
    )
    assert code == 0
    assert validate(result, COMPARE) == []
    assert [r["block_length"] for r in result["results"]] == [4, 8]
    for row in result["results"]:
        assert row["identical_tokens"] is True
        v = row["variants"]
        assert list(v) == ["engine", "baseline", "reference", "transformers-kv", "separate-commit", "ar"]
        assert len(v["engine"]["wall_s_repeats"]) == 2 and len(v["reference"]["wall_s_repeats"]) == 1
        assert {x["generated_tokens"] for x in v.values()} == {24}
        # Same denoising steps and no extra commit forward; the reference also denoises the last block's
        # positions past max_tokens, which the engine stops before.
        assert v["engine"]["nfe"] <= v["reference"]["nfe"] == v["transformers-kv"]["nfe"]
        assert v["baseline"]["nfe"] == v["engine"]["nfe"]
        assert v["separate-commit"]["nfe"] > v["engine"]["nfe"]
        assert v["ar"]["nfe"] == 24 and v["ar"]["tpf"] == 1.0
        assert set(row["ratios"]) == {f"engine_vs_{n}" for n in list(v)[1:]}
    assert "same tokens" in text
    if plot_args(tmp_path):
        assert pngs(tmp_path) == {"compare_tokens_per_s.png"}


def test_compare_the_attention_backends(bench_model_dir, run_bench):
    """(e) with the default (batched) attention against (h), the same engine with the per-sequence loop: same
    tokens and forwards, the ratio reported."""
    sizes = ["--block-lengths", "4", "--prompt-tokens", "6", "--output-tokens", "8", "--num-prompts", "3"]
    variants = ["--variants", "engine-batched", "attention-loop"]
    code, result, text = run_bench(
        ["compare", "--model", str(bench_model_dir), *sizes, "--repeats", "1", *variants, *FAST]
    )
    assert code == 0 and validate(result, COMPARE) == []
    (row,) = result["results"]
    v = row["variants"]
    assert list(v) == ["engine-batched", "attention-loop"] and row["identical_tokens"] is True
    assert v["engine-batched"]["nfe"] == v["attention-loop"]["nfe"] and v["attention-loop"]["generated_tokens"] == 24
    assert set(row["ratios"]) == {"engine-batched_vs_attention-loop"}
    assert "attention-loop" in text
