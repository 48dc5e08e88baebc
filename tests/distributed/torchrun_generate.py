"""Run by torchrun in test_torchrun: rank 0 generates and prints the tokens as JSON; other ranks serve forwards.
Arguments: the model directory, "tp" or "ep", and the engine options as JSON (tensor_parallel_size 2 added)."""

from __future__ import annotations

import json
import sys

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.config import EngineConfig
from diffuserve.engine.engine_setup import run_if_torchrun_worker

PROMPTS = [{"prompt_token_ids": [(i * 11 + j * 5) % 250 + 1 for j in range(2 + 6 * i)]} for i in range(5)]
PARAMS = SamplingParams(max_tokens=16, ignore_eos=True, threshold=0.7)


def main(model_dir: str, expert_parallel: bool, engine_options: dict) -> None:
    torch.set_num_threads(1)
    options = dict(engine_options, tensor_parallel_size=2, enable_expert_parallel=expert_parallel)
    if run_if_torchrun_worker(EngineConfig.from_kwargs(model_dir, **options)):
        return
    llm = LLM(model_dir, **options)
    outputs = llm.generate(PROMPTS, PARAMS)
    llm.engine.shutdown()
    print(json.dumps([o.outputs[0].token_ids for o in outputs]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] == "ep", json.loads(sys.argv[3]))
