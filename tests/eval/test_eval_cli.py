"""`diffuserve eval`: the sweep's rows and JSON on the bundled model, and one-line errors for bad flags."""

from __future__ import annotations

import json

import pytest

from diffuserve.cli.main import main


def test_eval_sweeps_decoders_on_the_bundled_model(capsys):
    code = main(["eval", "--num-per-task", "4", "--tasks", "copy,max", "--thresholds", "0.5,0.9", "--threads", "1"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    labels = [r["decoding"] for r in summary["results"]]
    assert labels == [
        "default",
        "threshold 0.5",
        "threshold 0.9",
        "fixed 1/step",
        "fixed 2/step",
        "entropy 0.1",
        "entropy 0.35",
        "entropy 1",
        "verified",
        "verified, multi-step drafts",
        "autoregressive",
    ]
    assert summary["num_examples"] == 8
    # Verified decoding commits the autoregressive reading, whatever the drafts: the same reply for every example.
    assert summary["verified_replies_equal_autoregressive"] == 8
    assert summary["defaults"]["decoder"] == "threshold"
    for result in summary["results"]:
        assert set(result["accuracy_by_task"]) == {"copy", "max"}
        assert result["accuracy"] >= 0.75, result
    by_label = {r["decoding"]: r for r in summary["results"]}
    # One token per step cannot beat one token per forward; the confident default decodes several.
    assert by_label["fixed 1/step"]["tokens_per_forward"] <= 1.0
    assert by_label["default"]["tokens_per_forward"] > 1.0
    assert by_label["autoregressive"]["tokens_per_forward"] == 1.0
    assert by_label["verified"]["accuracy"] == by_label["autoregressive"]["accuracy"]
    assert by_label["verified, multi-step drafts"]["accuracy"] == by_label["autoregressive"]["accuracy"]
    assert all(label in "\n".join(lines) for label in labels)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tasks", "add,poetry"], "tasks: unknown poetry"),
        (["--thresholds", "0.5,high"], "thresholds: 'high' is not a number"),
        (["--thresholds", "1.5"], "thresholds: got 1.5, each must be in (0, 1]"),
        (["--num-per-task", "0"], "num_per_task: got 0, must be >= 1"),
    ],
)
def test_bad_flags_give_one_line_errors(capsys, flags, message):
    assert main(["eval", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
