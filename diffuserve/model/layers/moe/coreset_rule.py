"""Block expert coreset rules as data: which experts a group of positions may route to, and which groups.

Two rules (docs/models/coreset.md, "Block expert coreset routing"):

    fixed        `--block-expert-coreset 4`: the C experts with the largest summed softmax probability over the
                 block; applies to the denoised block only (prefill and commits route per token)
    cumulative   `--block-expert-coreset cumulative:0.6,min=16,window=32` (dMoE's gate): in every window of
                 `window` positions aligned to the sequence start, each position's top-k biased router scores
                 are summed over the window and normalised; the coreset is the experts whose cumulative share
                 stays within the threshold plus the first past it, or, when that is fewer than `min`, the
                 `min` best; applies to every window of every forward (prefill, commits and the denoised block)

The rule comes from config.json (a coreset size key, or dMoE's `core_threshold` with `mode` "aggregate") or from
the flag, which wins. Standard library only: the planner, the CLI and model/config.py read it; how the routing is
computed is coreset.py's and window_coreset.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

DMOE_GUARD = 16
"""dMoE's guard: a window's coreset holds at least this many experts (its gate's `guard_size`)."""
DMOE_WINDOW = 32
"""dMoE's window: the gate splits each forward into windows of this many positions (its `block_size`)."""
SYNTAX = "an integer C >= 0 (fixed rule) or cumulative:T[,min=M][,window=W] with 0 < T <= 1 (dMoE's rule)"


@dataclass(frozen=True)
class CoresetRule:
    kind: str
    """"fixed" or "cumulative"."""
    size: int = 0
    """fixed: C, the experts a denoised block routes within."""
    threshold: float = 0.0
    """cumulative: the share of the window's votes the coreset covers (dMoE's `core_threshold`)."""
    minimum: int = DMOE_GUARD
    """cumulative: the guard, the fewest experts a coreset holds."""
    window: int = DMOE_WINDOW
    """cumulative: positions per window, windows aligned to position 0."""

    @property
    def every_window(self) -> bool:
        """Where the rule applies: every window of every forward (True) or the denoised block only (False)."""
        return self.kind == "cumulative"

    def describe(self) -> str:
        """The rule in the flag's syntax."""
        if self.kind == "fixed":
            return str(self.size)
        return f"cumulative:{self.threshold:g},min={self.minimum},window={self.window}"


def fixed_rule(size: int) -> CoresetRule | None:
    """The fixed rule of C experts (None for 0: routing per token)."""
    return CoresetRule("fixed", size=size) if size else None


def _bad(value: object, why: str) -> ValueError:
    return ValueError(f"block_expert_coreset: {value!r} {why}; give {SYNTAX}")


def parse_coreset_rule(value: object) -> CoresetRule | None:
    """The flag's value (an int or its text) -> the rule, None for 0. ValueError: one line naming the value and
    the syntax."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise _bad(value, "is negative")
        return fixed_rule(value)
    if not isinstance(value, str):
        raise _bad(value, "is neither a number nor a rule")
    text = value.strip()
    if text.isdigit():
        return fixed_rule(int(text))
    kind, _, body = text.partition(":")
    if kind != "cumulative" or not body:
        raise _bad(value, "is not a rule")
    threshold_text, *options = body.split(",")
    fields: dict[str, int] = {}
    for option in options:
        name, _, number = option.partition("=")
        if name not in ("min", "window") or name in fields or not number.isdigit() or int(number) < 1:
            raise _bad(value, f"has a bad option {option!r} (min= and window= take integers >= 1, once each)")
        fields[name] = int(number)
    try:
        threshold = float(threshold_text)
    except ValueError:
        raise _bad(value, f"has threshold {threshold_text!r}, not a number") from None
    return cumulative_rule(threshold, fields.get("min", DMOE_GUARD), fields.get("window", DMOE_WINDOW), str(value))


def cumulative_rule(
    threshold: float, minimum: int = DMOE_GUARD, window: int = DMOE_WINDOW, source: str = ""
) -> CoresetRule:
    """dMoE's rule; ValueError for a threshold outside (0, 1]."""
    if not 0 < threshold <= 1:
        raise ValueError(
            f"core_threshold: {threshold!r} is outside (0, 1] (the share of a window's votes the coreset covers)"
            + (f" in block_expert_coreset {source!r}" if source else "")
            + "; dMoE-16B uses 0.6"
        )
    return CoresetRule("cumulative", threshold=threshold, minimum=minimum, window=window)


def rule_from_config(config: dict, size: int) -> CoresetRule | None:
    """config.json's rule: dMoE's `core_threshold` (its `mode` must be "aggregate", the only one its gate runs),
    else the fixed rule of `size` (the coreset size keys, model/config.py). ValueError naming the key."""
    for scope in (config, config.get("text_config") or {}):
        threshold = scope.get("core_threshold")
        if threshold is None:
            continue
        mode = scope.get("mode", "aggregate")
        if mode != "aggregate":
            raise ValueError(
                f"config.json: `mode` is {mode!r}; dMoE's gate runs only 'aggregate' (the cumulative coreset); "
                "set it to 'aggregate'"
            )
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(f"config.json: `core_threshold` is {threshold!r}; give a number in (0, 1], e.g. 0.6")
        return cumulative_rule(float(threshold))
    return fixed_rule(size)
