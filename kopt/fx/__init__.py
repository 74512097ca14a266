"""Graph capture and FX helpers."""
