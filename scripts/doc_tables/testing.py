"""docs/internals/testing.md's tables: the family x option matrix (scripts/option_matrix.py) and the HTTP fuzz run's
counts (scripts/fuzz_http.py)."""

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


def fuzz_http(load: Load) -> str:
    """Per operation: the examples drawn (fitting the schema + violating it); then the statuses seen."""
    result = load("fuzz-http")["result"]
    by_operation: dict[str, dict[str, int]] = {}
    for key, count in result["examples_by_operation"].items():
        operation, mode = key.rsplit(" ", 1)
        by_operation.setdefault(operation, {})[mode] = count
    rows = [
        [f"`{op}`", modes.get("positive", 0), modes.get("negative", 0)] for op, modes in sorted(by_operation.items())
    ]
    statuses = ", ".join(f"{status}: {n}" for status, n in result["statuses"].items())
    fives = sum(n for status, n in result["statuses"].items() if int(status) >= 500)
    summary = (
        f"{result['operations']} operations, {result['examples']} examples ({statuses}); {fives} x 5xx, "
        f"{len(result['problems'])} answers that broke the rule."
    )
    return table(["operation", "examples fitting the schema", "examples violating it"], rows) + "\n\n" + summary
