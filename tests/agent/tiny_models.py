"""Small models for the agent's loop tests (CPU, seconds)."""

import torch
from torch import nn


class SigmoidGeluMLP(nn.Module):
    """Linear, the sigmoid approximation of GELU (x * sigmoid(1.702 x), three elementwise ops), linear."""

    def __init__(self, width: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        return self.down(h * torch.sigmoid(1.702 * h))


def sigmoid_gelu_mlp() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return SigmoidGeluMLP().eval(), (torch.randn(2, 24, 32),)
