"""Runs task examples through the engine as chat requests and scores them: exact-match accuracy per task, TPF, NFE.

Owns the decoding sweep of `diffuserve eval` and the scoring loop shared by the CLI, the training script and
the tests. Knows nothing of training. Every prompt goes through the model's own chat template and tokenizer,
exactly as `diffuserve chat` and the server send it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diffuserve.errors import UnsupportedParameter
from diffuserve.eval.tasks import Example, is_correct
from diffuserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from diffuserve.llm import LLM

MAX_TOKENS = 48
"""Every task's answer (with its <|im_end|>) fits well within this."""


@dataclass(frozen=True)
class EvalResult:
    label: str
    """The decoding, e.g. `threshold 0.9`."""
    accuracy_by_task: dict[str, float]
    num_examples: int
    num_correct: int
    num_tokens: int
    """Generated tokens, stop token included."""
    num_forwards: int
    replies: tuple[str, ...] = ()
    """Each example's reply, in order (to compare two decodings' outputs)."""

    @property
    def accuracy(self) -> float:
        return self.num_correct / self.num_examples

    @property
    def tokens_per_forward(self) -> float:
        return self.num_tokens / self.num_forwards if self.num_forwards else 0.0

    @property
    def forwards_per_example(self) -> float:
        return self.num_forwards / self.num_examples

    def summary(self) -> dict[str, Any]:
        """The JSON-ready numbers, rounded."""
        return {
            "decoding": self.label,
            "accuracy": round(self.accuracy, 4),
            "tokens_per_forward": round(self.tokens_per_forward, 3),
            "nfe_per_example": round(self.forwards_per_example, 3),
            "accuracy_by_task": {task: round(acc, 4) for task, acc in self.accuracy_by_task.items()},
        }


AUTOREGRESSIVE = "autoregressive"
"""The label of the row decoded at block length 1 (one token per forward, read from the causal row before it:
the model's autoregressive reading), by a second engine (`diffuserve eval` builds it)."""
VERIFIED = "verified"
"""The label of the row decoded with decoder=verified: one-forward drafts kept where the causal rows agree, so its
replies are the autoregressive row's."""
VERIFIED_ROWS = (VERIFIED, "verified, multi-step drafts")
"""The second verified row drafts each block by the threshold policy over up to block_length forwards (`steps`):
other drafts, the same replies (the causal check decides every token), so the draft only trades speed."""


def decoding_sweep(thresholds: Sequence[float], block_length: int) -> list[tuple[str, SamplingParams]]:
    """(label, params) for the model's default decoding, each threshold, the fixed schedule at 1 and 2 tokens a
    step, three entropy bounds, and verified decoding (one-forward and multi-step drafts)."""
    sweep = [("default", SamplingParams())]
    sweep += [(f"threshold {t:g}", SamplingParams(decoder="threshold", threshold=t)) for t in thresholds]
    for steps in sorted({block_length, max(1, block_length // 2)}, reverse=True):
        sweep.append((f"fixed {block_length // steps}/step", SamplingParams(decoder="fixed", steps=steps)))
    sweep += [(f"entropy {b:g}", SamplingParams(decoder="entropy", entropy_bound=b)) for b in (0.1, 0.35, 1.0)]
    sweep.append((VERIFIED, SamplingParams(decoder="verified")))
    sweep.append((VERIFIED_ROWS[1], SamplingParams(decoder="verified", steps=block_length)))
    return sweep


def evaluate(llm: LLM, examples: Sequence[Example], params: SamplingParams, label: str = "") -> EvalResult:
    """Generates a reply to every example in one batch and scores it by exact match."""
    conversations = [[{"role": "user", "content": e.prompt}] for e in examples]
    outputs = llm.chat(conversations, params.replace(max_tokens=MAX_TOKENS))
    correct: dict[str, list[bool]] = {}
    num_tokens = num_forwards = 0
    replies = tuple(output.outputs[0].text for output in outputs)
    for example, output in zip(examples, outputs):
        completion = output.outputs[0]
        correct.setdefault(example.task, []).append(is_correct(example, completion.text))
        num_tokens += len(completion.token_ids)
        num_forwards += completion.num_forwards
    by_task = {task: sum(hits) / len(hits) for task, hits in correct.items()}
    num_correct = sum(sum(hits) for hits in correct.values())
    return EvalResult(label, by_task, len(examples), num_correct, num_tokens, num_forwards, replies)


def evaluate_sweep(
    llm: LLM, examples: Sequence[Example], sweep: Sequence[tuple[str, SamplingParams]]
) -> list[EvalResult]:
    """`evaluate` for each row of `sweep`, leaving out the rows whose decoder the model refuses (verified decoding
    on a model whose causal rows predict no next token: SDAR, LLaDA2)."""
    results = []
    for label, params in sweep:
        try:
            results.append(evaluate(llm, examples, params, label))
        except UnsupportedParameter:
            continue
    return results


def same_replies(results: Sequence[EvalResult], labels: Sequence[str], other: str) -> int | None:
    """How many examples got the same reply from `other` and every row of `labels`; None unless all were run."""
    rows = {r.label: r for r in results}
    if other not in rows or any(label not in rows for label in labels):
        return None
    replies = zip(rows[other].replies, *(rows[label].replies for label in labels), strict=True)
    return sum(len(set(per_row)) == 1 for per_row in replies)


def format_table(results: Sequence[EvalResult]) -> str:
    """A fixed-width table: one row per decoding, accuracy overall and per task, TPF and NFE per example."""
    tasks = list(results[0].accuracy_by_task)
    width = max(18, *(len(r.label) for r in results))
    header = f"{'decoding':<{width}} {'acc':>6} " + " ".join(f"{t:>7}" for t in tasks) + f" {'TPF':>5} {'NFE/ex':>7}"
    rows = [header, "-" * len(header)]
    for r in results:
        per_task = " ".join(f"{100 * r.accuracy_by_task[t]:6.1f}%" for t in tasks)
        rows.append(
            f"{r.label:<{width}} {100 * r.accuracy:5.1f}% {per_task} {r.tokens_per_forward:5.2f} "
            f"{r.forwards_per_example:7.2f}"
        )
    return "\n".join(rows)
