"""A few training steps on a tiny config lower the diffusion loss, and the written checkpoint serves in the engine
with the same weights."""

from __future__ import annotations

import itertools

import torch

from diffuserve import LLM, SamplingParams
from diffuserve.eval.tasks import training_stream
from diffuserve.model.loader import load_model
from scripts.training.diffusion_batch import build_batch, diffusion_loss, encode_example
from scripts.training.train import TrainConfig, init_model, model_config, train, write_checkpoint
from tests.eval.test_diffusion_batch import TINY


def _fixed_batch_loss(model: torch.nn.Module) -> float:
    examples = itertools.islice(training_stream(99), 32)
    batch = build_batch([encode_example(e, 4) for e in examples], 4, torch.Generator().manual_seed(0))
    with torch.no_grad():
        return diffusion_loss(model, batch).item()


def test_training_lowers_the_loss_and_writes_a_servable_checkpoint(tmp_path):
    cfg = TrainConfig(shape=TINY, steps=25, batch_size=16, lr=1e-2, warmup_steps=5, log_every=5)
    _, untrained = init_model(model_config(TINY), cfg.seed)
    lines: list[str] = []
    args, model = train(cfg, log=lines.append)
    assert len(lines) == 5 and lines[-1].startswith("step 25/25")
    before, after = _fixed_batch_loss(untrained), _fixed_batch_loss(model)
    assert after < 0.7 * before, (before, after)

    out = write_checkpoint(model, args, cfg, tmp_path / "model")
    _, loaded = load_model(out)
    for (name, trained), served in zip(model.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(served, trained, msg=name)
    output = LLM(str(out)).chat([{"role": "user", "content": "Copy abc"}], SamplingParams(max_tokens=8))
    assert 1 <= len(output.outputs[0].token_ids) <= 8
