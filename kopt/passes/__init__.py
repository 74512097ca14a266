"""Graph rewrite passes; the order lives in :mod:`kopt.passes.pipeline`."""
