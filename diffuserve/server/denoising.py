"""The denoising stream extension (`stream_options.include_denoising`): per denoising step, which output positions
it decided and their tokens, sent as chunks of their own (no choices) before the text they lead to; under
decoder=verified also each causal check of a drafted block (`check`: the drafts kept, those rejected, where the
causal token went).

The engine's outputs carry each completion's whole trace so far (`CompletionOutput.denoising_steps`, cumulative,
so a slow reader that only sees the latest output loses nothing); `DenoisingTrace` remembers, per choice, how many
steps were sent and turns the rest into wire entries, naming each token by its text. Knows nothing of HTTP or of
how the engine decides positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diffuserve.core.outputs import DenoisingStep, DraftCheck
from diffuserve.engine.detokenizer import TokenTexts
from diffuserve.engine.output_processor import RequestOutput
from diffuserve.server.response_models import DenoisingStepOut, DraftCheckOut


@dataclass
class DenoisingTrace:
    """Turns the cumulative traces of one response's completions into the steps not sent yet."""

    texts: TokenTexts
    choice_index: Callable[[str, int], int]
    chunk_fields: dict[str, Any]
    """What a denoising chunk shares with the response's other chunks (id, created, model, no choices)."""
    sent: dict[int, int] = field(default_factory=dict)
    """Per choice, the steps already sent."""

    def take(self, output: RequestOutput) -> list[DenoisingStepOut]:
        """The steps of `output`'s completions that were not sent yet (then marked sent), in choice order."""
        steps = []
        for completion in output.outputs:
            index = self.choice_index(output.request_id, completion.index)
            trace = completion.denoising_steps or []
            steps += [self._entry(index, step) for step in trace[self.sent.get(index, 0) :]]
            self.sent[index] = len(trace)
        return steps

    def _entry(self, index: int, step: DenoisingStep) -> DenoisingStepOut:
        token_ids = [token for _, token in step.writes]
        return DenoisingStepOut(
            index=index,
            block=step.block,
            step=step.step,
            block_start=step.start,
            block_end=step.end,
            positions=[position for position, _ in step.writes],
            token_ids=token_ids,
            tokens=self._texts(token_ids),
            check=None if step.check is None else self._check(step.check),
        )

    def _check(self, check: DraftCheck) -> DraftCheckOut:
        rejected_ids = [token for _, token in check.rejected]
        return DraftCheckOut(
            accepted_positions=[position for position, _ in check.accepted],
            rejected_positions=[position for position, _ in check.rejected],
            rejected_token_ids=rejected_ids,
            rejected_tokens=self._texts(rejected_ids),
            causal_position=None if check.causal is None else check.causal[0],
        )

    def _texts(self, token_ids: list[int]) -> list[str] | None:
        """Each token's text; None when one has none (no tokenizer)."""
        texts = [self.texts(token) for token in token_ids]
        return None if any(text is None for text in texts) else [text or "" for text in texts]
