"""Accuracy vs TPF of a model with checkable tasks (the bundled default model): the `diffuserve eval`
harness's decoding sweep (thresholds, fixed schedules, entropy bounds), for `bench throughput
--accuracy-examples N` and its accuracy-vs-TPF chart. Knows nothing of the tasks themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)


def accuracy_vs_tpf(model_dir: str | Path, num_per_task: int, dtype: str, device: str) -> list[dict[str, Any]]:
    """One row per decoding: exact-match accuracy, TPF and NFE per example on the held-out task examples
    `diffuserve eval` scores (its default selection seed, so the two commands agree)."""
    from diffuserve.eval.harness import decoding_sweep, evaluate_sweep
    from diffuserve.eval.tasks import heldout_examples
    from diffuserve.llm import LLM

    llm = LLM(str(model_dir), dtype=dtype, device=device)
    examples = heldout_examples(num_per_task)
    rows = []
    for r in evaluate_sweep(llm, examples, decoding_sweep(THRESHOLDS, llm.engine.args.block_length)):
        rows.append(
            {
                "decoding": r.label,
                "accuracy": r.accuracy,
                "tokens_per_forward": r.tokens_per_forward,
                "nfe_per_example": r.forwards_per_example,
                "num_examples": r.num_examples,
            }
        )
    return rows
