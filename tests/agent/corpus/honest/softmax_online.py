"""region: softmax
expect: accept
why: an online (flash-style) softmax over column chunks of 13: running max and rescaled running sum."""
import torch


def candidate(x):
    rows = x.shape[:-1]
    running_max = torch.full(rows + (1,), float("-inf"), dtype=x.dtype)
    running_sum = torch.zeros(rows + (1,), dtype=x.dtype)
    for start in range(0, x.shape[-1], 13):
        chunk = x[..., start:start + 13]
        new_max = torch.maximum(running_max, chunk.amax(-1, keepdim=True))
        correction = torch.where(running_sum == 0, torch.zeros_like(running_sum), torch.exp(running_max - new_max))
        running_sum = running_sum * correction + torch.exp(chunk - new_max).sum(-1, keepdim=True)
        running_max = new_max
    return torch.exp(x - running_max) / running_sum
