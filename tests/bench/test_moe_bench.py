"""A tiny run of `diffuserve bench moe`: both parts run, the offload runs reproduce the tokens, and the final
line is JSON with the dispatch paths and the offload rows (no timing assertions)."""

from __future__ import annotations

import json

from diffuserve.cli.main import main


def test_bench_moe_tiny_run(capsys):
    code = main(
        [
            "bench",
            "moe",
            "--preset",
            "sdar-moe-tiny",
            "--num-requests",
            "2",
            "--block-length",
            "4",
            "--repeats",
            "1",
            "--max-tokens",
            "8",
            "--steps-per-block",
            "2",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "moe" and result["model"] == "sdar-moe-tiny"
    assert result["dispatch"] and result["offload"]
    assert all(row["tokens_identical"] for row in result["offload"])


def test_bench_moe_coreset_rows(capsys):
    """Per-token routing, then C = 8 and 32 of 256 experts: the block's experts and bytes per forward fall with C,
    and the planner calibrated with the per-token run predicts the block's bytes within 5 %."""
    argv = ["bench", "moe", "--preset", "sdar-moe-tiny", "--num-requests", "1", "--block-length", "32"]
    argv += ["--repeats", "1", "--max-tokens", "64", "--steps-per-block", "8", "--skip-offload"]
    assert main([*argv, "--coreset-sizes", "8,32"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["coreset"]
    assert [row["coreset"] for row in rows] == [0, 8, 32]
    blocks = [row["expert_bytes_per_forward_blocks"] for row in rows]
    assert blocks[1] < blocks[2] < blocks[0]
    assert rows[1]["experts_per_forward_blocks"] == 8
    assert all(abs(row["planned_error_calibrated"]) < 0.05 for row in rows)
