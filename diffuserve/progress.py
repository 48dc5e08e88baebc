"""Progress bars for long waits (weight loading, offline generation), shown only to a person watching a terminal.

`show_progress(None)` is the default policy: on when stderr is an interactive terminal, off in pipes, logs and
tests. Bars go to stderr (tqdm's default), so stdout stays clean for results.
"""

from __future__ import annotations

import sys
from typing import Any


def show_progress(enabled: bool | None = None) -> bool:
    """`enabled` if given, else whether stderr is an interactive terminal."""
    if enabled is not None:
        return enabled
    return sys.stderr is not None and sys.stderr.isatty()


def progress_bar(total: int, desc: str, unit: str, enabled: bool | None = None) -> Any:
    """A tqdm bar (use as a context manager, `.update(k)`); a disabled one that prints nothing when off."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not show_progress(enabled), dynamic_ncols=True)
