"""The cost of grammar-constrained decoding on the bundled model: accuracy and tokens per forward (TPF) of the
same held-out prompts decoded free, under a regex of each task's answer format, and (addition) under the JSON
schemas {"type": "integer"} (its own answer format) and {"answer": integer}: on the addition prompts, and on the
prompts that ask for JSON (`27+15 in JSON`, the `add_json` task the model is trained on). Prints one JSON line per
configuration, then a final line with all of them (docs/results/structured-tpf.json).

The cost of the left-to-right acceptance rule alone: a grammar that allows every text, on tiny random
checkpoints at block lengths 4 and 32 (the bundled model's blocks are 4 long), 64 tokens per prompt.

    python scripts/structured_tpf.py [--per-task 20] [--model DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from diffuserve import LLM, SamplingParams
from diffuserve.eval.tasks import TASKS, Example, heldout_examples, is_correct
from diffuserve.model.default_model import DEFAULT_MODEL_DIR
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint
from diffuserve.structured_outputs import StructuredOutputsParams

ANSWER_REGEX = {
    "add": r"[0-9]{2,3}",
    "reverse": r"[a-z]+",
    "sort": r"[0-9]( [0-9])*",
    "copy": r"[a-z]+",
    "max": r"[0-9]",
    "lookup": r"[a-z]",
}
"""Each task's answer format."""
INTEGER_SCHEMA = {"type": "integer", "minimum": 0, "maximum": 198}
"""Addition's answer as a JSON schema in the model's own answer format (a bare number)."""
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def run(llm: LLM, examples: list[Example], specs: list[StructuredOutputsParams | None], unwrap: bool) -> dict:
    conversations = [[{"role": "user", "content": e.prompt}] for e in examples]
    outs = llm.chat(conversations, [SamplingParams(max_tokens=32, structured_outputs=s) for s in specs])
    texts = [o.outputs[0].text for o in outs]
    replies = [_answer(t) for t in texts] if unwrap else texts
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    forwards = sum(o.outputs[0].num_forwards for o in outs)
    return {
        "prompts": len(examples),
        "correct": sum(is_correct(e, r) for e, r in zip(examples, replies)),
        "tokens": tokens,
        "forwards": forwards,
        "tpf": round(tokens / forwards, 3),
    }


def rule_cost(root: Path, block: int) -> dict:
    """TPF free and under a grammar that allows any text, on a tiny random checkpoint."""
    config = make_config(
        "sdar-moe-tiny", block_length=block, first_k_dense_replace=1, shared_expert_intermediate_size=48
    )
    llm = LLM(str(write_random_checkpoint(root / f"b{block}", config, seed=0, logit_scale=40.0)), num_pages=1024)
    prompts = [{"prompt_token_ids": [(i * 37 + j * 11) % 250 + 1 for j in range(3 + (i * 13) % 9)]} for i in range(16)]
    results = {}
    for name, spec in (
        (f"random b{block}, free", None),
        (f"random b{block}, any text", StructuredOutputsParams(regex=r"[\s\S]*")),
    ):
        params = SamplingParams(max_tokens=64, ignore_eos=True, threshold=0.9, structured_outputs=spec)
        outs = llm.generate(prompts, [params] * len(prompts))
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        forwards = sum(o.outputs[0].num_forwards for o in outs)
        results[name] = {
            "prompts": len(prompts),
            "correct": None,
            "tokens": tokens,
            "forwards": forwards,
            "tpf": round(tokens / forwards, 3),
        }
    return results


def _answer(text: str) -> str:
    try:
        return str(json.loads(text)["answer"])
    except (ValueError, KeyError, TypeError):
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-task", type=int, default=20)
    parser.add_argument("--model", default=str(DEFAULT_MODEL_DIR), help="checkpoint directory (default: bundled)")
    args = parser.parse_args()
    llm = LLM(args.model)
    examples = heldout_examples(args.per_task, tasks=list(TASKS))
    adds = [e for e in examples if e.task == "add"]
    json_adds = heldout_examples(args.per_task, tasks=["add_json"])
    results = {
        "all tasks, free": run(llm, examples, [None] * len(examples), False),
        "all tasks, answer regex": run(
            llm, examples, [StructuredOutputsParams(regex=ANSWER_REGEX[e.task]) for e in examples], False
        ),
        "add, free": run(llm, adds, [None] * len(adds), False),
        "add, json integer": run(llm, adds, [StructuredOutputsParams(json=INTEGER_SCHEMA)] * len(adds), False),
        "add, json {answer: integer}": run(llm, adds, [StructuredOutputsParams(json=ANSWER_SCHEMA)] * len(adds), True),
        "add in JSON, free": run(llm, json_adds, [None] * len(json_adds), False),
        "add in JSON, json {answer: integer}": run(
            llm, json_adds, [StructuredOutputsParams(json=ANSWER_SCHEMA)] * len(json_adds), False
        ),
    }
    with tempfile.TemporaryDirectory() as root:
        for block in (4, 32):
            results.update(rule_cost(Path(root), block))
    for name, result in results.items():
        print(json.dumps({"config": name, **result}))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
