"""Attention backends: what computes a paged attention layer's step, behind one interface.

    interface.py   the step's metadata (sequences: query rows, key slots, mask; the K/V write slots) and the
                   AttentionBackend interface every backend implements
    loop.py        "loop": one SDPA per sequence (the reference the others are checked against)
    batched.py     "batched": sequences grouped by query length into padded SDPA calls (any device)
    flashinfer.py  "flashinfer": FlashInfer's varlen paged-prefill kernel (CUDA), an adapter to its contract
    selection.py   --attention-backend auto | loop | batched | flashinfer, and installing it on a model

Knows nothing of requests or the engine; the model runner builds the metadata.
"""
