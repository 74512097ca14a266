"""Passes that simplify the graph without new kernels: redundancy, sibling merge, bias absorption, staging."""
