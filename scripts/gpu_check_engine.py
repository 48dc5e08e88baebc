"""GPU check of the engine itself (run by `scripts/gpu_check.sh --smoke`): random `sdar-moe-bench` and
`clover-moe-bench` checkpoints served through `LLM`.

    --phase tokens   greedy tokens (temperature 0, 32 tokens, 8 prompts) of each model on the device in bf16
                     against the CPU in fp32: per prompt, the tokens before the first difference and the share of
                     equal tokens; `within_tolerance` when every prompt's first token agrees and the mean share
                     is at least 0.75 (random weights give flat logits whose argmax bf16 rounding can flip, and
                     a block's later tokens then part: measured on the CPU in bf16, sdar-moe-tiny 0.98,
                     clover-moe-tiny 0.79; a broken kernel gives a share near 0)
    --phase speed    decode tokens/s on the device in bf16 at 1 / 16 / 64 concurrent requests (64 prompt, 64
                     output tokens, each model)

`--device cpu` runs the same code with bf16 on the CPU (the dry run of the script). The last line printed is the
JSON summary.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from diffuserve import LLM, SamplingParams
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

MIN_SHARE = 0.75
"""The mean share of greedy tokens equal between bf16 on the device and fp32 on the CPU."""


def _models(root: Path, tiny: bool) -> dict[str, Path]:
    sdar = make_config("sdar-moe-tiny" if tiny else "sdar-moe-bench")
    clover = make_clover_moe_config("clover-moe-tiny" if tiny else "clover-moe-bench")
    return {
        "sdar-moe-bench": write_random_checkpoint(root / "sdar", sdar, seed=0, logit_scale=3.5),
        "clover-moe-bench": write_clover_moe_checkpoint(root / "clover", clover),
    }


def _greedy(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs], time.perf_counter() - started


def _prompts(count: int, length: int, vocab: int = 300) -> list[list[int]]:
    return [[random.Random(i).randrange(10, vocab) for _ in range(length)] for i in range(count)]


def _agreement(reference: list[int], tokens: list[int]) -> tuple[int, float]:
    prefix = next((i for i, (a, b) in enumerate(zip(reference, tokens)) if a != b), len(reference))
    return prefix, sum(a == b for a, b in zip(reference, tokens)) / len(reference)


def check_tokens(model_dir: Path, device: str) -> dict[str, Any]:
    prompts = _prompts(8, 24)
    reference, _ = _greedy(LLM(str(model_dir), dtype="float32", device="cpu"), prompts, 32)
    tokens, seconds = _greedy(LLM(str(model_dir), dtype="bfloat16", device=device), prompts, 32)
    rows = [_agreement(r, t) for r, t in zip(reference, tokens)]
    return {
        "equal_prefix": [p for p, _ in rows],
        "equal_share": [round(s, 3) for _, s in rows],
        "within_tolerance": all(p >= 1 for p, _ in rows) and sum(s for _, s in rows) / len(rows) >= MIN_SHARE,
        "seconds": round(seconds, 2),
    }


def check_speed(model_dir: Path, device: str, concurrency: list[int]) -> dict[str, float]:
    llm = LLM(str(model_dir), dtype="bfloat16", device=device, max_num_seqs=max(concurrency))
    _greedy(llm, _prompts(1, 64), 32)  # warm-up (compilation on CUDA)
    speeds = {}
    for count in concurrency:
        _, seconds = _greedy(llm, _prompts(count, 64), 64)
        speeds[str(count)] = round(count * 64 / seconds, 1)
    return speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("tokens", "speed"), required=True)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for the dry run (tiny models)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64], help="--phase speed")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args()
    result: dict[str, Any] = {"phase": args.phase, "device": args.device}
    with tempfile.TemporaryDirectory(prefix="diffuserve-engine-") as tmp:
        for name, model_dir in _models(Path(tmp), args.device == "cpu").items():
            if args.phase == "tokens":
                result[name] = check_tokens(model_dir, args.device)
            else:
                result[name] = check_speed(model_dir, args.device, args.concurrency)
            print(f"{name}: {json.dumps(result[name])}", flush=True)
    line = json.dumps(result)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
