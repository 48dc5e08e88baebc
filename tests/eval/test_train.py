"""A few training steps on a tiny config lower the diffusion loss (and the next-token loss where trained), and the
written checkpoint serves in the engine with the same weights: the default family (clover_moe) and the
SDAR-MoE-shaped one bundled before it."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.eval.tasks import training_stream
from diffuserve.model.loader import load_model
from scripts.training.diffusion_batch import encode_conversation, encode_example
from scripts.training.train import FAMILIES, TrainConfig, train, write_checkpoint
from tests.eval.test_diffusion_batch import TINY
from tests.eval.test_hybrid_forward import TINY_HYBRID

SHAPES = {"clover_moe": TINY_HYBRID, "sdar": TINY}


def _fixed_batch_losses(family: str, model: torch.nn.Module) -> dict[str, float]:
    examples = list(itertools.islice(training_stream(99), 32))
    encoded = [encode_example(e, 4) for e in examples[:16]]
    encoded += [encode_conversation(examples[i : i + 2], 4) for i in range(16, 32, 2)]
    batch = FAMILIES[family].build_batch(encoded, 4, torch.Generator().manual_seed(0), 1)
    with torch.no_grad():
        return {name: term.item() for name, term in FAMILIES[family].loss(model, batch).items()}


@pytest.mark.parametrize("family", ["clover_moe", "sdar"])
def test_training_lowers_the_loss_and_writes_a_servable_checkpoint(tmp_path, family):
    shape = SHAPES[family]
    cfg = TrainConfig(family=family, shape=shape, steps=25, batch_size=16, lr=1e-2, warmup_steps=5, log_every=5)
    _, untrained = FAMILIES[family].init(FAMILIES[family].config(shape), cfg.seed)
    lines: list[str] = []
    args, model = train(cfg, log=lines.append)
    assert len(lines) == 5 and lines[-1].startswith("step 25/25")
    before, after = _fixed_batch_losses(family, untrained), _fixed_batch_losses(family, model)
    # Every term the family trains falls: the diffusion loss, and the clover_moe's next-token loss.
    assert set(before) == ({"diffusion", "next_token"} if family == "clover_moe" else {"diffusion"})
    for name in before:
        assert after[name] < 0.7 * before[name], (name, before, after)

    out = write_checkpoint(model, args, cfg, tmp_path / "model")
    _, loaded = load_model(out)
    assert type(loaded) is type(model)
    for (name, trained), served in zip(model.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(served, trained, msg=name)
    # Continued training starts from the checkpoint's weights (at learning rate 0 it keeps them).
    _, resumed = train(replace(cfg, steps=1, lr=0.0, init_from=str(out)), log=lines.append)
    for (name, trained), kept in zip(model.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(kept, trained, msg=name)
    output = LLM(str(out)).chat([{"role": "user", "content": "Copy abc"}], SamplingParams(max_tokens=8))
    assert 1 <= len(output.outputs[0].token_ids) <= 8


def test_an_unknown_family_is_a_one_line_error():
    with pytest.raises(ValueError, match="family: 'llama' is unknown; available: clover_moe, sdar"):
        TrainConfig(family="llama")
