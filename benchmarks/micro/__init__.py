"""Micro-benchmarks at production shapes: kernels against the copy ceiling, FP8 GEMMs, attention."""
