"""clover_moe over several processes (gloo): tensor parallel (2 and 4 ranks: at 4 the K/V heads are replicated) and
expert parallel (2 and 4 ranks, attention and GDN still split by head) give one device's tokens and, at every step,
its logits within 1e-4. Each case is one multi-process engine running a batch of mixed-length prompts that share
prefixes (prefix-cache hits restore each rank's state snapshots) under a page budget that forces preemption,
with chunked prefill, fused commits, logprobs, prompt scoring, structured output and verified decoding in the same
batch; block 4 and 32, the diffusion tensors present and absent, and expert offload are spread over the cases so
that every one meets a multi-process engine once. Sizes that do not divide the GDN heads are refused before any
process starts.
"""

from __future__ import annotations

import json

import pytest
import torch

from diffuserve import LLM, SamplingParams
from diffuserve.cli.main import main
from diffuserve.distributed.group import ParallelGroup
from diffuserve.structured_outputs import StructuredOutputsParams

CASES = {
    "tp2": dict(tensor_parallel_size=2, block=32, diffusion=True),
    "tp2+ep2": dict(
        tensor_parallel_size=2, enable_expert_parallel=True, block=32, diffusion=False, expert_offload=True
    ),
    "tp4": dict(tensor_parallel_size=4, block=4, diffusion=False),
    "tp4+ep4": dict(tensor_parallel_size=4, enable_expert_parallel=True, block=4, diffusion=True),
}
"""Expert parallelism spans the tensor-parallel ranks (--enable-expert-parallel: attention and GDN heads split over
the N ranks, whole experts over the same N): "ep N" is N ranks with experts whole. The 4-rank cases run 4-token
blocks and the 2-rank cases 32-token ones, to keep the processes' time small."""
LOGIT_ATOL = 1e-4
PAGES = {4: 6, 32: 8}


def _prompts(block: int) -> list[list[int]]:
    """9 prompts of 1 to ~5 pages; most extend a prefix of two pages and more (hits once a first one ran)."""
    page = _page(block)
    generator = torch.Generator().manual_seed(block)
    shared = torch.randint(10, 250, (2 * page + 5,), generator=generator).tolist()
    tails = [torch.randint(10, 250, (n,), generator=generator).tolist() for n in (3, 1, 7, 2, 5, 9, 4, 6, 2)]
    lengths = [2 * page + 5, 2, page + 1, block, 5, 2 * page + 5, page + 1, 3, 2 * page + 5]
    return [shared[:n] + tail for n, tail in zip(lengths, tails)]


def _page(block: int) -> int:
    """The engine's default page: the smallest multiple of the block length >= 16 tokens."""
    return max(16, block)


def _params(block: int, count: int) -> list[SamplingParams]:
    base = SamplingParams(max_tokens=block + 3, ignore_eos=True, threshold=0.4)
    params = [base] * count
    params[1] = base.replace(logprobs=2)
    params[2] = base.replace(prompt_logprobs=2)
    params[4] = base.replace(structured_outputs=StructuredOutputsParams(regex="[ab]{3,6}"), ignore_eos=False)
    params[6] = base.replace(decoder="verified")  # drafts rolled back on every rank (the AR checkpoints: AR)
    return params


def _engine_options(case: dict) -> dict:
    block = case["block"]
    pages = PAGES[block]  # too few for 4 sequences of up to 4 pages: some are preempted
    options = dict(
        block_length=block,
        max_model_len=256,
        max_num_seqs=4,
        max_num_batched_tokens=3 * block,
        num_pages=pages,
        state_snapshot_interval=1,
    )
    return {**options, **{k: case[k] for k in ("expert_offload",) if k in case}}


class LogitsRecorder:
    """Keeps every logits tensor rank 0's model computes (the decoders' and prompt scoring's), in order."""

    def __init__(self, llm: LLM) -> None:
        self.logits: list[torch.Tensor] = []
        model = llm.engine.runner.model
        compute = model.compute_logits

        def recorded(hidden: torch.Tensor) -> torch.Tensor:
            out = compute(hidden)
            self.logits.append(out.clone())
            return out

        model.compute_logits = recorded  # type: ignore[method-assign]


def _run(llm: LLM, block: int) -> tuple[list, LogitsRecorder]:
    recorder = LogitsRecorder(llm)
    prompts = _prompts(block)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], _params(block, len(prompts)))
    return outputs, recorder


class CollectiveCounter:
    """Elements rank 0 all-reduces per token of a forward (every all-reduce in a forward is [N, ...] for its N
    tokens or N x k routed rows), from the last forward that ran."""

    def __init__(self, llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
        self.elements, self.tokens = 0, 1
        executor = llm.engine.runner.executor
        forward, all_reduce = executor.forward, ParallelGroup.all_reduce

        def counted_forward(inputs):
            self.elements, self.tokens = 0, len(inputs.input_ids)
            return forward(inputs)

        def counted_all_reduce(group, tensor):
            self.elements += tensor.numel()
            return all_reduce(group, tensor)

        monkeypatch.setattr(executor, "forward", counted_forward)
        monkeypatch.setattr(ParallelGroup, "all_reduce", counted_all_reduce)

    @property
    def bytes_per_token(self) -> float:
        return self.elements * 4 / self.tokens  # fp32 activations


def _rank_0_footprint(llm: LLM) -> dict[str, float]:
    """What rank 0 holds: its parameters' bytes, its K/V bytes per token and GDN state bytes per slot."""
    executor = llm.engine.runner.executor
    kv = executor.caches.paged["kv"]
    kv_bytes = sum(t.numel() * t.element_size() for t in kv.k_caches + kv.v_caches)
    assert executor.caches.state is not None
    return {
        "weight_bytes": sum(p.numel() * p.element_size() for p in executor.model.parameters()),
        "kv_bytes_per_token": kv_bytes / (kv.num_pages * kv.page_size),
        "state_bytes_per_sequence": executor.caches.state.state_bytes_per_slot(),
    }


def _plan(model_dir: str, case: dict, capsys: pytest.CaptureFixture) -> dict:
    """`diffuserve plan DIR -tp N [-ep N] --weight-dtype fp32 --kv-cache-dtype fp32 --json`, as printed."""
    size = str(case["tensor_parallel_size"])
    expert = ["-ep", size] if case.get("enable_expert_parallel") else []
    capsys.readouterr()
    assert (
        main(["plan", model_dir, "-tp", size, *expert, "--weight-dtype", "fp32", "--kv-cache-dtype", "fp32", "--json"])
        == 0
    )
    return json.loads(capsys.readouterr().out)


def _check_the_plan(plan: dict, footprint: dict[str, float], collectives: CollectiveCounter, case: dict) -> None:
    """Per device, K/V and state bytes exactly, weights within 2 %; the planner's communication term per token
    equals the bytes the engine's all-reduces move (a ring all-reduce sends 2 (P - 1) / P of them) with tensor
    parallelism, and bounds them from above with experts whole per rank (it prices an all-to-all dispatch and
    combine besides the tensor-parallel all-reduces; the engine sums the routed rows in one all-reduce)."""
    memory, forward = plan["memory_per_device"], plan["decode"]["forward"]
    assert footprint["kv_bytes_per_token"] == memory["kv_bytes_per_token"]
    assert footprint["state_bytes_per_sequence"] == memory["state_bytes_per_sequence"]
    assert footprint["weight_bytes"] == pytest.approx(memory["weight_bytes"], rel=0.02)
    size = case["tensor_parallel_size"]
    moved = collectives.bytes_per_token * 2 * (size - 1) / size
    planned = forward["t_comm"] * plan["hardware"]["interconnect_bytes_per_s"] / forward["tokens"]
    if case.get("enable_expert_parallel"):
        assert moved <= planned
    else:
        assert moved == pytest.approx(planned, rel=1e-9)


def _logprob_values(outputs: list) -> list[float]:
    values = []
    for out in outputs:
        for position in (out.outputs[0].logprobs or []) + [p for p in out.prompt_logprobs or [] if p]:
            values += [lp.logprob for lp in position.values()]
    return values


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(CASES))
def test_parallel_clover_gives_one_devices_tokens_and_logits(clover_dirs, name, capsys, monkeypatch):
    case = CASES[name]
    model_dir, block = str(clover_dirs[case["diffusion"]]), case["block"]
    options = _engine_options(case)
    expected, one = _run(LLM(model_dir, **options), block)
    parallel = LLM(
        model_dir,
        tensor_parallel_size=case["tensor_parallel_size"],
        enable_expert_parallel=case.get("enable_expert_parallel", False),
        **options,
    )
    collectives = CollectiveCounter(parallel, monkeypatch)
    try:
        got, many = _run(parallel, block)
        stats, footprint = parallel.engine.stats(), _rank_0_footprint(parallel)
    finally:
        parallel.engine.shutdown()
    _check_the_plan(_plan(model_dir, case, capsys), footprint, collectives, case)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert len(many.logits) == len(one.logits)
    for step, (a, b) in enumerate(zip(many.logits, one.logits)):
        torch.testing.assert_close(a, b, atol=LOGIT_ATOL, rtol=0, msg=lambda m, step=step: f"step {step}: {m}")
    torch.testing.assert_close(_logprob_values(got), _logprob_values(expected), atol=LOGIT_ATOL, rtol=0)
    assert got[2].prompt_logprobs and got[1].outputs[0].logprobs
    if case["diffusion"]:  # the verified request's drafts were checked, and some rolled back on every rank
        spec = stats.spec_decode
        assert spec.num_drafts > 0 and spec.num_accepted_tokens < spec.num_draft_tokens
    assert set(got[4].outputs[0].text) <= set("ab") and got[4].outputs[0].finish_reason == "stop"
    assert stats.num_preemptions > 0, "the page budget should force preemption"
    assert stats.state is not None and stats.state.hit_rate > 0, "later prompts should restore state snapshots"
    workers = parallel.engine.runner.executor.runtime.processes
    assert len(workers) == case["tensor_parallel_size"] - 1
    assert [(p.is_alive(), p.exitcode) for p in workers] == [(False, 0)] * len(workers), "workers exit cleanly"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(tensor_parallel_size=3), r"tensor_parallel_size: 3 does not divide the model's 8 attention heads"),
        (
            dict(tensor_parallel_size=8),
            r"8 does not divide the model's 4 linear-attention key heads \(linear_num_key_heads\); use one of 1, 2, 4",
        ),
        (
            dict(tensor_parallel_size=8, enable_expert_parallel=True),
            r"8 does not divide the model's 4 linear-attention key heads",
        ),
    ],
)
def test_sizes_that_do_not_divide_the_gdn_heads_are_refused_before_any_process(clover_dirs, options, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(clover_dirs[True]), num_pages=16, **options)


def test_cli_refuses_a_size_that_does_not_divide_the_heads_in_one_line(clover_dirs, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a worker process was started")

    monkeypatch.setattr("diffuserve.distributed.launcher._spawn_workers", never)
    assert main(["serve", str(clover_dirs[True]), "--port", "0", "--tensor-parallel-size", "3"]) == 2
    assert capsys.readouterr().err == (
        "diffuserve serve: error: tensor_parallel_size: 3 does not divide the model's 8 attention heads "
        "(num_attention_heads); use one of 1, 2, 4\n"
    )


def test_cli_refuses_a_size_that_differs_from_torchruns_world_in_one_line(clover_dirs, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["serve", str(clover_dirs[True]), "--port", "0", "--tensor-parallel-size", "4"]) == 2
    assert capsys.readouterr().err == (
        "diffuserve serve: error: tensor_parallel_size: 4 differs from torchrun's 2 processes; "
        "pass --tensor-parallel-size 2\n"
    )
