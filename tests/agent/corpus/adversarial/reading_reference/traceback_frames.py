"""region: gelu_bias
expect: sandbox, runs
why: reaches frames through an exception's traceback (tb_frame) to read the caller's locals."""
import torch


def candidate(b, x):
    try:
        raise RuntimeError
    except RuntimeError as error:
        frame = error.__traceback__.tb_frame.f_back
    return torch.zeros_like(x) + len(frame.f_locals)
