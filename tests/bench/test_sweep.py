"""`diffuserve bench sweep`: its workloads, its figures from instrumented times, the peers decoding the engine's
tokens where that is decidable (temperature 0, best case), and its argument errors."""

from __future__ import annotations

import pytest
import torch

from diffuserve.bench import sweep_engine, sweep_readings
from diffuserve.bench.sweep_block_peer import BlockDiffusionPeer
from diffuserve.bench.sweep_metrics import (
    RequestTrace,
    StepTiming,
    overhead_fraction,
    row_figures,
    static_batch_ceiling,
)
from diffuserve.bench.sweep_peers import cut, left_pad
from diffuserve.bench.sweep_workload import ROLLOUT_SHARE, STOP_COUNT, SweepRequest, make_workload
from diffuserve.cli.main import main
from tests.bench.conftest import FAST
from tests.bench.json_schema import SWEEP, validate

ALLOWED = list(range(3, 300))


def realistic(concurrency: int, window: float = 2.0) -> list:
    return make_workload("realistic", concurrency, 40, 64, ALLOWED, seed=7, arrival_window=window)


def test_best_case_is_the_static_batchers_best_case():
    requests = make_workload("best-case", 16, 40, 64, ALLOWED, seed=7)
    assert {len(r.prompt) for r in requests} == {40}
    assert {r.max_tokens for r in requests} == {64}
    assert {r.arrival_s for r in requests} == {0.0}
    assert all(not r.stop_token_ids for r in requests)
    assert all(set(r.prompt) <= set(ALLOWED) for r in requests)
    assert len({tuple(r.prompt) for r in requests}) == 16  # distinct prompts


def test_realistic_mixes_lengths_stops_arrivals_and_long_rollouts():
    requests = realistic(64)
    assert requests == realistic(64)  # seeded
    lengths = [len(r.prompt) for r in requests]
    assert min(lengths) >= 10 and max(lengths) <= 40 and len(set(lengths)) > 10
    rollouts = requests[ROLLOUT_SHARE - 1 :: ROLLOUT_SHARE]
    assert {r.max_tokens for r in rollouts} == {64}
    others = [r.max_tokens for i, r in enumerate(requests) if i % ROLLOUT_SHARE != ROLLOUT_SHARE - 1]
    assert min(others) >= 8 and max(others) <= 32 and len(set(others)) > 5
    stops = {r.stop_token_ids for r in requests}
    assert len(stops) == 1 and len(next(iter(stops))) == STOP_COUNT  # one shared stop set
    assert all(not set(r.prompt) & set(r.stop_token_ids) for r in requests)
    arrivals = [r.arrival_s for r in requests]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and len(set(arrivals)) == 64
    assert 0.5 < arrivals[-1] < 5.0  # Poisson at 64 / 2 s: the last arrives about 2 s in
    # request i's prompt and lengths do not depend on the concurrency (a larger sweep point extends a smaller one)
    assert [(r.prompt, r.max_tokens) for r in realistic(16)] == [(r.prompt, r.max_tokens) for r in requests[:16]]
    assert make_workload("realistic", 8, 40, 64, ALLOWED, seed=8) != make_workload("realistic", 8, 40, 64, ALLOWED, 7)


def test_unknown_workload_is_named():
    with pytest.raises(ValueError, match="workload: 'mixed' is unknown; choose from best-case, realistic"):
        make_workload("mixed", 4, 8, 8, ALLOWED, seed=0)


def test_overhead_is_the_share_of_step_time_outside_the_forward():
    steps = [StepTiming(wall_s=1.0, model_s=0.9), StepTiming(wall_s=3.0, model_s=1.5)]
    assert overhead_fraction(steps) == pytest.approx(1 - 2.4 / 4.0)
    assert overhead_fraction([]) is None


def test_static_batch_ceiling_counts_blocks():
    def trace(n: int) -> RequestTrace:
        t = RequestTrace(arrival_s=0.0)
        t.tokens = [1] * n
        return t

    traces = [trace(n) for n in (64, 10, 32, 0)]
    assert static_batch_ceiling(traces, 1) == pytest.approx(4 * 64 / (64 + 10 + 32 + 1))  # tokens at block 1
    assert static_batch_ceiling(traces, 32) == pytest.approx(4 * 2 / (2 + 1 + 1 + 1))  # whole blocks, at least one
    assert static_batch_ceiling(traces, 256) == 1.0  # one canvas each


def test_ttft_and_itl_come_from_the_deliveries():
    early, late = RequestTrace(arrival_s=0.0), RequestTrace(arrival_s=1.0)
    for at, count in ((0.5, 4), (0.7, 0), (0.75, 4), (1.0, 2)):
        early.deliver(at, count)  # a delivery of no tokens is no delivery
    late.deliver(3.0, 1)
    early.tokens, late.tokens = list(range(10)), [1]
    figures = row_figures([early, late], wall_s=4.0)
    assert figures["tokens_per_s"] == pytest.approx(11 / 4.0)
    assert figures["ttft_s"]["max"] == pytest.approx(2.0) and figures["ttft_s"]["mean"] == pytest.approx(1.25)
    assert sorted(early.itls) == pytest.approx([0.25, 0.25])


def test_a_static_rows_tokens_past_its_own_end_are_dropped_with_their_deliveries():
    trace = RequestTrace(arrival_s=0.0)
    for at, count in ((1.0, 4), (2.0, 4), (3.0, 4)):
        trace.deliver(at, count)
    trace.tokens = list(range(12))
    trace.keep_first(6)
    assert trace.tokens == list(range(6)) and trace.deliveries == [(1.0, 4), (2.0, 2)]


def test_engine_static_runs_every_row_until_the_last_is_done_and_cuts_each_at_its_own_end(
    run_bench, tmp_path, monkeypatch
):
    """Clover's diffusion reading on the realistic workload (stops, mixed lengths): the static batch computes every
    row until the batch's last row is done (its longest output, found by an untimed first run), yet each request's
    tokens are the engine's own (cut at its stop or length)."""
    computed: list[list[int]] = []

    def static_drive(engine, requests, params_for, static=False, profile=False):
        run = sweep_engine.drive(engine, requests, params_for, static, profile)
        computed.append([len(t.tokens) for t in run.traces])  # before the peer cuts them
        return run

    monkeypatch.setattr(sweep_readings, "drive", static_drive)
    argv = ["sweep", "--model", "clover-moe-tiny", "--model-cache-dir", str(tmp_path), "--readings", "diffusion"]
    argv += ["--concurrency", "6", "--workload", "realistic", "--prompt-tokens", "16", "--output-tokens", "32"]
    code, result, _ = run_bench([*argv, "--arrival-window", "0", *FAST])
    (row,) = result["results"]
    assert code == 0 and row["peer"] == "engine-static" and row["token_agreement"] == 1.0
    assert row["peer_result"]["generated_tokens"] == row["engine"]["generated_tokens"] < 6 * 32
    ends, timed = computed[-2:]  # the untimed run's lengths, then the timed run's
    assert sum(ends) == row["engine"]["generated_tokens"] and len(set(ends)) > 1
    assert timed == [max(ends)] * 6  # every row computed until the last one is done


def test_peer_helpers_cut_at_stops_and_pad_left():
    assert cut([5, 6, 7, 8], (7,), 10) == [5, 6, 7]
    assert cut([5, 6, 7, 8], (), 2) == [5, 6]
    ids, valid = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and valid.tolist() == [[True] * 3, [False, False, True]]


def test_sdar_peer_decodes_the_engines_tokens_on_the_best_case(run_bench, bench_model_dir):
    """The batched transformers KV-cache peer (SDAR scheme) at 4 concurrent gives the engine's tokens."""
    pytest.importorskip("transformers")
    argv = ["sweep", "--model", str(bench_model_dir), "--concurrency", "1", "4", "--workload", "best-case"]
    code, result, text = run_bench([*argv, "--prompt-tokens", "6", "--output-tokens", "8", *FAST])
    assert code == 0 and "transformers-kv-batched" in text and validate(result, SWEEP) == []
    rows = result["results"]
    assert [r["concurrency"] for r in rows] == [1, 4] and all(r["same_tokens"] for r in rows)
    assert all(r["engine"]["generated_tokens"] == r["concurrency"] * 8 for r in rows)
    assert all(0 <= r["engine"]["overhead_fraction"] < 1 and r["ratio"] > 0 for r in rows)
    assert all(r["engine"]["phases_us_per_request_step"]["forward"] > 0 for r in rows)
    assert "engine step phases, microseconds per request-step" in text
    assert {t["what"] for t in result["targets"]} == {"ratio"}  # no 128-concurrent row: no overhead target


def test_clover_ar_reading_equals_transformers_generate(run_bench, tmp_path):
    """The autoregressive reading: the engine at block length 1 and transformers' Qwen3_5MoeForCausalLM.generate
    (left-padded batch, greedy, the mask token suppressed) agree token for token at 4 concurrent. Prompts 2 and 3
    reach a step where the mask token is transformers' argmax: without the suppression their tokens differ."""
    pytest.importorskip("transformers")
    argv = ["sweep", "--model", "clover-moe-tiny", "--model-cache-dir", str(tmp_path), "--readings", "ar"]
    argv += ["--concurrency", "4", "--workload", "best-case", "--prompt-tokens", "32", "--output-tokens", "56"]
    code, result, _ = run_bench([*argv, *FAST])
    (row,) = result["results"]
    assert code == 0 and row["peer"] == "transformers-generate" and row["block_length"] == 1
    assert row["same_tokens"] is True and row["engine"]["generated_tokens"] == 224


def test_a_reading_the_family_lacks_is_named(bench_model_dir, capsys):
    code = main(["bench", "sweep", "--model", str(bench_model_dir), "--readings", "ar", *FAST])
    assert code != 0
    assert "readings: the sdar family has no ar reading; it has diffusion" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "argument --concurrency: must be >= 1, got 0"),
        (["--workload", "mixed"], "argument --workload: invalid choice: 'mixed'"),
        (["--arrival-window", "-1"], "argument --arrival-window: must be >= 0 seconds, got -1"),
        (["--readings", "causal"], "argument --readings: invalid choice: 'causal'"),
    ],
)
def test_argument_errors_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "sweep", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


class FixedLogits:
    """A BlockForward that returns the same logits [B, 4, 6] at every step, counting the steps."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.fixed, self.calls, self.commits = logits, 0, 0

    def reset(self) -> None:
        pass

    def logits(self, ids, positions, mask, start):
        self.calls += 1
        return self.fixed

    def commit(self, ids, positions, mask, start):
        self.commits += 1


def test_block_peer_accepts_above_the_threshold_then_the_most_confident_and_never_the_mask():
    """Row 0: positions 0 and 1 are sure (token 1 at p > 0.99) and go in the first step; 2 and 3 (token 3, p 0.35
    and 0.6) follow one a step. Row 1: 2 and 3 are sure (token 4); at 0 and 1 the mask token (5) is the argmax, so
    the best other token (3) is written instead, one a step. Three forwards for the block."""
    logits = torch.zeros(2, 4, 6)
    logits[0, :2, 1], logits[0, 2, 3], logits[0, 3, 3] = 10.0, 1.0, 2.5
    logits[1, :2, 5], logits[1, :2, 3], logits[1, 2:, 4] = 3.0, 2.0, 10.0
    forward = FixedLogits(logits)
    peer = BlockDiffusionPeer("fake", forward, block=4, mask_id=5, pad_id=0, threshold=0.9)
    run = peer.run([SweepRequest([1, 2, 3, 4], 4, 0.0), SweepRequest([2, 3, 4, 1], 4, 0.0)])
    assert [t.tokens for t in run.traces] == [[1, 1, 3, 3], [3, 3, 4, 4]]
    assert forward.calls == 3  # one position at a time would take 4
    assert forward.commits == 1  # the prompt's block; the last block is never committed
    assert [len(t.deliveries) for t in run.traces] == [1, 1]  # a block's tokens arrive together
