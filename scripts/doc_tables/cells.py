"""What every table renderer shares: how a renderer reads results (`Load`), and the Markdown table and number
formats of the docs' tables."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Load = Callable[[str], dict[str, Any]]
"""Results file name (no .json) -> its contents ({"command", "result", ...})."""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def pct(x: float, space: str = "") -> str:
    return f"{100 * x:.1f}{space}%"


def sig3(x: float) -> str:
    """Three significant digits, trailing zeros kept (23.0, 5.36, 145)."""
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}" if x else "0"


def ms(seconds: float, digits: int = 1) -> str:
    return f"{1000 * seconds:,.{digits}f}"
