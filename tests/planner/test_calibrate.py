"""The bench -> planner calibration contract: parsing, validation messages, and predicted vs measured.

The fixture is a hand-written `diffuserve bench` output for the random sdar-moe-bench model on this project's
2-core CPU: human lines, then the JSON line. Its numbers are those of a scratch run of the engine (8 sequences,
64 + 128 tokens, block 32): 6.27 decode tokens/s, 1.70 s per forward, TPF 1.33; memory 5.55 GB/s and
25.6 GFLOP/s from microbenchmarks; step overhead 1.27 s fitted on a separate 1-sequence run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffuserve.planner.calibrate import (
    REQUIRED_KEYS,
    Calibration,
    check_calibration,
    load_calibration,
    missing_keys,
    parse_calibration,
)

FIXTURE = Path(__file__).parent / "data" / "bench_sdar_moe_cpu.txt"


def _calibration_object() -> dict:
    return json.loads(FIXTURE.read_text().strip().splitlines()[-1])["calibration"]


def test_loads_the_last_json_line_of_bench_output():
    calibration = load_calibration(FIXTURE)
    assert calibration.num_seqs == 8 and calibration.block_length == 32
    assert calibration.efficiency.step_overhead_s == 1.271
    assert calibration.spec.num_experts == 16
    assert calibration.experts_touched_per_block == 15.6


def test_prediction_of_the_bench_run_is_within_25_percent():
    """The planner re-plans exactly the measured run with the run's knobs and compares decode tokens/s."""
    check = check_calibration(load_calibration(FIXTURE))
    assert check.measured_tokens_per_s == 6.273
    assert check.relative_error == pytest.approx((check.predicted_tokens_per_s - 6.273) / 6.273)
    assert abs(check.relative_error) < 0.25
    assert check.predicted_forward_s == pytest.approx(1.699, rel=0.25)
    assert any("error" in line for line in check.formulas)


def test_missing_keys_are_all_named():
    data = _calibration_object()
    del data["tpf"]
    del data["hardware"]["flops_per_s"]
    del data["workload"]
    assert missing_keys(data)[:2] == ["hardware.flops_per_s", "workload.num_seqs"]
    with pytest.raises(ValueError) as error:
        parse_calibration(data)
    message = str(error.value)
    for key in ("calibration.hardware.flops_per_s", "calibration.workload.block_length", "calibration.tpf"):
        assert key in message


def test_experts_touched_may_be_null_but_not_absent():
    data = _calibration_object()
    data["experts_touched_per_block"] = None
    assert parse_calibration(data).experts_touched_per_block is None
    del data["experts_touched_per_block"]
    assert missing_keys(data) == ["experts_touched_per_block"]


def test_every_required_key_is_in_the_fixture():
    assert missing_keys(_calibration_object()) == []
    assert len(REQUIRED_KEYS) == 16


def test_bad_values_and_versions_are_rejected(tmp_path):
    data = _calibration_object()
    with pytest.raises(ValueError, match="bandwidth_fraction"):
        parse_calibration({**data, "achieved_bandwidth_fraction": 1.5})
    with pytest.raises(ValueError, match="schema_version 2"):
        parse_calibration({**data, "schema_version": 2})
    (tmp_path / "empty.txt").write_text("no json here\n")
    with pytest.raises(ValueError, match="holds no JSON object"):
        load_calibration(tmp_path / "empty.txt")


def test_the_schema_class_round_trips_the_fixture():
    data = _calibration_object()
    written = Calibration.from_json(data).to_json()
    assert written == {**data, "deployment": {}, "fit": {}}
    assert Calibration.from_json(written) == Calibration.from_json(data)


def test_the_bench_writes_what_the_planner_reads():
    """bench/calibration.py builds its JSON with the planner's class; a value the planner rejects fails there."""
    from diffuserve.bench.calibration import FittedEfficiency, calibration_object
    from diffuserve.bench.probes import MachineRates

    data = _calibration_object()
    rates = MachineRates(
        flops_per_s=2.56e10,
        matmul_size=1024,
        bandwidth_bytes_per_s=5.55e9,
        bandwidth_buffer_bytes=1 << 28,
        dtype="float32",
    )
    deployment = {"tensor_parallel_size": 1, "max_num_seqs": 8, "max_num_batched_tokens": 4096}
    written = calibration_object(
        data["model_config"],
        "float32",
        rates,
        8 << 30,
        data["workload"],
        FittedEfficiency(0.5, 1.271, 40, 0.1),
        1.333,
        15.6,
        6.273,
        1.699,
        deployment,
    )
    calibration = Calibration.from_json(written)
    assert (calibration.efficiency.flops_fraction, calibration.deployment.max_num_seqs) == (0.5, 8)
    assert written["fit"] == {"num_decode_steps": 40, "rms_relative_error": 0.1}
    with pytest.raises(ValueError, match="flops_fraction"):
        calibration_object(
            data["model_config"],
            "float32",
            rates,
            8 << 30,
            data["workload"],
            FittedEfficiency(1.5, 0.0, 1, 0.0),
            1.0,
            None,
            1.0,
            1.0,
            deployment,
        )
