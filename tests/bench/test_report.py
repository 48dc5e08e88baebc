"""Percentiles, distributions, the human table and the JSON line (pure helpers of every benchmark)."""

from __future__ import annotations

import json
import math

from diffuserve.bench.report import distribution, emit_json, format_table, percentile


def test_percentile_interpolates_like_numpy():
    values = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4: rank (n - 1) q / 100
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == 3.7
    assert percentile([5.0], 99) == 5.0
    assert math.isnan(percentile([], 50))


def test_distribution():
    assert distribution([1.0, 3.0], scale=1000) == {
        "mean": 2000.0,
        "p50": 2000.0,
        "p90": 2800.0,
        "p99": 2980.0,
        "max": 3000.0,
    }
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}


def test_table_and_json_line(tmp_path, capsys):
    text = format_table(["name", "tok/s"], [["a", 1234.5678], ["bb", 0.123456], ["c", None]])
    assert text.splitlines() == ["name    tok/s", "----  -------", "   a  1,234.6", "  bb    0.123", "   c        -"]
    out = tmp_path / "r.json"
    emit_json({"x": 1.23456789, "y": [2.0, {"z": 3.14159265}]}, str(out))
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and json.loads(line) == {"x": 1.23457, "y": [2.0, {"z": 3.14159}]}
    assert json.loads(out.read_text()) == json.loads(line)
