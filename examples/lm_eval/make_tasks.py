"""Writes the local lm-eval-harness tasks for the bundled model (docs/serving/logprobs.md, "Eval harnesses"): held-out
prompts of its six synthetic tasks (diffuserve/eval/tasks.py), as a multiple-choice task (the right answer and
three near misses, each ending the reply with `<|im_end|>`) and as a generate_until task (exact match).

    python examples/lm_eval/make_tasks.py        # rewrites diffuserve_mc.jsonl and diffuserve_gen.jsonl here
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from diffuserve.eval.tasks import Example, heldout_examples

HERE = Path(__file__).parent
END = "<|im_end|>"


def near_misses(example: Example, rng: random.Random) -> list[str]:
    """Three wrong answers of the task's own form, as close to the answer as the task allows."""
    answer = example.answer
    if example.task == "add":
        value = int(answer)
        candidates = [str(value + d) for d in (1, -1, 10, -10, 2)]
    elif example.task in ("max", "lookup"):
        candidates = example.prompt.split(" of ")[1].split()
        if example.task == "max":
            candidates += [str(int(answer) - 1), str((int(answer) + 1) % 10)]
    elif example.task == "sort":
        items = answer.split()
        swaps = [[*items[:i], items[i + 1], items[i], *items[i + 2 :]] for i in range(len(items) - 1)]
        candidates = [example.prompt.split(" ", 1)[1], " ".join(items[::-1])] + [" ".join(s) for s in swaps]
    else:  # copy, reverse: the other direction, and the answer with a letter changed or dropped
        word = example.prompt.split()[-1]
        candidates = [word[::-1], word, answer[:-1], answer[1:] + answer[0], answer + answer[-1]]
    unique = list(dict.fromkeys(c for c in candidates if c != answer))
    rng.shuffle(unique)
    return unique[:3]


def main() -> None:
    rng = random.Random(0)
    examples = heldout_examples(10, seed=2024)
    with open(HERE / "diffuserve_mc.jsonl", "w") as mc, open(HERE / "diffuserve_gen.jsonl", "w") as gen:
        for example in examples:
            choices = [example.answer, *near_misses(example, rng)]
            rng.shuffle(choices)
            row = {"task": example.task, "prompt": example.prompt, "choices": [c + END for c in choices]}
            mc.write(json.dumps({**row, "label": choices.index(example.answer)}) + "\n")
            gen.write(json.dumps({"task": example.task, "prompt": example.prompt, "answer": example.answer}) + "\n")


if __name__ == "__main__":
    main()
