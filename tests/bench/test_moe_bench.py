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
