"""Trains a draft adapter for the bundled model (scripts/training/draft_lora.py): LoRA weights that act only where
verified decoding drafts, taught the base model's own greedy replies to draft blocks of `--block-length` (8: twice
the model's own, which its drafts were not trained for), then scores verified decoding on the held-out tasks at the
model's block length, and at the adapter's without and with it (the replies must be identical; what changes is the
tokens per forward).

    python scripts/train_draft_adapter.py                      # writes diffuserve/assets/default-draft-adapter
    python scripts/train_draft_adapter.py --out /tmp/draft     # anywhere else

Deterministic for a given seed and thread count (fixed prompts, init and number of epochs). Prints progress, the
held-out table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from itertools import islice
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as scripts/train_tiny_model.py: shared cores stall spinning

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "diffuserve" / "assets" / "default-draft-adapter"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="base model directory (default: the bundled model)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="adapter directory to write")
    parser.add_argument("--examples", type=int, default=1000, help="training prompts (the base model answers them)")
    parser.add_argument("--epochs", type=int, default=6, help="passes over the training prompts")
    parser.add_argument("--batch", type=int, default=8, help="conversations per optimiser step")
    parser.add_argument(
        "--block-length",
        type=int,
        default=8,
        help="the block length the adapter drafts (serve with the same --block-length; the model's is 4)",
    )
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank r")
    parser.add_argument("--alpha", type=float, default=32.0, help="LoRA alpha (the delta is scaled by alpha / r)")
    parser.add_argument("--lr", type=float, default=5e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=7, help="seed of the prompts, the init and the order")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--eval-per-task", type=int, default=100, help="held-out examples per task to score")
    return parser.parse_args(argv)


def base_replies(model_dir: str, num: int, seed: int) -> list[tuple[list[int], int]]:
    """(prompt + the base model's greedy reply, the reply's start) for `num` training prompts (never held out)."""
    from diffuserve import LLM, SamplingParams
    from diffuserve.eval.harness import MAX_TOKENS
    from diffuserve.eval.tasks import training_stream

    examples = list(islice(training_stream(seed), num))
    conversations = [[{"role": "user", "content": e.prompt}] for e in examples]
    outputs = LLM(model_dir).chat(conversations, SamplingParams(decoder="verified", max_tokens=MAX_TOKENS))
    return [
        (list(o.prompt_token_ids) + list(o.outputs[0].token_ids), len(o.prompt_token_ids))
        for o in outputs
        if o.prompt_token_ids is not None
    ]


def train(model_dir: str, data: list[tuple[list[int], int]], args: argparse.Namespace):
    """-> the trained DraftLoRA, the model it is attached to (logging each epoch's loss and draft accuracy)."""
    import torch

    from diffuserve.model.loader import load_model
    from scripts.training.draft_lora import DraftLoRA, anchored_loss

    model_args, model = load_model(model_dir, dtype="float32")
    model.requires_grad_(False)
    lora = DraftLoRA(model, args.rank, args.alpha, args.seed)
    optimiser = torch.optim.AdamW(lora.parameters(), lr=args.lr, weight_decay=0.0)
    order = random.Random(args.seed)
    for epoch in range(args.epochs):
        batch_order = list(range(len(data)))
        order.shuffle(batch_order)
        total = count = right = 0
        for start in range(0, len(batch_order), args.batch):
            optimiser.zero_grad()
            losses, scored = [], 0
            for index in batch_order[start : start + args.batch]:
                loss, n, hits = anchored_loss(model, lora, *data[index], model_args.mask_token_id, args.block_length)
                losses.append(loss)
                scored, right = scored + n, right + hits
            (torch.stack(losses).sum() / max(scored, 1)).backward()
            optimiser.step()
            total, count = total + float(torch.stack(losses).sum().detach()), count + scored
        print(f"epoch {epoch + 1}: loss {total / count:.4f}, draft accuracy {right / count:.3f}", flush=True)
    return lora, model_args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from diffuserve import LLM, SamplingParams
    from diffuserve.eval.harness import evaluate, format_table
    from diffuserve.eval.tasks import heldout_examples
    from diffuserve.model.hub import resolve_model

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    started = time.perf_counter()
    data = base_replies(model_dir, args.examples, args.seed)
    lora, _ = train(model_dir, data, args)
    lora.save(args.out, Path(model_dir).name)
    seconds = time.perf_counter() - started
    print(f"wrote {args.out} after {seconds:.0f}s (replies and training)")
    examples = heldout_examples(args.eval_per_task)
    verified, block = SamplingParams(decoder="verified"), args.block_length
    default = evaluate(LLM(model_dir), examples, verified, "verified, the model's block length")
    without = evaluate(LLM(model_dir, block_length=block), examples, verified, f"verified, block {block}")
    adapted = LLM(model_dir, block_length=block, draft_adapter=str(args.out))
    with_adapter = evaluate(adapted, examples, verified, f"verified, block {block}, draft adapter")
    print(format_table([default, without, with_adapter]))
    summary = {
        "model": Path(model_dir).name,
        "block_length": block,
        "rank": args.rank,
        "examples": len(data),
        "epochs": args.epochs,
        "seed": args.seed,
        "threads": args.threads,
        "seconds": round(seconds, 1),
        "replies_identical": default.replies == without.replies == with_adapter.replies,
        "default": default.summary(),
        "without": without.summary(),
        "with": with_adapter.summary(),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
