"""The most tokens per forward any exact reading of the bundled model can reach on its held-out tasks: a request's
first forward decides one token (from its prompt's causal row) and each later forward at most a block (its draft's
B - 1 drafts and the next block's head), so a reply of L tokens takes at least 1 + ceil((L - 1) / B) forwards. The
replies are the autoregressive reading's (block length 1), which every exact reading reproduces; prints a table
and a final JSON line (`diffuserve eval`'s examples: --num-per-task, --seed).

    python scripts/verified_bound.py --num-per-task 100 --blocks 4 8
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffuserve import LLM, SamplingParams
from diffuserve.eval.harness import MAX_TOKENS
from diffuserve.eval.tasks import heldout_examples
from diffuserve.model.default_model import DEFAULT_MODEL_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-per-task", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    examples = heldout_examples(args.num_per_task, args.seed)
    llm = LLM(str(DEFAULT_MODEL_DIR), block_length=1)
    conversations = [[{"role": "user", "content": e.prompt}] for e in examples]
    lengths = [len(o.outputs[0].token_ids) for o in llm.chat(conversations, SamplingParams(max_tokens=MAX_TOKENS))]
    bounds = {}
    tokens = sum(lengths)
    for block in args.blocks:
        forwards = sum(1 + math.ceil((length - 1) / block) for length in lengths)
        bounds[str(block)] = {"tokens": tokens, "min_forwards": forwards, "max_tpf": tokens / forwards}
        print(f"block {block}: {tokens} tokens in at least {forwards} forwards: TPF <= {tokens / forwards:.3f}")
    histogram = dict(sorted(Counter(lengths).items()))
    print(json.dumps({"num_examples": len(lengths), "reply_lengths": histogram, "bounds": bounds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
