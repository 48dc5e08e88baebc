"""Trains a tiny block-diffusion MoE on the synthetic tasks and writes it as a checkpoint directory the engine
loads: by default the bundled model, a `clover_moe` (the published Clover layout); `family="sdar"` trains the
SDAR-MoE-shaped model that was bundled before it.

Owns the family table (shape, config, init, batches and loss of each trainable family), the optimisation loop
(AdamW, warmup then cosine decay, a Switch-style load-balancing loss for the routers) and checkpoint writing.
Knows nothing of the engine. Deterministic for a given config and thread count: every random draw comes from
seeded generators and the number of steps is fixed.
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
from torch import nn

from diffuserve.eval.tasks import TRAIN_WEIGHTS, heldout_examples, training_batches
from diffuserve.model.config import ModelArgs
from diffuserve.model.layers.moe.layer import Router
from diffuserve.model.loader import load_model
from diffuserve.model.registry import family_for
from diffuserve.reference.byte_tokenizer import write_byte_tokenizer
from diffuserve.reference.random_checkpoint import save_weights

from .clover_moe_model import CLOVER_MOE_MIX, CLOVER_MOE_SHAPE, CLOVER_MOE_TURNS, clover_moe_config, init_clover_moe
from .diffusion_batch import (
    END_OF_TEXT,
    IM_END,
    build_batch,
    diffusion_loss,
    encode_conversation,
    encode_example,
    masked_token_accuracy,
)
from .hybrid_batch import build_hybrid_batch
from .hybrid_forward import hybrid_losses, hybrid_token_accuracy
from .sdar_model import SDAR_SHAPE, init_sdar, sdar_config

GENERATION = {"decoder": "threshold", "threshold": 0.9, "temperature": 0.0}
"""Default decoding written to generation_config.json."""


@dataclass(frozen=True)
class TrainingFamily:
    """What the loop needs to know of a model family: its shape, config.json, init, batches and loss."""

    shape: dict[str, Any]
    config: Callable[[dict[str, Any]], dict[str, Any]]
    init: Callable[[dict[str, Any], int], tuple[ModelArgs, nn.Module]]
    build_batch: Callable[..., Any]
    """(encoded examples, block length, generator, num_copies) -> a batch for `loss` and `accuracy`."""
    loss: Callable[[nn.Module, Any], dict[str, torch.Tensor]]
    """-> the loss terms: "diffusion" (masked positions of the noisy blocks), and "next_token" (the clean
    stream's reply tokens, read causally) where the family trains it."""
    accuracy: Callable[[nn.Module, Any], dict[str, float]]
    """-> the argmax accuracy of each loss term's predictions (a progress probe)."""
    mix: dict[str, float]
    """Training mix: task -> weight (eval.tasks.training_stream)."""
    turns: dict[int, float]
    """Conversation lengths: number of user / assistant turns -> weight (eval.tasks.training_batches)."""


FAMILIES: dict[str, TrainingFamily] = {
    # Hybrid: causal trunk over the clean conversation, noisy blocks previewed against its state (hybrid_forward).
    "clover_moe": TrainingFamily(
        CLOVER_MOE_SHAPE,
        clover_moe_config,
        init_clover_moe,
        build_hybrid_batch,
        hybrid_losses,
        hybrid_token_accuracy,
        CLOVER_MOE_MIX,
        CLOVER_MOE_TURNS,
    ),
    # Block-causal attention everywhere: one two-stream row per example (diffusion_batch).
    "sdar": TrainingFamily(
        SDAR_SHAPE,
        sdar_config,
        init_sdar,
        build_batch,
        lambda model, batch: {"diffusion": diffusion_loss(model, batch)},
        lambda model, batch: {"diffusion": masked_token_accuracy(model, batch)},
        TRAIN_WEIGHTS,
        {1: 1.0},
    ),
}


@dataclass(frozen=True)
class TrainConfig:
    family: str = "clover_moe"
    shape: dict[str, Any] = field(default_factory=lambda: dict(CLOVER_MOE_SHAPE))
    """The family's shape (FAMILIES[family].shape unless a test or an experiment shrinks it)."""
    mix: dict[str, float] = field(default_factory=dict)
    """Training mix, task -> weight; empty: the family's (FAMILIES[family].mix)."""
    turns: dict[int, float] = field(default_factory=dict)
    """Conversation lengths, turns -> weight; empty: the family's (FAMILIES[family].turns)."""
    steps: int = 3200
    batch_size: int = 32
    num_noisy_copies: int = 3
    """Independently noised copies of each example's answer blocks per row (see diffusion_batch), per turn: a
    batch of n-turn conversations has 1/n of the rows and noises each last answer n times as often, so every
    batch trains about as many noisy blocks as a one-turn batch."""
    next_token_weight: float = 1.0
    """Weight of the next-token loss beside the diffusion loss (families that train it). Both are per-token
    means of the same kind of cross-entropy, and both readings have one right answer on these tasks (the
    verified decoder keeps a draft only where they agree), so neither is favoured."""
    lr: float = 5e-3
    warmup_steps: int = 100
    decay_fraction: float = 0.25
    """Warmup, then a constant learning rate, then cosine decay over this last fraction of the steps."""
    weight_decay: float = 0.01
    balance_coef: float = 0.01
    """Weight of the router load-balancing loss (keeps every expert in use)."""
    seed: int = 0
    log_every: int = 100
    init_from: str | None = None
    """A checkpoint directory of the same family and shape to start from (its weights replace the seeded
    init; the optimiser starts afresh); None: from scratch."""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: {self.family!r} is unknown; available: {', '.join(FAMILIES)}")
        if not self.mix:
            object.__setattr__(self, "mix", dict(FAMILIES[self.family].mix))  # recorded in training_config.json
        if not self.turns:
            object.__setattr__(self, "turns", dict(FAMILIES[self.family].turns))


def train(cfg: TrainConfig, log: Callable[[str], None] = print) -> tuple[ModelArgs, nn.Module]:
    """Runs `cfg.steps` optimiser steps from scratch; logs the running loss every `cfg.log_every` steps."""
    torch.manual_seed(cfg.seed)
    family = FAMILIES[cfg.family]
    args, model = family.init(family.config(cfg.shape), cfg.seed)
    if cfg.init_from:
        model.load_state_dict(load_model(cfg.init_from)[1].state_dict())
    model.train()
    # 1-D parameters (norm gains; GDN decay rates and preview scalars) are not decayed: decay would pull them, and
    # attention sharpness, to 0.
    groups = [
        {"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": cfg.weight_decay},
        {"params": [p for p in model.parameters() if p.ndim == 1], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: _lr_factor(step, cfg))
    batches = training_batches(cfg.seed, cfg.batch_size, cfg.mix, cfg.turns)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    router_stats = _track_routers(model)
    probe = _heldout_probe(family, args.block_length, cfg.seed)
    start = time.perf_counter()
    running: dict[str, float] = {}
    for step in range(1, cfg.steps + 1):
        conversations = next(batches)
        encoded = [encode_conversation(turns, args.block_length) for turns in conversations]
        copies = cfg.num_noisy_copies * len(conversations[0])
        router_stats.clear()
        terms = family.loss(model, family.build_batch(encoded, args.block_length, generator, copies))
        loss = terms["diffusion"] + cfg.next_token_weight * terms.get("next_token", 0.0)
        balance = sum(_balance_loss(logits, ids) for logits, ids in router_stats) / len(router_stats)
        optimizer.zero_grad(set_to_none=True)
        (loss + cfg.balance_coef * balance).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        for name, term in terms.items():
            running[name] = running.get(name, 0.0) + term.item()
        if step % cfg.log_every == 0 or step == cfg.steps:
            line = _progress(model, family, probe, step, cfg, running, balance.item(), schedule.get_last_lr()[0])
            log(f"{line}  {time.perf_counter() - start:.0f}s")
            running = {}
    return args, model.eval()


def _progress(
    model: nn.Module,
    family: TrainingFamily,
    probe: Any,
    step: int,
    cfg: TrainConfig,
    running: dict[str, float],
    balance: float,
    lr: float,
) -> str:
    """The progress line: running mean of each loss term, held-out accuracy of each reading, learning rate."""
    count = (step - 1) % cfg.log_every + 1
    model.eval()
    accuracy = family.accuracy(model, probe)
    model.train()
    losses = "  ".join(f"{name} loss {total / count:.4f}" for name, total in running.items())
    probes = "  ".join(f"{name} {value:.3f}" for name, value in accuracy.items())
    return f"step {step}/{cfg.steps}  {losses}  balance {balance:.3f}  held-out token acc: {probes}  lr {lr:.2e}"


def _heldout_probe(family: TrainingFamily, block_length: int, seed: int) -> Any:
    """A fixed batch of held-out examples (10 per task), and of two-turn conversations of them (pairs of
    different tasks), with fixed noise, to follow progress while training."""
    examples = heldout_examples(10, seed=seed + 7)
    encoded = [encode_example(e, block_length) for e in examples]
    pairs = zip(examples[: len(examples) // 2], reversed(examples))
    encoded += [encode_conversation(pair, block_length) for pair in pairs]
    return family.build_batch(encoded, block_length, torch.Generator().manual_seed(seed + 7), 1)


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


def write_checkpoint(model: nn.Module, args: ModelArgs, cfg: TrainConfig, out_dir: str | Path) -> Path:
    """Writes config.json, model.safetensors, the byte tokenizer with its chat template, generation_config.json
    (the default decoding; <|im_end|> and <|endoftext|> stop) and the training config that produced it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_byte_tokenizer(out, args.vocab_size)
    config = FAMILIES[cfg.family].config(cfg.shape)
    save_weights(out, family_for(config), args, model.state_dict())
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"eos_token_id": [IM_END, END_OF_TEXT], **GENERATION}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "training_config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    return out
