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


class TinyAttentionBlock(nn.Module):
    """Pre-norm attention and a sigmoid-GELU MLP with a SiLU gate: attention shapes, several
    elementwise region classes, and passes to choose among (two sizes share every region class)."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.gate = nn.Linear(width, 2 * width), nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.out(attention.transpose(1, 2).reshape(b, s, w))
        h = self.norm2(x)
        up = self.up(h)
        mlp = up * torch.sigmoid(1.702 * up) * torch.nn.functional.silu(self.gate(h))
        return x + self.down(mlp)


def tiny_attention_block(width: int = 32, seq: int = 24, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(seed)
    return TinyAttentionBlock(width).eval(), (torch.randn(2, seq, width),)


class TinyBlockStack(nn.Module):
    """Three :class:`TinyAttentionBlock` s in a ModuleList between an input projection and a final
    norm: what regional capture sees as one block class run three times, with code between."""

    def __init__(self, width: int = 32, blocks: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.ModuleList([TinyAttentionBlock(width) for _ in range(blocks)])
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def tiny_block_stack(width: int = 32, seq: int = 24, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(seed)
    return TinyBlockStack(width).eval(), (torch.randn(2, seq, width),)
