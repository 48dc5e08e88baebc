"""bench/engine_run.ForwardProbe: the model's time is its forward plus the model methods the engine calls outside
it (the logits, and a renoise model's self-conditioning input), so a bench's "engine overhead" never counts the
model's own math; the methods are the class's again once the probe is closed."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from diffuserve.bench.engine_run import ForwardProbe

PAUSE = 0.02
ENGINE_PAUSE = 0.3


class SlowModel(torch.nn.Module):
    def forward(self, input_ids, positions, metadata):
        time.sleep(PAUSE)
        return input_ids

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        time.sleep(PAUSE)
        return hidden

    def self_conditioning_input(self, logits: torch.Tensor) -> torch.Tensor:
        time.sleep(PAUSE)
        return logits


def test_logits_and_self_conditioning_count_as_the_models_time():
    model = SlowModel()
    with ForwardProbe(model, torch.device("cpu")) as probe:
        model(torch.zeros(5), None, SimpleNamespace(attention=None))
        model.compute_logits(torch.zeros(3, 2))
        model.self_conditioning_input(torch.zeros(3, 4))
        time.sleep(ENGINE_PAUSE)  # the engine's own time: not the model's
    assert probe.num_tokens == 5 and probe.num_logit_rows == 3
    assert 3 * PAUSE <= probe.model_s < 3 * PAUSE + ENGINE_PAUSE / 2
    assert "compute_logits" not in vars(model) and "self_conditioning_input" not in vars(model)
