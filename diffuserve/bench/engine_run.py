"""Drives an LLMEngine step by step and records every step: its wall time, the time inside the model, and the
shape of the forward (query tokens, logit rows, attention pairs, K/V read).

The model time comes from forward hooks on the model and from timing wrappers on the model methods the engine
calls outside the forward, its logits and (renoise models) its self-conditioning input (no engine code is changed
to measure it), so "engine overhead" = step wall time - model time: scheduling, batch building, decoders,
bookkeeping.
On a hybrid model the GDN layers' time is taken the same way: from each GDN layer's input norm to its
post-mixer norm (the mixer, its input norm and the residual add). Under tensor / expert parallelism the time
rank 0 spends in its all-reduces (the collective itself plus waiting for the slowest rank) is taken by wrapping
ParallelGroup.all_reduce in this process for the run (the workers are other processes and are not touched).
Knows nothing of reporting.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from diffuserve.core.outputs import RequestOutput
from diffuserve.distributed.group import ParallelGroup
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.model.layers.attention import PagedAttentionInputs
from diffuserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class StepRecord:
    wall_s: float
    """engine.step() from call to return."""
    model_s: float
    """Inside the model's forward and its LM head."""
    num_tokens: int
    num_logit_rows: int
    attention_pairs: int
    """Sum over the step's sequences of query tokens x key positions."""
    kv_tokens_read: int
    num_seqs: int
    prefill_tokens: int
    """Prompt tokens whose K/V this step computed."""
    generated_tokens: int
    """Tokens that became final in this step."""
    gdn_s: float = 0.0
    """Hybrid models: inside the GDN layers' mixers (0 for attention-only models)."""
    comm_s: float = 0.0
    """Several ranks: rank 0's time inside the forward's all-reduces (0 on one device)."""
    comm_bytes: int = 0
    """Several ranks: bytes rank 0 handed to its all-reduces in the forward."""


@dataclass
class RunRecord:
    steps: list[StepRecord] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)
    """Finished requests, in submission order."""
    wall_s: float = 0.0

    @property
    def generated_tokens(self) -> int:
        return sum(len(c.token_ids) for o in self.outputs for c in o.outputs)

    @property
    def num_forwards(self) -> int:
        """NFE summed over requests (a request's NFE counts the forwards it took part in)."""
        return sum(o.num_forwards for o in self.outputs)

    @property
    def tokens_per_forward(self) -> float:
        return self.generated_tokens / self.num_forwards if self.num_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Aggregate: every generated token over the wall time of the whole run (prefill included)."""
        return self.generated_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def decode_steps(self) -> list[StepRecord]:
        """Steps that computed no prompt tokens."""
        return [s for s in self.steps if s.prefill_tokens == 0]


MODEL_METHODS = ("compute_logits", "self_conditioning_input")
"""The model's methods that the engine calls outside its forward and that ForwardProbe times as the model's."""


class ForwardProbe:
    """Forward hooks that time the model and read the shape of each forward. Use as a context manager."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self._handles: list = []
        self._started = self._gdn_started = 0.0
        self.reset()

    def reset(self) -> None:
        self.model_s = self.gdn_s = self.comm_s = 0.0
        self.comm_bytes = 0
        self.num_tokens = self.num_logit_rows = self.attention_pairs = self.kv_tokens_read = self.num_seqs = 0

    def __enter__(self) -> ForwardProbe:
        self._handles = [
            self.model.register_forward_pre_hook(self._before_forward),
            self.model.register_forward_hook(self._after),
        ]
        # The model's own math outside its forward: its logits (the head and whatever the model does to them,
        # DiffusionGemma's final norm and soft cap) and a renoise model's self-conditioning input (soft embeddings,
        # a [rows, V] x [V, H] product as large as the head's). Timed as the model's, not the engine's.
        self._wrapped = [name for name in MODEL_METHODS if callable(getattr(self.model, name, None))]
        for name in self._wrapped:
            setattr(self.model, name, self._timed(getattr(self.model, name), counts_rows=name == "compute_logits"))
        for layer in self.model.modules():
            if getattr(layer, "is_gdn", False):
                before, after = layer.get_submodule("input_layernorm"), layer.get_submodule("post_attention_layernorm")
                self._handles += [
                    before.register_forward_pre_hook(self._before_gdn),
                    after.register_forward_pre_hook(self._after_gdn),
                ]
        self._all_reduce = ParallelGroup.all_reduce
        probe, all_reduce = self, self._all_reduce

        def timed_all_reduce(group: ParallelGroup, tensor: torch.Tensor) -> torch.Tensor:
            started = probe._now()
            out = all_reduce(group, tensor)
            probe.comm_s += probe._now() - started
            probe.comm_bytes += tensor.numel() * tensor.element_size()
            return out

        ParallelGroup.all_reduce = timed_all_reduce  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        for name in self._wrapped:
            delattr(self.model, name)  # the instance attribute goes: the class's method shows again
        ParallelGroup.all_reduce = self._all_reduce  # type: ignore[method-assign]

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _before_forward(self, module: torch.nn.Module, args: tuple) -> None:
        input_ids, attention = args[0], args[2].attention
        self.num_tokens += input_ids.numel()
        if isinstance(attention, PagedAttentionInputs):
            self.num_seqs += len(attention.sequences)
            for seq in attention.sequences:
                self.attention_pairs += seq.query_len * seq.num_keys
                self.kv_tokens_read += seq.num_keys
        self._started = self._now()

    def _timed(self, method: Callable[[torch.Tensor], torch.Tensor], counts_rows: bool) -> Callable:
        def timed(hidden: torch.Tensor) -> torch.Tensor:
            if counts_rows:
                self.num_logit_rows += hidden.shape[0]
            started = self._now()
            out = method(hidden)
            self.model_s += self._now() - started
            return out

        return timed

    def _after(self, module: torch.nn.Module, args: tuple, output: object) -> None:
        self.model_s += self._now() - self._started

    def _before_gdn(self, module: torch.nn.Module, args: tuple) -> None:
        self._gdn_started = self._now()

    def _after_gdn(self, module: torch.nn.Module, args: tuple) -> None:
        self.gdn_s += self._now() - self._gdn_started


_ids = itertools.count()


def run_requests(
    engine: LLMEngine,
    prompts: Sequence[list[int]],
    params: SamplingParams,
    sequential: bool = False,
    on_step: Callable[[StepRecord], None] | None = None,
) -> RunRecord:
    """Runs `prompts` through the engine: all submitted at once (they are batched), or one after another
    (each waits for the previous to finish). Returns every step and every finished output."""
    record = RunRecord()
    device = next(engine.runner.model.parameters()).device
    counters = engine.counters
    started = time.perf_counter()
    with ForwardProbe(engine.runner.model, device) as probe:
        for batch in [[p] for p in prompts] if sequential else [list(prompts)]:
            ids = [f"bench-{next(_ids)}" for _ in batch]
            for request_id, prompt in zip(ids, batch):
                engine.add_request(request_id, prompt, params)
            finished: dict[str, RequestOutput] = {}
            while len(finished) < len(ids):
                probe.reset()
                prefill, generated = counters.num_prefill_tokens, counters.num_generated_tokens
                step_start = time.perf_counter()
                outputs = engine.step()
                wall = time.perf_counter() - step_start
                finished.update((o.request_id, o) for o in outputs if o.finished)
                if probe.num_tokens == 0:
                    continue  # nothing was scheduled: no forward ran
                record.steps.append(
                    StepRecord(
                        wall,
                        probe.model_s,
                        probe.num_tokens,
                        probe.num_logit_rows,
                        probe.attention_pairs,
                        probe.kv_tokens_read,
                        probe.num_seqs,
                        counters.num_prefill_tokens - prefill,
                        counters.num_generated_tokens - generated,
                        probe.gdn_s,
                        probe.comm_s,
                        probe.comm_bytes,
                    )
                )
                if on_step is not None:
                    on_step(record.steps[-1])
            record.outputs += [finished[i] for i in ids]
    record.wall_s = time.perf_counter() - started
    return record
