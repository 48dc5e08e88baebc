"""Logits of quantized weights against bf16 on tiny random models, one per family (the accuracy check
beside `diffuserve eval`): the mean KL(bf16 || quantized) per position in nats and the share of positions whose
top-1 token agrees, over random prompts through one dense forward (Clover: its causal trunk). Widths the default
int4 group of 128 divides. Prints a table and one JSON line.

    python scripts/quant_kl.py --json-out /tmp/kl.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffuserve.model.families.clover_moe.dense import DenseClover
from diffuserve.model.families.clover_moe.model import CloverMoeForBlockDiffusion
from diffuserve.model.layers.attention import DenseAttentionInputs
from diffuserve.model.loader import load_model
from diffuserve.model.quant.scheme import make_scheme
from diffuserve.model.step_inputs import StepInputs
from diffuserve.reference.clover_moe_checkpoint import make_clover_moe_config, write_clover_moe_checkpoint
from diffuserve.reference.llada2_checkpoint import write_llada2_checkpoint
from diffuserve.reference.random_checkpoint import make_config, write_random_checkpoint

WIDE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, moe_intermediate_size=256)
LOGIT_SCALE = 10.0
"""A peaky LM head, so the distributions are far from uniform and the KL means something."""


def write(root: Path, family: str) -> Path:
    if family == "sdar":
        config = make_config(
            "sdar-moe-tiny",
            **WIDE,
            intermediate_size=512,
            shared_expert_intermediate_size=256,
            first_k_dense_replace=1,
            vocab_size=1024,
        )
        return write_random_checkpoint(root / family, config, logit_scale=LOGIT_SCALE)
    if family == "llada2":
        return write_llada2_checkpoint(
            root / family, {**WIDE, "intermediate_size": 512, "vocab_size": 1024}, logit_scale=LOGIT_SCALE
        )
    config = make_clover_moe_config(
        **WIDE, shared_expert_intermediate_size=256, linear_key_head_dim=64, linear_value_head_dim=64, vocab_size=1024
    )
    return write_clover_moe_checkpoint(root / family, config, logit_scale=LOGIT_SCALE)


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(model, CloverMoeForBlockDiffusion):  # recurrent layers: read whole by the dense oracle
            dense = DenseClover(model)
            return torch.cat([model.compute_logits(dense.forward_causal(row[None])[0][0]) for row in ids])
        t, block = ids.shape[1], model.args.block_length
        positions = torch.arange(t)
        mask = (positions[:, None] // block >= positions[None, :] // block)[None, None]
        hidden = model(ids, positions.expand_as(ids), StepInputs(DenseAttentionInputs(mask)))
        return model.compute_logits(hidden.reshape(-1, hidden.shape[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-out", default=None)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    ns = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("sdar", "llada2", "clover"):
            model_dir = write(Path(tmp), family)
            ids = torch.randint(0, 300, (ns.num_prompts, ns.prompt_tokens), generator=torch.Generator().manual_seed(0))
            _, reference = load_model(model_dir, dtype="bfloat16", max_model_len=128)
            expected = torch.log_softmax(logits(reference, ids), dim=-1)
            for method in ("int8", "int4", "fp8"):
                _, model = load_model(model_dir, dtype="bfloat16", max_model_len=128, quantization=make_scheme(method))
                got = torch.log_softmax(logits(model, ids), dim=-1)
                kl = (expected.exp() * (expected - got)).sum(-1).mean().item()
                agree = (expected.argmax(-1) == got.argmax(-1)).float().mean().item()
                rows.append({"family": family, "method": method, "kl": kl, "top1_agreement": agree})
                print(f"{family:>7} {method:>5}: KL {kl:.2e} nats/position, top-1 same {100 * agree:.1f} %")
    result = {"num_prompts": ns.num_prompts, "prompt_tokens": ns.prompt_tokens, "dtype": "bfloat16", "rows": rows}
    text = json.dumps(result)
    if ns.json_out:
        Path(ns.json_out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
