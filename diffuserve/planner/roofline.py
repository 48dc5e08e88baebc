"""Per-forward roofline of block-diffusion decoding and of prefill: bytes and FLOPs -> time -> tokens/s.

Owns the expert-touch model (the union of experts a whole forward's tokens route to), the per-device bytes
and FLOPs of one forward (weights, KV read, and for hybrid models the recurrent state read and written and the
delta-rule FLOPs), and the decode / prefill estimates built on it. Knows nothing of memory capacity or money.
Per forward: t = max(bytes / (BW x MBU), FLOPs / (F x MFU)) + communication + step overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diffuserve.planner.hardware import HardwareSpec
from diffuserve.planner.inputs import WEIGHT_BYTES, Deployment, Efficiency, Workload
from diffuserve.planner.memory import MemoryBreakdown, embedding_dtype, kv_bytes_per_sequence
from diffuserve.planner.model_spec import ModelSpec
from diffuserve.planner.params import ParamCounts
from diffuserve.planner.recurrent_state import recurrent_flops, state_bytes_per_sequence
from diffuserve.planner.units import ceil_div, fmt_bytes, fmt_flops, fmt_time


def experts_touched_fraction(
    spec: ModelSpec, num_tokens: float, block_length: int, per_block: float | None = None
) -> float:
    """Expected fraction of a MoE layer's experts that `num_tokens` routed tokens touch.

    Uniform independent routing: 1 - (1 - k/E)^T. With a measured `per_block` (distinct experts one block of
    `block_length` tokens touches), blocks are treated as independent: 1 - (1 - per_block/E)^(T / S).
    """
    if not spec.is_moe:
        return 0.0
    if per_block is not None:
        return 1 - (1 - min(per_block, spec.num_experts) / spec.num_experts) ** (num_tokens / block_length)
    return 1 - (1 - spec.num_experts_per_tok / spec.num_experts) ** num_tokens


def experts_per_block(spec: ModelSpec, block_length: int, coreset: int, per_block: float | None = None) -> float:
    """Distinct experts one block's positions route to, per MoE layer. Per-token routing: the union u of their
    top-k (measured, or E (1 - (1 - k/E)^S) under uniform routing). With a block expert coreset of C < E experts:
    the positions act as n independent top-k draws, n the number that gives u over all E experts
    (E (1 - (1 - k/E)^n) = u; n = S under uniform routing), drawn inside the coreset: C (1 - (1 - k/C)^n), at
    most C, and u again at C = E (bench moe --coreset-sizes measures it)."""
    k, experts = spec.num_experts_per_tok, spec.num_experts
    union = per_block if per_block is not None else experts * (1 - (1 - k / experts) ** block_length)
    if coreset <= 0 or coreset >= experts:
        return union
    if k >= coreset or union >= experts:
        return float(coreset)
    draws = math.log(1 - union / experts) / math.log(1 - k / experts)
    return coreset * (1 - (1 - k / coreset) ** draws)


@dataclass(frozen=True)
class ForwardCost:
    """One forward on one device."""

    tokens: int
    experts_touched: float
    weight_bytes: float
    kv_bytes: float
    state_bytes: float
    """Recurrent state read and written back: 2 x state per sequence (hybrid models; 0 otherwise)."""
    matmul_flops: float
    attention_flops: float
    recurrent_flops: float
    """Delta-rule recurrence of the linear-attention layers (their projections are in `matmul_flops`)."""
    t_memory: float
    t_compute: float
    t_comm: float
    t_overhead: float

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.attention_flops + self.recurrent_flops

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.state_bytes

    @property
    def t_forward(self) -> float:
        return max(self.t_memory, self.t_compute) + self.t_comm + self.t_overhead

    @property
    def bound(self) -> str:
        return "memory-bound" if self.t_memory >= self.t_compute else "compute-bound"


@dataclass(frozen=True)
class DecodeEstimate:
    concurrency: int
    """Sequences decoding on one replica."""
    seqs_per_forward: int
    """Sequences one forward carries (the step's token budget may hold fewer than `concurrency`)."""
    tpf: float
    forward: ForwardCost
    tokens_per_s_per_seq: float
    tokens_per_s_per_replica: float
    tokens_per_s_total: float
    formulas: tuple[str, ...]


@dataclass(frozen=True)
class PrefillEstimate:
    prompt_tokens: int
    num_chunks: int
    t_prefill: float
    first_block_forwards: int
    ttft: float
    formulas: tuple[str, ...]


@dataclass(frozen=True)
class Roofline:
    spec: ModelSpec
    params: ParamCounts
    hardware: HardwareSpec
    deployment: Deployment
    efficiency: Efficiency
    memory: MemoryBreakdown

    def forward(
        self, tokens: int, num_seqs: int, visible_context: float, logits_tokens: int, touched: float
    ) -> ForwardCost:
        """Bytes and FLOPs of one forward of `tokens` query tokens from `num_seqs` sequences that each see
        `visible_context` cached tokens, computing logits for `logits_tokens` positions."""
        dep, eff, tp = self.deployment, self.efficiency, self.deployment.tensor_parallel_size
        lm_head = self.params.lm_head * WEIGHT_BYTES[embedding_dtype(dep.weight_dtype)] / tp
        weights = self.memory.dense_weight_bytes + lm_head + self.memory.expert_weight_bytes * touched
        kv = num_seqs * kv_bytes_per_sequence(self.spec, dep, math.ceil(visible_context), 1)
        # Every sequence of the forward reads its GDN state and writes it back (an upper bound for a preview
        # forward, which reads the committed state and leaves it unchanged until the block commits).
        state = num_seqs * 2 * state_bytes_per_sequence(self.spec, dep)
        body = self.params.matmul_active(self.spec) - self.params.lm_head
        matmul = (2 * body * tokens + 2 * self.params.lm_head * logits_tokens) / tp
        attention = self._attention_flops(tokens, visible_context) / tp
        recurrent = recurrent_flops(self.spec, tokens) / tp
        # Weight GEMMs run at the weights' rate (FP8 on FP8 hardware); attention and the recurrence run in the
        # activation dtype.
        activation_dtype = "fp32" if dep.weight_dtype == "fp32" else "bf16"
        t_compute = (
            matmul / self.hardware.flops_for(dep.weight_dtype)
            + (attention + recurrent) / self.hardware.flops_for(activation_dtype)
        ) / eff.flops_fraction
        return ForwardCost(
            tokens=tokens,
            experts_touched=touched,
            weight_bytes=weights,
            kv_bytes=kv,
            state_bytes=state,
            matmul_flops=matmul,
            attention_flops=attention,
            recurrent_flops=recurrent,
            t_memory=(weights + kv + state) / (self.hardware.bandwidth_bytes_per_s * eff.bandwidth_fraction),
            t_compute=t_compute,
            t_comm=self._comm_time(tokens),
            t_overhead=eff.step_overhead_s,
        )

    def decode(self, workload: Workload, concurrency: int) -> DecodeEstimate:
        """Steady-state decoding of `concurrency` sequences per replica, each denoising its current block."""
        dep, block = self.deployment, workload.block_length
        per_forward = max(1, min(concurrency, dep.max_num_seqs, dep.max_num_batched_tokens // block))
        tokens = per_forward * block
        touched = self._touched(workload, tokens)
        cost = self.forward(tokens, per_forward, workload.mean_context, tokens, touched)
        per_replica = per_forward * workload.tpf / cost.t_forward
        formulas = (
            *self._forward_formulas(cost, per_forward, workload),
            f"tokens/s per replica = {per_forward} seqs x TPF {workload.tpf} / t {fmt_time(cost.t_forward)} "
            f"= {per_replica:,.1f}; per sequence = / {concurrency} = {per_replica / concurrency:,.1f}; "
            f"total = x {dep.num_replicas} replica(s) = {per_replica * dep.num_replicas:,.1f}",
        )
        return DecodeEstimate(
            concurrency=concurrency,
            seqs_per_forward=per_forward,
            tpf=workload.tpf,
            forward=cost,
            tokens_per_s_per_seq=per_replica / concurrency,
            tokens_per_s_per_replica=per_replica,
            tokens_per_s_total=per_replica * dep.num_replicas,
            formulas=formulas,
        )

    def prefill(self, workload: Workload, decode: DecodeEstimate) -> PrefillEstimate:
        """Prompt in chunks of max_num_batched_tokens (no logits), then the forwards until the first block
        commits: TTFT = t_prefill + ceil(S / TPF) x t_decode (no queueing)."""
        chunk, prompt = self.deployment.max_num_batched_tokens, workload.prompt_tokens
        total = 0.0
        for start in range(0, prompt, chunk):
            size = min(chunk, prompt - start)
            touched = experts_touched_fraction(self.spec, size, workload.block_length)
            total += self.forward(size, 1, start + size / 2, 0, touched).t_forward
        steps = math.ceil(workload.block_length / workload.tpf)
        ttft = total + steps * decode.forward.t_forward
        chunks = ceil_div(prompt, chunk)
        formulas = (
            f"prefill = {chunks} chunk(s) of <= {chunk} tokens, each max(t_mem, t_cmp) + overhead, experts "
            f"1 - (1 - k/E)^chunk, attention over prefix + chunk/2 = {fmt_time(total)}",
            f"TTFT = prefill {fmt_time(total)} + ceil(S {workload.block_length} / TPF {workload.tpf}) = {steps} "
            f"decode forwards x {fmt_time(decode.forward.t_forward)} = {fmt_time(ttft)} (no queueing)",
        )
        return PrefillEstimate(prompt, chunks, total, steps, ttft, formulas)

    def _touched(self, workload: Workload, tokens: int) -> float:
        if workload.experts_touched_fraction is not None:
            return workload.experts_touched_fraction
        # With EP wider than TP, one expert shard serves the tokens of ep / tp replicas.
        share = max(1, self.deployment.expert_parallel_size // self.deployment.tensor_parallel_size)
        per_block = workload.experts_touched_per_block
        if workload.block_expert_coreset > 0 and self.spec.is_moe:
            per_block = experts_per_block(self.spec, workload.block_length, workload.block_expert_coreset, per_block)
        return experts_touched_fraction(self.spec, tokens * share, workload.block_length, per_block)

    def _attention_flops(self, queries: int, visible_context: float) -> float:
        """QK^T and PV: 4 FLOPs x Hq x D per (query, visible key) pair per layer."""
        total = 0.0
        for group in self.spec.attention:
            keys = visible_context if group.window is None else min(visible_context, group.window)
            total += 4 * group.num_layers * group.num_heads * group.head_dim * queries * keys
        return total

    def _comm_time(self, tokens: int) -> float:
        """TP: two ring all-reduces of T x h activations per layer; EP: dispatch + combine all-to-all of
        T x k x h per MoE layer. Not overlapped with compute (an upper bound)."""
        dep, spec = self.deployment, self.spec
        b_act = 4 if dep.weight_dtype == "fp32" else 2
        tp, ep, link = dep.tensor_parallel_size, dep.expert_parallel_size, self.hardware.interconnect_bytes_per_s
        moved = 0.0
        if tp > 1:
            moved += 2 * spec.num_layers * 2 * (tp - 1) / tp * tokens * spec.hidden_size * b_act
        if ep > 1:
            moved += (
                2 * spec.num_moe_layers * (ep - 1) / ep * tokens * spec.num_experts_per_tok * spec.hidden_size * b_act
            )
        return moved / link

    def _forward_formulas(self, cost: ForwardCost, seqs: int, workload: Workload) -> tuple[str, ...]:
        hw, eff, spec = self.hardware, self.efficiency, self.spec
        touch = (
            f"experts touched = {cost.experts_touched:.1%}"
            if not spec.is_moe
            else f"experts touched = 1 - (1 - k {spec.num_experts_per_tok}/E {spec.num_experts})^T "
            f"= {cost.experts_touched:.1%}"
            + (" (given)" if workload.experts_touched_fraction is not None else "")
            + (" (from measured experts per block)" if workload.experts_touched_per_block else "")
        )
        if spec.is_moe and workload.block_expert_coreset > 0 and workload.experts_touched_fraction is None:
            per_block = experts_per_block(
                spec, workload.block_length, workload.block_expert_coreset, workload.experts_touched_per_block
            )
            touch = (
                f"experts touched = 1 - (1 - C {workload.block_expert_coreset} (1 - (1 - k/C)^n), n the top-k draws "
                f"giving a block's union = {per_block:.1f} / E {spec.num_experts})^(T / S) = {cost.experts_touched:.1%}"
                " (block expert coreset; commits route per token, not modelled)"
            )
        weights_dtype = self.deployment.weight_dtype
        act_dtype = "fp32" if weights_dtype == "fp32" else "bf16"
        gdn = spec.linear_attention
        state = (
            ""
            if gdn is None
            else (
                f" + state (read + write) 2 x {seqs} x {fmt_bytes(cost.state_bytes / max(2 * seqs, 1))} "
                f"= {fmt_bytes(cost.state_bytes)}"
            )
        )
        recurrence = (
            ""
            if gdn is None
            else (
                f" + recurrence 7 x L {gdn.num_layers} x Hv {gdn.num_value_heads} x Dk {gdn.key_head_dim} x Dv "
                f"{gdn.value_head_dim} x T / tp {fmt_flops(cost.recurrent_flops)}"
            )
        )
        return (
            f"T = {seqs} seqs x S {workload.block_length} = {cost.tokens} tokens per forward; {touch}",
            f"bytes = dense+LM head + experts x touched = {fmt_bytes(cost.weight_bytes)} "
            f"+ KV {seqs} x KV/seq(mean context {workload.mean_context:,.0f}) = {fmt_bytes(cost.kv_bytes)}{state}",
            f"FLOPs = matmul 2 x active params (no input embedding) x T / tp {fmt_flops(cost.matmul_flops)} + "
            f"attention 4 x L x Hq x D x T x context / tp {fmt_flops(cost.attention_flops)}{recurrence}",
            f"t_mem = {fmt_bytes(cost.bytes)} / ({hw.bandwidth_bytes_per_s / 1e12:.3g} TB/s"
            f" x MBU {eff.bandwidth_fraction}) = {fmt_time(cost.t_memory)}; t_cmp = "
            f"({fmt_flops(cost.matmul_flops)} / {fmt_flops(hw.flops_for(weights_dtype), True)} + "
            f"{fmt_flops(cost.attention_flops + cost.recurrent_flops)} / {fmt_flops(hw.flops_for(act_dtype), True)})"
            f" / MFU {eff.flops_fraction} = {fmt_time(cost.t_compute)}",
            f"t_forward = max(t_mem, t_cmp) + comm {fmt_time(cost.t_comm)} + overhead "
            f"{fmt_time(cost.t_overhead)} = {fmt_time(cost.t_forward)} ({cost.bound})",
        )
