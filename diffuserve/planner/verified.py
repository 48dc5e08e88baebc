"""Verified decoding (decoder=verified) in a plan: its tokens per forward and the memory its rollback needs.

Tokens per forward. A verified request drafts a whole block in one forward, whose first position (the head) is
read from a causal row and so decided at once; the forward that commits the draft checks the rest against the
causal path and drafts the next block beside it. Its TPF is its output tokens per forward. In order of
precedence it is given (`--verified-tpf`), derived from a per-draft acceptance rate (`--acceptance-rate`, the
formula below), or the value measured on the bundled model (MEASURED_VERIFIED_TPF, its source stated).

    the formula   a checking forward, each of the S - 1 drafts after the head kept with probability a
                  (independently), p = a^(S - 1):
                      all kept (p)                the S - 1 drafts and the next block's head: S tokens
                      k kept, then rejected       k drafts and the causal token: k + 1 tokens, and the next
                                                  forward commits them again and decides one head
                  TPF = (p S + sum_{k<S-1} a^k (1 - a) (k + 1) + (1 - p)) / (1 + (1 - p))
                  At a = 0 it is 1 (autoregressive decoding's), at a = 1 it is S; a request's first forward (one
                  head) and its end are left out. A model, not a measurement: real acceptances are not independent
                  of the position.

Memory. Before the forward that checks a request's draft, the worker saves the request's state slot (each GDN
layer's recurrent state and conv ring: worker/cache/state_step.py) so that a rejection can put it back; the saved
copy is one more state per verifying sequence (0 for models without linear-attention layers; attention K/V need
no copy). Knows nothing of flags, hardware or time; imports no torch.
"""

from __future__ import annotations

from diffuserve.planner.inputs import Deployment
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.recurrent_state import state_bytes_per_sequence

MEASURED_VERIFIED_TPF = 1.879
MEASURED_SOURCE = (
    "measured: the bundled model (trained for both readings), block 4, one-forward drafts, 600 held-out task "
    "prompts, docs/results/eval.json"
)
"""The verified TPF used when none is given: `diffuserve eval`'s verified row on the bundled model, prompts of the
tasks it was trained on (tests check it against the results file; random prompts give less: compare-verified.json)."""


def verified_tpf_from_acceptance(acceptance_rate: float, block_length: int) -> float:
    """Verified decoding's output tokens per forward at a per-draft acceptance rate (the module docstring)."""
    if not 0.0 <= acceptance_rate <= 1.0:
        raise ValueError(
            f"acceptance_rate: must be in [0, 1] (the share of drafted tokens the causal check keeps), got "
            f"{acceptance_rate}"
        )
    a, drafts = acceptance_rate, block_length - 1
    whole = a**drafts
    cut = sum(a**k * (1 - a) * (k + 1) for k in range(drafts))
    return (whole * block_length + cut + (1 - whole)) / (2 - whole)


def verified_tpf(given: float | None, acceptance_rate: float | None, block_length: int) -> tuple[float, str]:
    """(verified TPF, where it comes from): given > derived from the acceptance rate > measured (capped at S)."""
    if given is not None:
        return given, "given (--verified-tpf)"
    if acceptance_rate is not None:
        tpf = verified_tpf_from_acceptance(acceptance_rate, block_length)
        return tpf, f"acceptance rate {acceptance_rate} at block {block_length}"
    return min(MEASURED_VERIFIED_TPF, block_length), MEASURED_SOURCE


def backup_bytes_per_sequence(spec: ModelSpec, deployment: Deployment) -> float:
    """The saved copy of a verifying sequence's GDN state and conv rings, on one device (0 without GDN layers)."""
    return state_bytes_per_sequence(spec, deployment)
