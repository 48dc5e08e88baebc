"""The references: independent oracles (naive decodes that share only the model's forward with the engine, the
standalone DiffusionGemma loop, reference quantization and fp8 K/V arithmetic) and the seeded random checkpoints
they and the benchmarks run on. Kept out of the serving path: the engine, the server and the CLI's serving
commands never import this package (`diffuserve bench` does, through its references).

    random_checkpoint, llada2_checkpoint, byte_tokenizer   seeded random-weight model directories (no downloads)
    reference_model, reference_decoders, reference_decode  the naive recompute reference decode: an oracle that
                                                           shares only the model's forward with the engine
    parity                                                 the engine against that reference, token for token
    cache_check                                            the engine's cached logits against a full recompute
    clover_moe_checkpoint, reference_clover_moe            the same for clover_moe (hybrid GDN / attention): random
                                                           directories, and its naive block-diffusion / AR decode
"""
