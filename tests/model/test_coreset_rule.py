"""Coreset rules as data: the flag's syntax and config.json's keys, their one-line errors, and the cumulative rule
(dMoE's gate) on hand-set scores: the share, the first expert past it, the guard."""

from __future__ import annotations

import re

import pytest
import torch

from diffuserve.model.layers.moe.coreset_rule import CoresetRule, parse_coreset_rule, rule_from_config
from diffuserve.model.layers.moe.window_coreset import cumulative_coreset, forward_windows


def test_the_flag_syntax():
    assert parse_coreset_rule(0) is None and parse_coreset_rule("0") is None
    assert parse_coreset_rule("4") == CoresetRule("fixed", size=4)
    rule = parse_coreset_rule("cumulative:0.6")
    assert rule == CoresetRule("cumulative", threshold=0.6, minimum=16, window=32) and rule.every_window
    assert parse_coreset_rule("cumulative:0.3,min=8,window=64") == CoresetRule("cumulative", 0, 0.3, 8, 64)
    assert rule.describe() == "cumulative:0.6,min=16,window=32" and not parse_coreset_rule(4).every_window


@pytest.mark.parametrize(
    "value, message",
    [
        ("cumulative", "'cumulative' is not a rule; give an integer C >= 0"),
        ("top:0.5", "'top:0.5' is not a rule"),
        ("cumulative:x", "has threshold 'x', not a number"),
        ("cumulative:1.5", "core_threshold: 1.5 is outside (0, 1]"),
        ("cumulative:0.6,min=0", "has a bad option 'min=0'"),
        ("cumulative:0.6,size=3", "has a bad option 'size=3'"),
        (-2, "-2 is negative"),
    ],
)
def test_bad_rules_name_the_value_and_the_syntax(value, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        parse_coreset_rule(value)
    assert "\n" not in str(error.value)


def test_config_json_keys():
    assert rule_from_config({"mode": "aggregate", "core_threshold": 0.6}, 0) == parse_coreset_rule("cumulative:0.6")
    assert rule_from_config({"core_threshold": 0.6}, 0) == parse_coreset_rule("cumulative:0.6")
    assert rule_from_config({}, 4) == CoresetRule("fixed", size=4) and rule_from_config({}, 0) is None
    with pytest.raises(ValueError, match=r"config\.json: `mode` is 'sequence'; dMoE's gate runs only 'aggregate'"):
        rule_from_config({"mode": "sequence", "core_threshold": 0.6}, 0)
    with pytest.raises(ValueError, match=r"config\.json: `core_threshold` is 'high'"):
        rule_from_config({"core_threshold": "high"}, 0)


def test_the_cumulative_rule_on_hand_set_scores():
    """One window of 2 rows, 20 experts, top-2 votes: shares 0.4 (e0), 0.3 (e1), 0.2 (e2), 0.1 (e3)."""
    biased = torch.full((1, 2, 20), -1.0)
    biased[0, 0, [0, 1]] = torch.tensor([0.4, 0.3])
    biased[0, 1, [2, 3]] = torch.tensor([0.2, 0.1])
    kept = lambda t, m: cumulative_coreset(biased, 2, t, m)[0].nonzero().flatten().tolist()  # noqa: E731
    assert kept(0.5, 1) == [0, 1]  # 0.4 <= 0.5, then the first past it
    assert kept(0.75, 1) == [0, 1, 2]
    assert kept(0.1, 1) == [0]  # the first expert is always kept, and is the first past
    assert len(kept(0.5, 16)) == 16 and {0, 1, 2, 3} <= set(kept(0.5, 16))  # the guard: the 16 best votes


def test_windows_are_aligned_to_the_sequence_start():
    # a commit of 64 positions from 32, a block at 96, then another request's block at 0 and a 16-row block at 32
    positions = [*range(32, 96), *range(96, 128), *range(0, 32), *range(32, 48)]
    assert forward_windows(positions, 32) == ((0, 32), (32, 32), (64, 32), (96, 32), (128, 16))
    assert forward_windows([*range(40, 70)], 32) == ((0, 24), (24, 6))
