"""Tiny runs of `bench throughput` and `bench latency` (no timing assertions): their JSON validates against the
schema, the counts add up, and `diffuserve plan --calibrate` accepts the calibration they print."""

from __future__ import annotations

import json

import pytest

from diffuserve.bench.accuracy import accuracy_vs_tpf
from diffuserve.bench.flops import model_cost
from diffuserve.cli.main import main
from diffuserve.model.loader import load_args
from diffuserve.planner.calibrate import missing_keys
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from tests.bench.conftest import FAST, plot_args, pngs
from tests.bench.json_schema import LATENCY, THROUGHPUT, validate


def test_throughput_json_and_calibration(bench_model_dir, run_bench, tmp_path, capsys):
    out = tmp_path / "throughput.json"
    code, result, text = run_bench(
        [
            "throughput",
            "--model",
            str(bench_model_dir),
            "--concurrency",
            "1",
            "3",
            "--block-lengths",
            "4",
            "--sequential",
            "3",
            "--prompt-tokens",
            "6",
            "--output-tokens",
            "8",
            "--json-out",
            str(out),
            *FAST,
            *plot_args(tmp_path / "plots"),
        ]
    )
    assert code == 0
    assert validate(result, THROUGHPUT) == []
    assert "tok/s" in text and "sequential" in text  # the human table came first
    runs = {(r["mode"], r["concurrency"]): r for r in result["results"]}
    assert set(runs) == {("concurrent", 1), ("concurrent", 3), ("sequential", 1)}
    for r in runs.values():
        assert r["generated_tokens"] == 8 * r["num_requests"]  # EOS ignored: exact lengths
        assert r["tpf"] == r["generated_tokens"] / r["nfe"]
        assert 0 <= r["efficiency"]["overhead_fraction"] < 1
    assert result["speedups"][0]["num_requests"] == 3
    if plot_args(tmp_path):
        assert pngs(tmp_path / "plots") == {"throughput_vs_concurrency.png", "latency_percentiles.png"}
    calibration = result["calibration"]
    assert missing_keys(calibration) == []
    assert calibration["workload"]["num_seqs"] == 3  # the largest run is predicted from the others
    assert calibration["fit"]["fit_on_predicted_run"] is False
    capsys.readouterr()
    assert main(["plan", "--calibrate", str(out)]) == 0
    assert "predicted" in capsys.readouterr().out


def test_latency_json(bench_model_dir, run_bench, tmp_path):
    code, result, text = run_bench(
        [
            "latency",
            "--model",
            str(bench_model_dir),
            "--batch-size",
            "2",
            "--num-iters",
            "2",
            "--prompt-tokens",
            "5",
            "--output-tokens",
            "6",
            *FAST,
            *plot_args(tmp_path),
        ]
    )
    assert code == 0
    assert validate(result, LATENCY) == []
    assert len(result["batch_latency_s"]["iterations"]) == 2
    assert result["result"]["num_requests"] == 4
    assert result["result"]["generated_tokens"] == 4 * 6
    assert result["workload"]["block_length"] == 4  # the model's
    assert "latency mean s" in text
    assert result["result"]["gdn"] is None  # an attention-only model
    assert missing_keys(result["calibration"]) == []
    if plot_args(tmp_path):
        assert pngs(tmp_path) == {"latency_percentiles.png"}


def test_latency_runs_weight_formats_side_by_side(bench_model_dir, run_bench, tmp_path):
    """`--quantization none int8 int4`: one run per format, the bytes per forward the loaded models hold (int8 about
    half of fp32's... here a quarter plus the 32-bit norms and embeddings), and calibrations the planner takes."""
    sizes = ["--batch-size", "1", "--num-iters", "1", "--prompt-tokens", "5", "--output-tokens", "8"]
    code, result, text = run_bench(
        [
            "latency",
            "--model",
            str(bench_model_dir),
            *sizes,
            "--quantization",
            "none",
            "int8",
            "int4",
            "--quantization-group-size",
            "32",
            *FAST,
        ]
    )
    assert code == 0 and validate(result, LATENCY) == []
    rows = result["comparison"]
    assert (
        [r["weight_dtype"] for r in rows] == ["fp32", "int8", "int4"] == [v["weight_dtype"] for v in result["variants"]]
    )
    assert rows[0]["bytes_ratio"] == 1.0 and rows[2]["bytes_ratio"] < rows[1]["bytes_ratio"] < 0.6
    assert rows[2]["weight_bytes"] < rows[1]["weight_bytes"] < rows[0]["weight_bytes"]
    assert "MB read / forward" in text
    for variant in result["variants"]:
        path = tmp_path / f"{variant['weight_dtype']}.json"
        path.write_text(json.dumps({"calibration": variant["calibration"]}))
        assert main(["plan", "--calibrate", str(path)]) == 0


def test_latency_reports_gdn_layers_against_their_floor(run_bench, tmp_path):
    """A hybrid model: the GDN layers' time per decode step (taken inside the model, so less than the step) and
    their floor: the larger of their bytes (mixer weights + each sequence's state read and written) at the
    probe's bandwidth and their FLOPs (every step token through every GDN mixer) at its matmul rate."""
    model = write_clover_moe_checkpoint(tmp_path / "clover", make_clover_moe_config(), seed=5, logit_scale=20.0)
    sizes = ["--batch-size", "2", "--num-iters", "1", "--prompt-tokens", "6", "--output-tokens", "8"]
    code, result, text = run_bench(["latency", "--model", str(model), *sizes, *FAST])
    assert code == 0
    assert validate(result, LATENCY) == []
    gdn, step_s = result["result"]["gdn"], result["result"]["mean_decode_step_s"]
    assert 0 < gdn["gdn_s_per_step"] < step_s
    assert gdn["gdn_share_of_step"] == pytest.approx(gdn["gdn_s_per_step"] / step_s, rel=1e-4)  # JSON: 6 digits
    cost = model_cost(load_args(model)[1], weight_itemsize=4, kv_itemsize=4)
    # Each of the step's one or two sequences reads and writes its state once.
    one, two = (cost.gdn_weight_bytes + n * 2 * cost.state_bytes_per_seq for n in (1, 2))
    assert one <= gdn["gdn_bytes_per_step"] <= two
    assert gdn["gdn_flops_per_step"] > 0
    machine = result["machine"]
    floors = (
        gdn["gdn_bytes_per_step"] / machine["bandwidth_bytes_per_s"],
        gdn["gdn_flops_per_step"] / machine["matmul_flops_per_s"],
    )
    assert gdn["gdn_floor_s_per_step"] == pytest.approx(max(floors), rel=1e-4)
    assert "GDN layers:" in text


def test_accuracy_vs_tpf_rows(bench_model_dir, tmp_path):
    """The eval harness's decoding sweep (a random model scores ~0; the rows and the chart are what is tested)."""
    rows = accuracy_vs_tpf(bench_model_dir, num_per_task=1, dtype="float32", device="cpu")
    assert rows[0]["decoding"] == "default" and len(rows) > 5
    for row in rows:
        assert 0 <= row["accuracy"] <= 1 and row["tokens_per_forward"] > 0 and row["num_examples"] >= 1
    if plot_args(tmp_path):
        from diffuserve.bench.plot import accuracy_chart

        assert accuracy_chart(rows, tmp_path).name == "accuracy_vs_tpf.png"
