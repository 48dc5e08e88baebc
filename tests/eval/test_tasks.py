"""The synthetic tasks: deterministic for a seed, exactly correct answers, and a clean train / held-out split."""

from __future__ import annotations

import itertools
import json
import re

from diffuserve.decoding.grammar_compiler import JSON_SEPARATORS
from diffuserve.eval.tasks import (
    GENERATORS,
    TASKS,
    Example,
    heldout_examples,
    is_correct,
    is_heldout,
    training_batches,
    training_stream,
)
from scripts.training.clover_moe_model import CLOVER_MOE_MIX, CLOVER_MOE_TURNS


def _solve(example: Example) -> str:
    """An independent solver for every task, from the prompt text alone."""
    p = example.prompt
    if m := re.fullmatch(r"What is (\d+)\+(\d+)\?", p):
        return str(int(m[1]) + int(m[2]))
    if m := re.fullmatch(r"Reverse ([a-z]+)", p):
        return "".join(reversed(m[1]))
    if m := re.fullmatch(r"Sort ([\d ]+)", p):
        return " ".join(sorted(m[1].split(), key=int))
    if m := re.fullmatch(r"Copy ([a-z]+)", p):
        return m[1]
    if m := re.fullmatch(r"Max of ([\d ]+)", p):
        return str(max(int(d) for d in m[1].split()))
    if m := re.fullmatch(r"Item (\d) of ([a-z ]+)", p):
        return m[2].split()[int(m[1]) - 1]
    if m := re.fullmatch(r"(\d+)\+(\d+) in JSON", p):
        return f'{{"answer": {int(m[1]) + int(m[2])}}}'
    raise AssertionError(f"unparsed prompt {p!r}")


def test_answers_are_correct():
    examples = heldout_examples(50) + list(itertools.islice(training_stream(3), 600))
    assert {e.task for e in examples} == set(TASKS)
    examples += heldout_examples(50, tasks=["add_json"]) + list(
        itertools.islice(training_stream(3, CLOVER_MOE_MIX), 600)
    )
    assert {e.task for e in examples} == set(GENERATORS)
    for example in examples:
        assert _solve(example) == example.answer, example
        assert is_correct(example, f" {example.answer}\n")
        assert not is_correct(example, example.answer + "0")


def test_json_answers_are_what_the_json_grammar_writes():
    """`{"answer": 42}`, with the separators the constrained decoder's JSON grammar allows (and no others)."""
    separators = (JSON_SEPARATORS["item_separator"], JSON_SEPARATORS["key_separator"])
    for example in heldout_examples(20, tasks=["add_json"]):
        assert example.answer == json.dumps(json.loads(example.answer), separators=separators)
        assert list(json.loads(example.answer)) == ["answer"]


def test_generators_are_deterministic():
    assert heldout_examples(20, seed=5) == heldout_examples(20, seed=5)
    assert heldout_examples(20, seed=5) != heldout_examples(20, seed=6)
    first = list(itertools.islice(training_stream(0), 200))
    assert first == list(itertools.islice(training_stream(0), 200))
    assert first != list(itertools.islice(training_stream(1), 200))


def test_training_never_sees_a_heldout_prompt():
    heldout = heldout_examples(30)
    assert all(is_heldout(e.task, e.prompt) for e in heldout)
    assert len({(e.task, e.prompt) for e in heldout}) == len(heldout)
    heldout += heldout_examples(30, tasks=["add_json"])
    train = list(itertools.islice(training_stream(0), 3000)) + list(
        itertools.islice(training_stream(0, CLOVER_MOE_MIX), 3000)
    )
    assert not any(is_heldout(e.task, e.prompt) for e in train)
    assert not {(e.task, e.prompt) for e in heldout} & {(e.task, e.prompt) for e in train}


def test_no_turn_of_a_training_conversation_is_heldout():
    """Multi-turn training conversations: every turn's prompt obeys the held-out rule, the batches have about
    batch_size turns whatever their number of turns, and the bundled model's mix of lengths is drawn."""
    heldout = {(e.task, e.prompt) for e in heldout_examples(30) + heldout_examples(30, tasks=["add_json"])}
    batches = list(itertools.islice(training_batches(0, 32, CLOVER_MOE_MIX, CLOVER_MOE_TURNS), 300))
    lengths = set()
    for batch in batches:
        n = len(batch[0])
        lengths.add(n)
        assert all(len(turns) == n for turns in batch) and len(batch) == 32 // n
        for turns in batch:
            assert not any(is_heldout(e.task, e.prompt) for e in turns), turns
            assert not heldout & {(e.task, e.prompt) for e in turns}
    assert lengths == set(CLOVER_MOE_TURNS)
    assert batches == list(itertools.islice(training_batches(0, 32, CLOVER_MOE_MIX, CLOVER_MOE_TURNS), 300))
