"""Passes that fuse a matched region into one bf16 kernel: adaLN, gated residual, QK-norm + RoPE,
joint attention input, codegen."""
