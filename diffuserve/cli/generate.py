"""`diffuserve generate`: complete prompts offline (no server) and print the answers with NFE and TPF.

A model with a chat template gets each prompt as a user turn of it (as `--chat`) unless the prompt already holds
one of the tokenizer's special tokens (it is templated by hand) or `--no-chat` is given: a chat-tuned model fed
the bare text often answers nothing (the bundled model knows only its chat format)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from diffuserve.config import EngineConfig, add_config_arguments, engine_config_from_args
from diffuserve.model.hub import add_hub_arguments, resolve_model
from diffuserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from diffuserve.llm import LLM
    from diffuserve.text.tokenizer import Tokenizer

SAMPLING_SKIP = ("n", "seed")  # one completion each; seeding is the engine's --seed


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """--model plus every engine option (shared by generate and chat)."""
    parser.add_argument(
        "--model", default=None, help="model directory or Hugging Face Hub id (default: the bundled model)"
    )
    add_hub_arguments(parser)
    add_config_arguments(parser, EngineConfig, skip=("model",))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompts", nargs="+", metavar="PROMPT", help="prompt text ('-' reads one from stdin)")
    parser.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap each prompt as a user turn of the chat template (default: when the model has one and the "
        "prompt holds none of its special tokens); --no-chat sends the text as it is",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    add_model_arguments(parser)
    add_config_arguments(parser, SamplingParams, skip=SAMPLING_SKIP)


def sampling_params_from_args(args: argparse.Namespace) -> SamplingParams:
    names = {f for f in SamplingParams.__dataclass_fields__ if f not in SAMPLING_SKIP}
    return SamplingParams(**{k: v for k, v in vars(args).items() if k in names})


def build_llm(args: argparse.Namespace) -> LLM:
    from diffuserve.llm import LLM

    config = engine_config_from_args(resolve_model(args.model, args.revision, args.download_dir), args)
    return LLM(config.model, **config.to_kwargs())


def run(args: argparse.Namespace) -> int:
    params = sampling_params_from_args(args)
    prompts = [sys.stdin.read() if p == "-" else p for p in args.prompts]
    llm = build_llm(args)
    tokenizer = llm.engine.tokenizer
    chat = args.chat if args.chat is not None else tokenizer is not None and _untemplated(tokenizer, prompts)
    if chat:
        if tokenizer is None:
            raise ValueError("--chat: this model directory has no tokenizer")
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
    else:
        outputs = llm.generate(prompts, params)
    for prompt, out in zip(prompts, outputs):
        completion = out.outputs[0]
        if args.json:
            print(
                json.dumps(
                    {
                        "prompt": prompt,
                        "text": completion.text,
                        "token_ids": completion.token_ids,
                        "finish_reason": completion.finish_reason,
                        "num_forwards": completion.num_forwards,
                        "tokens_per_forward": round(completion.tokens_per_forward, 3),
                    }
                )
            )
        else:
            print(completion.text)
            print(
                f"[{len(completion.token_ids)} tokens, NFE {completion.num_forwards}, "
                f"TPF {completion.tokens_per_forward:.2f}, finish: {completion.finish_reason}]",
                file=sys.stderr,
            )
    return 0


def _untemplated(tokenizer: Tokenizer, prompts: list[str]) -> bool:
    """The model has a chat template and no prompt spells one of its special tokens (a hand-templated prompt)."""
    if not tokenizer.has_chat_template:
        return False
    specials = {tokenizer.decode([i], skip_special_tokens=False) for i in tokenizer.special_ids}
    return not any(s and s in p for s in specials for p in prompts)
