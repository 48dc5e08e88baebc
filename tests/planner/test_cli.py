"""`diffuserve plan` end to end: text, --explain, --json, --calibrate, --chart, and one-line errors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from diffuserve.cli import plan as cli
from diffuserve.cli.main import build_parser, main

FIXTURE = Path(__file__).parent / "data" / "bench_sdar_moe_cpu.txt"


def _run(capsys, *argv: str) -> str:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(list(argv))) == 0
    return capsys.readouterr().out


def test_worked_example_clover_on_one_h200_at_128k(capsys):
    """The docs' worked example: 64.6 GiB of BF16 weights leave a 56.3 GiB pool -> 21 sequences of 2.56 GiB
    (2.5 GiB of K/V in the 10 attention layers + 61.4 MiB of GDN state)."""
    out = _run(capsys, "Clover-35B-A3B", "--hardware", "H200", "--context-length", "131072")
    assert "34.66B total, 3.45B active (published 35.00B / 3.00B)" in out
    assert "active includes embeddings + LM head" in out
    assert "KV cache pool                56.28 GiB" in out
    assert "per 131,072-token sequence 2.50 GiB + recurrent state 61.41 MiB" in out
    assert "21 sequences fit at 131,072 tokens" in out
    assert "compute-bound" in out and "tokens/s total" in out and "TTFT" in out
    assert "cloud $" in out and "on-prem $" in out and "breaks even" in out


def test_explain_prints_formulas_with_numbers(capsys):
    out = _run(capsys, "SDAR-30B-A3B", "--hardware", "A100-80G", "--context-length", "32768", "--explain")
    assert "KV/token (full attention) = 2 x L 48 x Hkv 4/device x D 128 x 2 B (bf16) = 96.00 KiB" in out
    assert "experts touched = 1 - (1 - k 8/E 128)^T" in out
    assert "[cost]" in out and "break-even" in out


def test_json_is_one_document_with_every_section(capsys):
    document = json.loads(
        _run(
            capsys,
            "LLaDA2.0-mini",
            "--hardware",
            "L40S",
            "--context-length",
            "16384",
            "--weight-dtype",
            "fp8",
            "--kv-cache-dtype",
            "fp8",
            "--json",
            "--explain",
        )
    )
    assert document["model"]["active_definition"].startswith("active = parameters one token uses")
    assert document["deployment"]["weight_dtype"] == "fp8"
    assert document["capacity"]["max_seqs_by_kv"] > 0
    assert document["decode"]["forward"]["bound"] in ("memory-bound", "compute-bound")
    assert document["cost"]["cloud_per_million"] > 0 and document["explain"]


def test_custom_hardware_and_request_rate(capsys):
    out = _run(
        capsys,
        "LLaDA2.0-mini",
        "--memory-gib",
        "48",
        "--bandwidth-tbps",
        "1",
        "--tflops",
        "200",
        "--context-length",
        "8192",
        "--request-rate",
        "2",
    )
    assert "on 1 x custom" in out and "Rate        2.0/s needs" in out


def test_calibrate_alone_replans_the_bench_run(capsys):
    out = _run(capsys, "--calibrate", str(FIXTURE))
    assert "Calibrated  bench run: predicted" in out and "(calibrated)" in out
    assert "8 seqs/replica" in out and "block 32" in out


def test_flags_override_calibration(capsys):
    out = _run(
        capsys,
        "Clover-35B-A3B",
        "--context-length",
        "8192",
        "--calibrate",
        str(FIXTURE),
        "--step-overhead-ms",
        "2",
        "--tpf",
        "3",
    )
    assert "step overhead 2.0 ms, TPF 3.0" in out and "MBU 1.0" in out


def test_list_presets(capsys):
    out = _run(capsys, "--list-presets")
    assert "LLaDA2.0-flash" in out and "102.89B total (published 100.00B)" in out and "MI300X" in out


def test_errors_print_one_line_through_the_main_cli(capsys):
    assert main(["plan", "SDAR-30B-A3B", "--context-length", "65536"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("diffuserve plan: error: context_length: 65536 exceeds SDAR-30B-A3B's maximum of 32768")


def test_no_model_given_says_what_to_pass(capsys):
    assert main(["plan"]) == 2
    assert "give a preset name, a model directory or a config.json path" in capsys.readouterr().err


def test_chart_without_matplotlib_says_how_to_install(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plan", "LLaDA2.0-mini", "--context-length", "4096", "--chart", str(tmp_path / "c.png")]) == 2
    assert "pip install 'diffuserve[plot]'" in capsys.readouterr().err


def test_chart_is_a_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "chart.png"
    _run(capsys, "LLaDA2.0-mini", "--context-length", "4096", "--max-num-seqs", "8", "--chart", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--concurrency", "0"], "concurrency: must be > 0, got 0"),
        (["--context-length", "-1"], "context_length: must be > 0"),
        (["--memory-gib", "0"], "--memory-gib: must be > 0"),
        (["--tensor-parallel-size", "0"], "tensor_parallel_size: must be > 0"),
        (["--utilization", "0"], "utilization: must be in (0, 1]"),
    ],
)
def test_non_positive_flags_are_rejected_not_defaulted(capsys, flags, message):
    assert main(["plan", "LLaDA2.0-mini", *flags]) == 2
    assert message in capsys.readouterr().err


def test_the_command_and_the_http_api_share_one_set_of_defaults():
    """`diffuserve plan` with no flag asks for exactly `PlanOptions()`, what the server's POST /plan starts from."""
    import argparse

    from diffuserve.cli.plan import add_arguments
    from diffuserve.planner.options import PlanOptions

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert PlanOptions.from_flags(parser.parse_args([])) == PlanOptions()


def test_replicas_come_with_the_command_that_deploys_them(capsys):
    out = _run(capsys, "Clover-35B-A3B", "--hardware", "H100", "--num-gpus", "4", "-tp", "2")
    line = next(line for line in out.splitlines() if line.startswith("Replicas"))
    assert line.startswith("Replicas    2 servers of 2 GPU(s)")
    command = line[line.index("diffuserve serve") : line.index(" (one machine")].split()[1:]
    args = build_parser("serve").parse_args(command)  # the CLI takes it as printed
    assert (args.replicas, args.tensor_parallel_size, args.gateway) == (2, 2, "smg")
    assert "Replicas" not in _run(capsys, "Clover-35B-A3B", "--hardware", "H100", "--num-gpus", "2", "-tp", "2")
