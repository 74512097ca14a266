"""kopt.codegen: fused FX regions → Triton source → registered torch ops."""
