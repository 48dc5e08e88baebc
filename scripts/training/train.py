"""Trains a tiny SDAR-MoE-shaped model on the synthetic tasks and writes it as a checkpoint directory the engine loads.

Owns the model shape of the bundled default model, the seeded initialisation, the optimisation loop (AdamW,
warmup then cosine decay, a Switch-style load-balancing loss for the routers) and checkpoint writing. The
batches and the loss come from `diffusion_batch`; knows nothing of the engine. Deterministic for a given
config and thread count: every random draw comes from seeded generators and the number of steps is fixed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from diffuserve.eval.tasks import heldout_examples, training_stream
from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.moe.router import Router
from diffuserve.model.registry import family_for
from diffuserve.model.sdar import SDARForBlockDiffusion
from diffuserve.testing.byte_tokenizer import write_byte_tokenizer
from diffuserve.testing.random_checkpoint import save_weights

from .diffusion_batch import (
    END_OF_TEXT,
    IM_END,
    MASK,
    DiffusionBatch,
    build_batch,
    diffusion_loss,
    encode_example,
    masked_token_accuracy,
)

MODEL_SHAPE: dict[str, Any] = dict(
    hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, intermediate_size=256,
    vocab_size=272, block_length=4, max_position_embeddings=1024,
)
"""The bundled default model: a byte-level vocabulary (256 bytes, 4 specials, filler to a multiple of 16)."""
GENERATION = {"decoder": "threshold", "threshold": 0.9, "temperature": 0.0}
"""Default decoding written to generation_config.json."""


@dataclass(frozen=True)
class TrainConfig:
    shape: dict[str, Any] = field(default_factory=lambda: dict(MODEL_SHAPE))
    steps: int = 3000
    batch_size: int = 32
    num_noisy_copies: int = 3
    """Independently noised copies of each example's answer blocks per row (see diffusion_batch)."""
    lr: float = 5e-3
    warmup_steps: int = 100
    decay_fraction: float = 0.25
    """Warmup, then a constant learning rate, then cosine decay over this last fraction of the steps."""
    weight_decay: float = 0.01
    balance_coef: float = 0.01
    """Weight of the router load-balancing loss (keeps every expert in use)."""
    seed: int = 0
    log_every: int = 100


def model_config(shape: dict[str, Any]) -> dict[str, Any]:
    """The config.json of an sdar-family MoE model with this shape and the byte tokenizer's special ids."""
    return dict(
        architectures=["SDARMoeForCausalLM"], model_type="sdar_moe", rms_norm_eps=1e-6, rope_theta=10000.0,
        norm_topk_prob=True, tie_word_embeddings=False, attention_bias=False, torch_dtype="float32",
        decoder_sparse_step=1, mlp_only_layers=[], mask_token_id=MASK, eos_token_id=END_OF_TEXT, **shape,
    )


QK_NORM_GAIN = 2**0.5
"""Initial q_norm / k_norm gain. NOTE: qk-norm caps an attention logit at gain_q * gain_k * sqrt(head_dim): 5.7
with unit gains and head_dim 32, too flat to single out one key among dozens; gains of sqrt(2) give the cap of a
head_dim-128 model (11.3), as in the large models this one stands in for."""


def init_model(config: dict[str, Any], seed: int) -> tuple[ModelArgs, SDARForBlockDiffusion]:
    """GPT-2 style init: normal(0, 0.02) weights, output projections scaled down by depth, unit norms except
    the q/k norms (QK_NORM_GAIN)."""
    args = family_for(config).parse_args(config, {})
    model = SDARForBlockDiffusion(args, args.max_position_embeddings)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(QK_NORM_GAIN if name.endswith(("q_norm.weight", "k_norm.weight")) else 1.0)
                continue
            std = 0.02 / math.sqrt(2 * args.num_layers) if name.endswith(("o_proj.weight", "down_proj")) else 0.02
            param.copy_(torch.randn(param.shape, generator=generator) * std)
    return args, model


def train(cfg: TrainConfig, log: Callable[[str], None] = print) -> tuple[ModelArgs, SDARForBlockDiffusion]:
    """Runs `cfg.steps` optimiser steps from scratch; logs the running loss every `cfg.log_every` steps."""
    torch.manual_seed(cfg.seed)
    args, model = init_model(model_config(cfg.shape), cfg.seed)
    model.train()
    # Norm gains (the only 1-D parameters) are not decayed: decay would pull them, and attention sharpness, to 0.
    groups = [
        {"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": cfg.weight_decay},
        {"params": [p for p in model.parameters() if p.ndim == 1], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, cfg))
    examples = training_stream(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    router_stats = _track_routers(model)
    probe = _heldout_probe(args.block_length, cfg.seed)
    start, running = time.perf_counter(), 0.0
    for step in range(1, cfg.steps + 1):
        encoded = [encode_example(next(examples), args.block_length) for _ in range(cfg.batch_size)]
        router_stats.clear()
        loss = diffusion_loss(model, build_batch(encoded, args.block_length, generator, cfg.num_noisy_copies))
        balance = sum(_balance_loss(logits, ids) for logits, ids in router_stats) / len(router_stats)
        optimizer.zero_grad(set_to_none=True)
        (loss + cfg.balance_coef * balance).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        running += loss.item()
        if step % cfg.log_every == 0 or step == cfg.steps:
            count = (step - 1) % cfg.log_every + 1
            model.eval()
            probe_accuracy = masked_token_accuracy(model, probe)
            model.train()
            log(f"step {step}/{cfg.steps}  loss {running / count:.4f}  balance {balance.item():.3f}  "
                f"held-out masked-token acc {probe_accuracy:.3f}  lr {schedule.get_last_lr()[0]:.2e}  "
                f"{time.perf_counter() - start:.0f}s")
            running = 0.0
    return args, model.eval()


def _heldout_probe(block_length: int, seed: int) -> DiffusionBatch:
    """A fixed batch of held-out examples (10 per task) with fixed noise, to follow progress while training."""
    encoded = [encode_example(e, block_length) for e in heldout_examples(10, seed=seed + 7)]
    return build_batch(encoded, block_length, torch.Generator().manual_seed(seed + 7), num_copies=1)


def _lr_factor(step: int, cfg: TrainConfig) -> float:
    """Warmup-stable-decay: the tiny model learns its tasks abruptly, so the rate stays high until the end."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    decay_start = cfg.steps * (1 - cfg.decay_fraction)
    if step < decay_start:
        return 1.0
    progress = (step - decay_start) / max(1.0, cfg.steps - decay_start)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))


def _track_routers(model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Registers hooks that record every router's (logits, chosen expert ids) during a forward."""
    stats: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(router: Router, inputs: tuple[torch.Tensor], output: tuple[torch.Tensor, torch.Tensor]) -> None:
        stats.append((F.linear(inputs[0], router.weight), output[1]))

    for module in model.modules():
        if isinstance(module, Router):
            module.register_forward_hook(hook)
    return stats


def _balance_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Switch Transformer auxiliary loss: E * sum_e (share of assignments to e) * (mean router prob of e);
    1.0 when balanced. logits [N, E], ids [N, K]."""
    num_experts = logits.shape[-1]
    share = torch.bincount(ids.flatten(), minlength=num_experts).float() / ids.numel()
    return num_experts * (share * torch.softmax(logits, dim=-1).mean(0)).sum()


def write_checkpoint(model: SDARForBlockDiffusion, args: ModelArgs, cfg: TrainConfig, out_dir: str | Path) -> Path:
    """Writes config.json, model.safetensors, the byte tokenizer with its chat template, generation_config.json
    (the default decoding; <|im_end|> and <|endoftext|> stop) and the training config that produced it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(out, args.vocab_size)
    config = model_config(cfg.shape)
    save_weights(out, family_for(config), args, model.state_dict())
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": [IM_END, END_OF_TEXT], **GENERATION}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "training_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return out
