"""The synthetic instruction tasks the bundled model is trained and evaluated on, with exact answers.

Owns the task generators, the deterministic train / held-out split and exact-match scoring. Pure Python: knows
nothing of tokens, models or the engine. Invariant: a prompt is held out iff a hash of (task, prompt) says so,
so the training stream never contains a held-out prompt, whatever the seeds.
"""

from __future__ import annotations

import json
import random
import string
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

HELDOUT_BUCKETS = 10
"""One prompt in HELDOUT_BUCKETS (by crc32) is held out from training."""


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    """The user message."""
    answer: str
    """The exact expected assistant reply."""


def _digits(rng: random.Random, low: int, high: int) -> list[str]:
    return [str(rng.randint(0, 9)) for _ in range(rng.randint(low, high))]


def _letters(rng: random.Random, low: int, high: int, alphabet: str = string.ascii_lowercase) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"What is {a}+{b}?", str(a + b)


def reverse(rng: random.Random) -> tuple[str, str]:
    word = _letters(rng, 3, 6)
    return f"Reverse {word}", word[::-1]


def sort(rng: random.Random) -> tuple[str, str]:
    items = _digits(rng, 3, 6)
    return f"Sort {' '.join(items)}", " ".join(sorted(items))


def copy(rng: random.Random) -> tuple[str, str]:
    word = _letters(rng, 3, 8)
    return f"Copy {word}", word


def maximum(rng: random.Random) -> tuple[str, str]:
    items = _digits(rng, 3, 6)
    return f"Max of {' '.join(items)}", max(items)


def lookup(rng: random.Random) -> tuple[str, str]:
    items = rng.sample(string.ascii_lowercase, rng.randint(3, 5))
    index = rng.randint(1, len(items))
    return f"Item {index} of {' '.join(items)}", items[index - 1]


def add_json(rng: random.Random) -> tuple[str, str]:
    # A short prompt: with its 15-16 answer tokens the example stays within the longest sort (48 tokens), so
    # training batches keep their width.
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"{a}+{b} in JSON", json.dumps({"answer": a + b})


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "add": add,
    "reverse": reverse,
    "sort": sort,
    "copy": copy,
    "max": maximum,
    "lookup": lookup,
}
"""The evaluated tasks (`diffuserve eval`, the training script's check)."""
JSON_TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {"add_json": add_json}
"""Answer-format variants: a task asked for a JSON reply (`{"answer": 42}`, written with the separators the
grammar engine allows). Trained so that a JSON schema constraint finds the answer the model gives free; scored by
scripts/structured_tpf.py, not counted in the evaluated tasks."""
GENERATORS = {**TASKS, **JSON_TASKS}

TRAIN_WEIGHTS = {"add": 3.5, "reverse": 1.0, "sort": 1.0, "copy": 1.0, "max": 1.0, "lookup": 1.5}
"""Training mix (the sdar model's): addition (carries) and lookups (position arithmetic) are the slowest to learn,
so they are drawn more often."""


def is_heldout(task: str, prompt: str) -> bool:
    return zlib.crc32(f"{task}|{prompt}".encode()) % HELDOUT_BUCKETS == 0


def training_stream(seed: int, mix: dict[str, float] | None = None) -> Iterator[Example]:
    """An endless, seeded stream of training examples drawn by `mix` (task -> weight; default TRAIN_WEIGHTS),
    never a held-out prompt."""
    rng = random.Random(seed)
    mix = mix or TRAIN_WEIGHTS
    names, weights = list(mix), list(mix.values())
    while True:
        task = rng.choices(names, weights)[0]
        prompt, answer = GENERATORS[task](rng)
        if not is_heldout(task, prompt):
            yield Example(task, prompt, answer)


def training_batches(
    seed: int, batch_size: int, mix: dict[str, float] | None = None, turns: dict[int, float] | None = None
) -> Iterator[list[tuple[Example, ...]]]:
    """An endless, seeded stream of training batches of conversations. Each batch draws its number of turns n by
    `turns` (n -> weight; default: one turn only) and holds batch_size // n conversations of n user / assistant
    turns, consecutive examples of training_stream(seed, mix): about batch_size turns per batch whatever n, and
    never a held-out prompt in any turn."""
    examples = training_stream(seed, mix)
    rng = random.Random(seed + 1)
    counts, weights = list(turns or {1: 1.0}), list((turns or {1: 1.0}).values())
    while True:
        n = rng.choices(counts, weights)[0]
        yield [tuple(next(examples) for _ in range(n)) for _ in range(max(1, batch_size // n))]


def heldout_examples(num_per_task: int, seed: int = 1234, tasks: list[str] | None = None) -> list[Example]:
    """`num_per_task` distinct held-out examples of each task (default: TASKS, in order), the same for the same
    seed."""
    rng = random.Random(seed)
    examples = []
    for task in tasks or list(TASKS):
        seen: set[str] = set()
        while len(seen) < num_per_task:
            prompt, answer = GENERATORS[task](rng)
            if is_heldout(task, prompt) and prompt not in seen:
                seen.add(prompt)
                examples.append(Example(task, prompt, answer))
    return examples


def is_correct(example: Example, reply: str) -> bool:
    """Exact match, ignoring surrounding whitespace."""
    return reply.strip() == example.answer
