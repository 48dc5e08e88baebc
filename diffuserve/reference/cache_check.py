"""The engine's cached forwards against a full recompute, compared at the logits.

Token parity hides numerical drift: a test model's confident LM head turns a small error in the cached K/V into
the same argmax. This check records every paged forward the engine runs while it generates (prefill chunks, and
each current block with the previous block's fused commit ahead of it), through a forward hook on the model, so
it knows nothing of the engine's internals but the model's own inputs: which cache slot each position's K/V lives
in, and which token was last written there. Afterwards it recomputes each recorded forward from scratch (the
same tokens at positions 0..L-1, no cache, the block-causal mask) and compares the logits of every query
position. It also checks that the tokens the cache held before the current block are those of the final answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from diffuserve import LLM
from diffuserve.model.layers.attention import DenseAttentionInputs, PagedAttentionInputs
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.reference_decode import block_causal_mask
from diffuserve.reference.reference_model import ReferenceModel
from diffuserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class RecordedForward:
    context: list[int]
    """[L] the tokens behind key positions 0..L-1: those cached, then this forward's own."""
    hidden: torch.Tensor
    """[Lq, H] the engine's hidden states at the last Lq positions (its queries)."""


@dataclass(frozen=True)
class CacheCheck:
    num_checked: int
    """Sequence forwards recomputed (one per request per engine step)."""
    num_fused: int
    """Of those, forwards whose queries held more than one block (a commit or prefill ahead of the block)."""
    max_abs_diff: float
    """Largest |engine logit - recomputed logit| over every query position of every forward."""
    bad_contexts: list[str]
    """Forwards whose cached tokens before the current block are not those of any request's final answer, or
    that could not be recorded."""


class ForwardRecorder:
    """Records the paged forwards of every module with `compute_logits` (the model) while in a `with` block."""

    def __init__(self) -> None:
        self.forwards: list[RecordedForward] = []
        self.problems: list[str] = []
        """Forwards that could not be recorded (a slot written before recording began, e.g. a prefix-cache hit)."""
        self._slot_tokens: dict[int, int] = {}
        self._handle: RemovableHandle | None = None

    def __enter__(self) -> ForwardRecorder:
        self._handle = nn.modules.module.register_module_forward_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._handle is not None, "ForwardRecorder: __exit__ without __enter__"
        self._handle.remove()

    def _hook(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if not hasattr(module, "compute_logits") or len(args) < 3 or not isinstance(args[2], StepInputs):
            return
        attn = args[2].attention
        if not isinstance(attn, PagedAttentionInputs):
            return
        input_ids, positions = args[0].tolist(), args[1].tolist()
        self._slot_tokens.update(zip(attn.slot_mapping.tolist(), input_ids))
        # NOTE: never raises: the engine would fail the step's requests and carry on.
        for seq in attn.sequences:
            length, rows = len(seq.key_slots), slice(seq.query_start, seq.query_start + seq.query_len)
            unknown = [s for s in seq.key_slots.tolist() if s not in self._slot_tokens]
            if positions[rows] != list(range(length - seq.query_len, length)) or unknown:
                self.problems.append(f"queries at {positions[rows]} of {length} keys; slots never written: {unknown}")
                continue
            context = [self._slot_tokens[s] for s in seq.key_slots.tolist()]
            self.forwards.append(RecordedForward(context, output[rows].detach().float().clone()))


def check_cached_logits(
    llm: LLM, reference: ReferenceModel, prompts: list[list[int]], params: list[SamplingParams]
) -> CacheCheck:
    """Generates the prompts (one batch) on the engine, recording its forwards; recomputes each on `reference`'s
    model (the same checkpoint, loaded on its own). The engine must not hit its prefix cache on pages written
    before this call (a fresh engine, or prefix caching off)."""
    with ForwardRecorder() as recorder:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    answers = [p + o.outputs[0].token_ids for p, o in zip(prompts, outputs)]
    block, worst, bad = reference.block_length, 0.0, list(recorder.problems)
    for forward in recorder.forwards:
        settled = (len(forward.context) - 1) // block * block  # positions before the forward's last block
        if not any(a[:settled] == forward.context[:settled] for a in answers):
            bad.append(f"cached tokens {forward.context[:settled]} are no answer's prefix")
        worst = max(worst, _max_logit_diff(reference, forward))
    fused = sum(len(f.hidden) > block for f in recorder.forwards)
    return CacheCheck(len(recorder.forwards), fused, worst, bad)


@torch.inference_mode()
def _max_logit_diff(reference: ReferenceModel, forward: RecordedForward) -> float:
    model, length, num_queries = reference.model, len(forward.context), len(forward.hidden)
    mask = block_causal_mask(-(-length // reference.block_length), reference.block_length)[:length, :length]
    attention = StepInputs(DenseAttentionInputs(mask[None, None]))
    hidden = model(torch.tensor(forward.context)[None], torch.arange(length)[None], attention)  # [1, L, H]
    expected = model.compute_logits(hidden[0, length - num_queries :])
    got = model.compute_logits(forward.hidden.to(hidden.dtype))
    return float((got - expected).abs().max())
