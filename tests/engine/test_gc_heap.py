"""The engine's process keeps the garbage collector off what it holds for good (engine/gc_heap.py): a scoped
freeze leaves the objects alive at its entry out of every collection until its exit and then gives them back, so
what a dropped engine held in cycles is still collected; a process-wide freeze stays. `LLM.generate` steps with
its heap frozen; `diffuserve serve` freezes once it has loaded (tests/server/test_cli.py reads its log)."""

from __future__ import annotations

import gc
import weakref

import pytest

from diffuserve import LLM, SamplingParams
from diffuserve.engine.gc_heap import freeze_heap, frozen_heap


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen():
    """Every test starts and ends with nothing frozen (a test that froze the process gives it back)."""
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_a_scoped_freeze_keeps_earlier_cycles_out_of_collections_and_gives_them_back():
    before = Node()
    alive = weakref.ref(before)
    with frozen_heap():
        assert gc.get_freeze_count() > 0
        del before
        gc.collect()
        assert alive() is not None  # frozen: no collection looks at it
        during = weakref.ref(Node())
        gc.collect()
        assert during() is None  # what the run creates is collected as usual
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert alive() is None


def test_a_scoped_freeze_inside_a_frozen_process_leaves_it_frozen():
    frozen = freeze_heap("test")
    assert frozen > 0
    with frozen_heap():
        pass
    # Still frozen (an unfreeze empties the permanent generation); not an exact count: a frozen object whose last
    # reference goes is freed and leaves it.
    assert gc.get_freeze_count() > frozen // 2


def test_generate_steps_with_its_heap_frozen_and_unfreezes_after(tiny_model_dir, monkeypatch):
    llm = LLM(str(tiny_model_dir), num_pages=64)
    step = llm.engine.step
    frozen_counts = []

    def counting_step():
        frozen_counts.append(gc.get_freeze_count())
        return step()

    monkeypatch.setattr(llm.engine, "step", counting_step)
    outputs = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(outputs[0].outputs[0].token_ids) == 4
    assert frozen_counts and all(count > 0 for count in frozen_counts)
    assert gc.get_freeze_count() == 0
