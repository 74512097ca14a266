"""Passes that fuse a matched region into one kernel (bf16): adaLN, gated residual, QK-norm+RoPE, joint attention input, codegen."""
