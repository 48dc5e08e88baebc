#!/usr/bin/env bash
# The MoE GPU check, prepared for one H200 (< 10 minutes): a random-weight Clover-35B-A3B-shaped model in bf16.
#   1. MoE dispatch at 64 x 32 tokens: grouped (torch._grouped_mm) vs sorted runs vs the per-expert loop
#   2. the whole model on the GPU at batch 1, 8, 64: tokens/s, TPF, peak memory
#   3. expert offload under a 24 GB memory cap at batch 1, 8: tokens/s, hit rate, bytes/token, peak memory
# Usage: scripts/gpu_check.sh [--dry-run] [extra gpu_check.py flags]
#   --dry-run   the same code on a tiny shape on the CPU (checks the script where no GPU is available)
#        scripts/gpu_check.sh --clover [--reduced] [extra gpu_check_clover.py flags]
#   --clover    instead: Clover-35B-A3B in the published layout (GDN + gated attention, 256 experts):
#               load time, memory per sequence measured vs planned, decode at 1/8/32 concurrent, a 128K request
#   --reduced   with --clover: the same code at a reduced size and context on the CPU
#        scripts/gpu_check.sh --clover --tensor-parallel-size N [--device cpu] [extra gpu_check_clover_tp.py flags]
#   --clover --tensor-parallel-size N   clover-moe-bench over N GPUs (NCCL): tokens of tp N and tp N with
#               whole experts vs one GPU, rank 0's weights / K/V / state bytes vs the planner, bench throughput
#               at tp 1 and N with the all-reduce time per step (--device cpu: the gloo dry run)
#        scripts/gpu_check.sh --gdn-kernels [--device cpu]
#   --gdn-kernels  the GDN layers on the torch path vs flash-linear-attention / causal-conv1d (pip install -e
#               '.[cuda-kernels]' first): logits and greedy tokens of a random clover-moe-bench checkpoint
#        scripts/gpu_check.sh --compiled [--device cpu]
#   --compiled  the engine compiled as CUDA runs it by default (CUDA graphs, bucketed steps) vs eager on a random
#               sdar-moe-bench in bf16: compile time, recompiles, tokens, decode speed at 1 and 16 requests
#        scripts/gpu_check.sh --graphs [--dry-run]
#   --graphs    CUDA graphs over bucketed steps on random sdar-moe-bench and clover-moe-bench in bf16: graphs
#               recorded per bucket in a warm-up, none recorded or traced in a second mixed workload whose
#               forwards all have bucket shapes, its tokens vs eager, decode speed at 1 / 16 (--dry-run: the same
#               code on the CPU at the tiny shapes, dynamo's capture only; CI runs it)
#        scripts/gpu_check.sh --quantization fp8|int4 [--device cpu]
#   --quantization  the quantized matmuls at Clover-35B-A3B shapes against the dequantize-then-matmul
#               reference and bf16 (scaled_mm fp8 / tinygemm int4 on sm90), the engine quantized on load vs bf16 on
#               sdar-moe-bench and clover-moe-bench, a `diffuserve quantize` checkpoint loaded on the GPU
#        scripts/gpu_check.sh --attention [--device cpu]
#   --attention the attention backends: loop vs batched vs FlashInfer (pip install -e '.[cuda-kernels]'
#               first) on random steps of every runner shape (max diff), their time at 1 / 16 / 64 sequences, and
#               the engine's greedy tokens with each on a random sdar-moe-bench in bf16
#        scripts/gpu_check.sh --smoke [--dry-run]
#   --smoke     the checks above that matter most, in priority order, in under 8 minutes on one H100 /
#               H200 (scripts/gpu_smoke.py: engine bf16 vs CPU fp32, GDN kernels, compiled step, fp8 / int4,
#               tokens/s at 1 / 16 / 64), after installing the wheels scripts/gpu_wheels.sh downloaded;
#               --dry-run validates the plan on the CPU
# Output: the log and the JSON summary in $OUT (or /tmp/diffuserve-gpu-check), the JSON also as the last line.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-/tmp/diffuserve-gpu-check}"
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PYTHON" -c "import torch, safetensors, tokenizers" 2>/dev/null; then
    echo "gpu_check: $PYTHON lacks torch, safetensors or tokenizers; set PYTHON or install the project" >&2
    exit 2
fi
SCRIPT=gpu_check
if [[ "${1:-}" == "--clover" && "${2:-}" == "--tensor-parallel-size" ]]; then
    SCRIPT=gpu_check_clover_tp
    shift
elif [[ "${1:-}" == "--clover" ]]; then
    SCRIPT=gpu_check_clover
    shift
elif [[ "${1:-}" == "--smoke" ]]; then
    SCRIPT=gpu_smoke
    shift
elif [[ "${1:-}" == "--gdn-kernels" ]]; then
    SCRIPT=gpu_check_gdn_kernels
    shift
elif [[ "${1:-}" == "--compiled" ]]; then
    SCRIPT=gpu_check_compiled
    shift
elif [[ "${1:-}" == "--graphs" ]]; then
    SCRIPT=gpu_check_graphs
    shift
elif [[ "${1:-}" == "--quantization" ]]; then
    SCRIPT=gpu_check_quant
    shift
elif [[ "${1:-}" == "--attention" ]]; then
    SCRIPT=gpu_check_attention
    shift
fi
if [[ " $* " != *" --dry-run "* && " $* " != *" --reduced "* && " $* " != *" cpu "* ]]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
# 570 s hard limit: the scripts skip phases past their own budget (500 / 480 s); this only guards against a hang.
timeout 570 "$PYTHON" "scripts/$SCRIPT.py" --out "$OUT_DIR/$SCRIPT.json" "$@" 2>&1 | tee "$OUT_DIR/$SCRIPT.log"
