"""Quantized weights: quantize on load (`--quantization fp8|int8|int4`) or load pre-quantized checkpoints (FP8,
GPTQ, AWQ, compressed-tensors), and the matmuls that read them. One concept per file:

    formats.py            the canonical parts every source decodes to and every kernel prepares from
    quantize.py           16/32-bit rows -> canonical parts (int8 / int4 / fp8 rules)
    weight.py             QuantWeight: one logical weight's parts, written box by box, then finalized
    linear.py, experts.py QuantLinear and QuantFusedExperts, in place of the float layers
    apply.py              swapping them in after sharding, finalizing, dummy weights
    kernels.py            which matmul runs (kernels_cpu, kernels_cuda, dequant_kernel)
    checkpoint_*.py       the pre-quantized formats (config -> reader; fp8, gptq / awq, compressed-tensors)
    loading.py            the loader's side: the plan before building, the tensors while loading
    writer.py             `diffuserve quantize`: a compressed-tensors checkpoint from a 16-bit one
    weight_bytes.py       bytes of a loaded model by kind (what the planner predicts)

What the user asked for (method, targets, group size) is diffuserve/model/quant/scheme.py (standard library, read by
the engine config). Knows nothing of requests or the engine; the loader (model/loader.py) calls loading.py and apply.py.
"""
