"""Benchmarks for kopt: scripts that print tables and write JSON under ``benchmarks/results/``.

``python benchmarks/dit/dit.py --help`` is the entry point; the other modules are its parts.
"""
