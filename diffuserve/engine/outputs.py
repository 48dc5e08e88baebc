"""What the engine hands back to callers (vLLM's shapes, plus the diffusion counters). Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    """stop, length, abort or error; None while running."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the completion."""
    num_forwards: int = 0
    """NFE: denoising forwards this completion took part in (prefill chunks excluded)."""
    error: str | None = None

    @property
    def tokens_per_forward(self) -> float:
        """TPF = generated tokens / NFE."""
        return len(self.token_ids) / self.num_forwards if self.num_forwards else 0.0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    """When the first block of generated tokens was final."""
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
    new_token_counts: list[int] = field(default_factory=list)
    """Per completion, tokens that became final in the step that produced this output."""

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)

    @property
    def num_forwards(self) -> int:
        return sum(o.num_forwards for o in self.outputs)

    @property
    def tokens_per_forward(self) -> float:
        nfe = self.num_forwards
        return sum(len(o.token_ids) for o in self.outputs) / nfe if nfe else 0.0
