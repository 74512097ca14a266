"""The DiT harness (dit.py) and its parts (variants, measurement, breakdown, summary, results),
the zoo and the other whole-model scripts."""
