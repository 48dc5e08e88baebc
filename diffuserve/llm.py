"""LLM: the offline API (vLLM's shape). `LLM(model, **engine options).generate(prompts, params)` runs every
prompt through one engine concurrently and returns the outputs in prompt order, with a progress bar (vLLM's
`use_tqdm`: by default only when stderr is an interactive terminal). `model` is a directory or a Hugging Face
Hub id (`diffuserve.model.hub`).

A request that fails inside the engine (an exception in a step, a grammar that failed) is an error the caller
sees: once every request of the call has finished, `generate` / `chat` raise `GenerationFailed`, which names the
request and the cause and carries every output of the call (vLLM raises too, though its engine dies with the
step; here the engine goes on serving, so the other requests' outputs are kept on the exception).

Its life: `shutdown()` (or leaving `with LLM(...) as llm:`, or the object being garbage collected) stops the
worker processes of a parallel engine, destroys the process group, unpins the host memory it pinned and drops
the model and its caches, so that another `LLM`, with another parallel layout, can start in the same process."""

from __future__ import annotations

import gc
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast, overload

from tqdm.auto import tqdm

from diffuserve.config import EngineConfig
from diffuserve.core.outputs import RequestOutput
from diffuserve.engine import live_weights
from diffuserve.engine.gc_heap import frozen_heap
from diffuserve.engine.llm_engine import LLMEngine
from diffuserve.errors import GenerationFailed
from diffuserve.lora_request import LoRARequest
from diffuserve.model.hub import resolve_model
from diffuserve.sampling_params import RequestOutputKind, SamplingParams
from diffuserve.text.chat_template import chat_token_ids

if TYPE_CHECKING:
    import torch

PromptType = str | list[int] | dict[str, Any]
Conversation = list[dict[str, Any]]
"""OpenAI-shaped chat messages."""


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        self._attach(LLMEngine(EngineConfig.from_kwargs(resolve_model(str(model)), **kwargs)))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """The offline API over an engine built elsewhere (a benchmark baseline's, bench/baselines)."""
        llm = cls.__new__(cls)
        llm._attach(engine)
        return llm

    def _attach(self, engine: LLMEngine) -> None:
        self._engine: LLMEngine | None = engine
        self._counter = 0

    @property
    def engine(self) -> LLMEngine:
        if self._engine is None:
            raise RuntimeError("LLM: this LLM was shut down; create a new one")
        return self._engine

    def shutdown(self) -> None:
        """Stops the worker processes and destroys the process group of a parallel engine, unpins its host memory
        and drops the model and its caches (idempotent; any later call raises)."""
        engine, self._engine = getattr(self, "_engine", None), None
        if engine is None:
            return
        engine.shutdown()
        del engine
        gc.collect()  # the model and its caches hold reference cycles (modules); free their memory now
        _release_cuda_cache()

    def __enter__(self) -> LLM:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.shutdown()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:  # garbage collected without shutdown(): stop the workers, free the group
            engine.shutdown()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Prompts: text, token ids, or {"prompt": ...} / {"prompt_token_ids": [...]}. One params for all, or one
        per prompt. `use_tqdm`: a progress bar of finished prompts (None: when stderr is a terminal).
        `lora_request`: the LoRA adapter of every prompt, or one per prompt (None: the base model); loaded on
        first use (`enable_lora=True`)."""
        # Token ids are a sequence too: the isinstance checks tell one prompt from several, which mypy cannot.
        batch: Sequence[PromptType]
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            batch = [cast(PromptType, prompts)]
        else:
            batch = cast("Sequence[PromptType]", prompts)
        params_list: list[SamplingParams | None] = (
            list(sampling_params) if isinstance(sampling_params, Sequence) else [sampling_params] * len(batch)
        )
        if len(params_list) != len(batch):
            raise ValueError(f"sampling_params: {len(params_list)} given for {len(batch)} prompts")
        adapters = list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * len(batch)
        if len(adapters) != len(batch):
            raise ValueError(f"lora_request: {len(adapters)} given for {len(batch)} prompts")
        ids = []
        for prompt, params, adapter in zip(batch, params_list, adapters):
            request_id = f"llm-{self._counter}"
            self._counter += 1
            # Only finished outputs are returned: the engine makes no text or output while a request runs.
            final_only = (params or SamplingParams()).replace(output_kind=RequestOutputKind.FINAL_ONLY)
            self.engine.add_request(request_id, _unwrap(prompt), final_only, adapter)
            ids.append(request_id)
        return self._run(ids, use_tqdm)

    def update_weights(self, source: str | Mapping[str, torch.Tensor]) -> None:
        """Replaces the model's weights in place, from a checkpoint directory of the same model or a state dict
        with its Hub names (an RL trainer's new policy); the prefix cache is flushed, loaded adapters stay."""
        live_weights.update_weights(self.engine, source)

    def sleep(self) -> None:
        """Frees the weights' GPU memory until `wake_up` (vLLM's name; on a CPU it does nothing)."""
        live_weights.sleep(self.engine)

    def wake_up(self) -> None:
        live_weights.wake_up(self.engine)

    def _run(self, ids: list[str], use_tqdm: bool | None) -> list[RequestOutput]:
        """Steps until every request in `ids` finished; raises GenerationFailed if any failed in the engine."""
        finished: dict[str, RequestOutput] = {}
        # disable=None is tqdm's own "only on a terminal" (vLLM's use_tqdm, when not given)
        disable = None if use_tqdm is None else not use_tqdm
        progress = tqdm(total=len(ids), desc="Processed prompts", unit="prompt", disable=disable, dynamic_ncols=True)
        with frozen_heap(), progress as bar:  # the GC scans only what the steps create (engine/gc_heap.py)
            while len(finished) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
        outputs = [finished[i] for i in ids]
        failures = {
            o.request_id: c.error or "unknown error" for o in outputs for c in o.outputs if c.finish_reason == "error"
        }
        if failures:
            raise GenerationFailed(failures, outputs)
        return outputs

    @overload
    def chat(
        self,
        messages: Conversation,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict[str, Any]] | None = None,
        use_tqdm: bool | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> RequestOutput: ...

    @overload
    def chat(
        self,
        messages: list[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict[str, Any]] | None = None,
        use_tqdm: bool | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> list[RequestOutput]: ...

    def chat(
        self,
        messages: Conversation | list[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict[str, Any]] | None = None,
        use_tqdm: bool | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> RequestOutput | list[RequestOutput]:
        """One conversation (OpenAI-shaped messages, `tool` results and assistant `tool_calls` included), or a
        list of them run concurrently (then one output per conversation, in order; one params for all or one per
        conversation), through the model's chat template as the server renders them
        (`diffuserve.text.chat_template`: text that spells a special token stays plain text), offering `tools`
        (OpenAI's function dicts; templates that do not render tools get them in a system prompt, see
        tool_format). `template_kwargs` go to the template (e.g. enable_thinking=False). Parse calls out of the
        reply with `diffuserve.text.tool_format.parse_calls`; force one with
        `structured_outputs=StructuredOutputsParams(grammar=tool_format.call_grammar(tools, False))`."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("messages: this model directory has no tokenizer")
        is_batch = bool(messages) and isinstance(messages[0], list)
        conversations = cast("list[Conversation]", messages if is_batch else [messages])
        options = {
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "template_kwargs": template_kwargs,
        }
        prompts: list[PromptType] = [
            {"prompt_token_ids": chat_token_ids(tokenizer, c, tools, **options)} for c in conversations
        ]
        outputs = self.generate(prompts, sampling_params, use_tqdm)
        return outputs if is_batch else outputs[0]


def _unwrap(prompt: PromptType) -> str | list[int]:
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return prompt["prompt"]
        raise ValueError("prompt: a dict prompt needs `prompt` or `prompt_token_ids`")
    return prompt


def _release_cuda_cache() -> None:
    """Hands the CUDA caching allocator's free blocks back to the driver, if this process used CUDA (without
    importing torch or starting CUDA to find out)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
