"""Verified decoding's counters (decoder=verified), under vLLM's speculative-decoding names: drafts (blocks whose
draft a commit forward verified), draft tokens (positions checked), accepted tokens (positions kept), and the
block steps thrown away because they were fused with a rejected draft; and decoder=auto's steps with and without
drafts. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, replace

from diffuserve.core.step import StepUpdate


@dataclass(frozen=True)
class SpecDecodeStats:
    num_drafts: int = 0
    """Drafted blocks verified (vLLM: spec_decode_num_drafts)."""
    num_draft_tokens: int = 0
    """Drafted positions checked against the causal path (vLLM: spec_decode_num_draft_tokens)."""
    num_accepted_tokens: int = 0
    """Of those, the ones kept (vLLM: spec_decode_num_accepted_tokens)."""
    num_discarded_steps: int = 0
    """Next-block steps fused with a rejected draft and thrown away."""
    num_auto_drafting_steps: int = 0
    """decoder=auto: steps in which its requests drafted (core/draft_switch.py) ..."""
    num_auto_autoregressive_steps: int = 0
    """... and steps in which they decided only their next token."""

    def add(self, update: StepUpdate) -> SpecDecodeStats:
        """These counters plus one step's."""
        return replace(
            self,
            num_drafts=self.num_drafts + update.num_verified_blocks,
            num_draft_tokens=self.num_draft_tokens + update.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + update.num_accepted_tokens,
            num_discarded_steps=self.num_discarded_steps + update.num_discarded_steps,
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Accepted tokens per verified block, plus the one the causal path writes at a rejection (vLLM's
        mean acceptance length counts its bonus token the same way); 0 before any draft."""
        if not self.num_drafts:
            return 0.0
        return (self.num_accepted_tokens + self.num_drafts) / self.num_drafts
