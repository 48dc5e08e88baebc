"""docs/testing.md's tables: the family x option matrix (scripts/option_matrix.py) and the HTTP fuzz run's counts
(scripts/fuzz_http.py)."""

from __future__ import annotations

from scripts.doc_tables.cells import Load, table


def option_matrix(load: Load) -> str:
    """One row per option or combination, one column per family: ✓ the reference's tokens, "no N" refused (the
    N-th message below), "ran" no reference for it, † a cell only the script runs (not CI)."""
    cells = load("option-matrix")["result"]["cells"]
    families = list(dict.fromkeys(c["family"] for c in cells))
    combos = list(dict.fromkeys(" + ".join(c["options"]) for c in cells))
    refusals: dict[str, int] = {}
    grid: dict[tuple[str, str], str] = {}
    for c in cells:
        outcome = c["outcome"]
        if outcome == "exact":
            mark = "✓"
        elif outcome.startswith("refused: "):
            mark = f"no {refusals.setdefault(outcome.removeprefix('refused: '), len(refusals) + 1)}"
        elif outcome.startswith("ran"):
            mark = "ran"
        else:
            mark = "**FAIL**"
        grid[" + ".join(c["options"]), c["family"]] = mark + (" †" if c["slow"] else "")
    rows = [[f"`{combo}`", *(grid.get((combo, f), "") for f in families)] for combo in combos]
    notes = "\n".join(f"{n}. {message}" for message, n in refusals.items())
    return table(["option(s)", *families], rows) + "\n\nRefusals (each before any step, one line):\n\n" + notes
