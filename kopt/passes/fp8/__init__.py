"""Passes that quantize to FP8: linears, their producers, attention, and the small-M GEMV; the ops they emit."""
