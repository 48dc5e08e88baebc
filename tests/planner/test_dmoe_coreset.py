"""dMoE's cumulative coreset rule in the planner: the dMoE-16B preset (LLaDA2.0-mini's shape plus `mode` and
`core_threshold` 0.6) plans its coreset from config.json, the flag's rule replaces it, and the mean coreset
follows from Poisson votes; `bench moe --coreset-rules` on a random dMoE agrees with the planner."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from diffuserve.cli import plan as cli
from diffuserve.cli.main import main
from diffuserve.model.layers.moe.coreset_rule import parse_coreset_rule
from diffuserve.planner.coreset import planned_coreset_size
from diffuserve.planner.model_presets import MODEL_PRESETS, load_model


def _run(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def test_dmoe_preset_is_llada2_mini_with_the_gate_keys():
    dmoe, mini = MODEL_PRESETS["dMoE-16B"].config, MODEL_PRESETS["LLaDA2.0-mini"].config
    assert dmoe == {**mini, "mode": "aggregate", "core_threshold": 0.6}


def test_the_mean_coreset_of_uniform_votes():
    """dMoE-16B, one window of 32 positions x top-8 of 256: Poisson(1) votes per expert. Within 0.6 of the 256
    votes: every expert with >= 3 votes (256 x 0.0803 = 20.6 experts, 67.6 votes), then 2-vote experts (47.1 of
    them) until 153.6 votes: 43.0, plus the first past: 64.5."""
    spec = load_model("dMoE-16B")[0]
    rule = parse_coreset_rule("cumulative:0.6")
    above = sum(256 * math.exp(-1) / math.factorial(c) for c in range(3, 30))
    votes = sum(c * 256 * math.exp(-1) / math.factorial(c) for c in range(3, 30))
    assert planned_coreset_size(spec, rule, 32, None) == round(above + (0.6 * 256 - votes) / 2 + 1) == 65
    assert planned_coreset_size(spec, parse_coreset_rule("cumulative:0.05"), 32, None) == 16  # the guard
    assert planned_coreset_size(spec, parse_coreset_rule("cumulative:0.05,min=2"), 32, None) == 4
    assert planned_coreset_size(spec, parse_coreset_rule("12"), 32, None) == 12


def test_plan_dmoe_prints_expert_bytes_under_its_coreset_beside_per_token(capsys):
    out = _run(capsys, "dMoE-16B", "--hardware", "H200")
    (line,) = [x for x in out.splitlines() if x.startswith("Coreset")]
    assert "cumulative:0.6,min=16,window=32 (mean C ~ 65)" in line and "with per-token routing (63.8%" in line
    document = json.loads(_run(capsys, "dMoE-16B", "--hardware", "H200", "--json"))["block_expert_coreset"]
    with_rule, per_token = (
        document["expert_bytes_per_forward_with_coreset"],
        document["expert_bytes_per_forward_per_token"],
    )
    touched = 65 * (1 - (1 - 8 / 65) ** 32) / 256
    assert with_rule / per_token == pytest.approx(touched / (1 - (1 - 8 / 256) ** 32))
    assert document["rule"] == "cumulative:0.6,min=16,window=32"
    assert "Coreset" not in _run(capsys, "dMoE-16B", "--block-expert-coreset", "0")
    assert "Coreset" not in _run(capsys, "LLaDA2.0-mini")
    assert "mean C ~ 26" in _run(capsys, "LLaDA2.0-mini", "--block-expert-coreset", "cumulative:0.3")


def test_a_bad_rule_is_one_line(capsys):
    assert main(["plan", "dMoE-16B", "--block-expert-coreset", "cumulative:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "core_threshold: 0.0 is outside (0, 1]" in err and len(err.splitlines()) == 1


def test_bench_moe_on_a_tiny_dmoe_agrees_with_the_planner(capsys):
    """Per-token routing, then dMoE's 0.6: the rule cuts the experts a denoising forward reads, and the planner
    calibrated with the per-token run predicts them within 10 %."""
    argv = ["bench", "moe", "--preset", "sdar-moe-tiny", "--num-requests", "1", "--block-length", "32"]
    argv += ["--repeats", "1", "--max-tokens", "64", "--steps-per-block", "8", "--skip-offload"]
    assert main([*argv, "--coreset-rules", "cumulative:0.6"]) == 0
    per_token, rule = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["coreset_rules"]
    assert rule["rule"] == "cumulative:0.6" and rule["experts_per_forward"] < 0.7 * per_token["experts_per_forward"]
    assert abs(rule["planned_error_calibrated"]) < 0.10
    assert rule["planned_bytes_calibrated"] < per_token["planned_bytes_calibrated"]
