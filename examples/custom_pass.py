"""Writing and registering your own kopt pass.

Two ways, both verified and reported like the built-in passes:

1. By example: the pattern and its replacement are two plain PyTorch functions. Here:
   ``x * sigmoid(x)`` (SiLU spelled out by hand, common in ported models) becomes one ``silu`` op.
2. As a function over the FX graph, for rewrites a pattern cannot express.

Run: ``python examples/custom_pass.py``
"""

from __future__ import annotations

import torch

import kopt


# 1. A rule by example -------------------------------------------------------------------------
def silu_by_hand(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def silu_fused(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x)


def floating_point_only(match) -> str | None:
    """Decline (with a reason the report shows) where the input is not floating point."""
    (x,) = match.placeholder_nodes
    value = x.meta.get("val")
    if value is not None and not value.is_floating_point():
        return f"input dtype {value.dtype} is not floating point"
    return None


silu_rule = kopt.Rule(
    name="mul-sigmoid→silu",
    pattern=silu_by_hand,
    replacement=silu_fused,
    example=lambda: (torch.randn(8, 16),),
    why="silu(x) is defined as x * sigmoid(x)",
    guard=floating_point_only,
)
fuse_silu = kopt.RewritePass(
    name="fuse-silu",
    why="one silu kernel reads x once instead of sigmoid + mul reading it twice",
    contract=kopt.Contract.tolerance(1e-5),  # the fused kernel may round differently
    rules=[silu_rule],
)


# 2. A pass as a function ----------------------------------------------------------------------
def count_gemms(graph_module: torch.fx.GraphModule, ctx: kopt.PassContext) -> None:
    """An analysis-only pass: it records a note and rewrites nothing."""
    gemms = [n for n in graph_module.graph.nodes if n.target in (torch.ops.aten.mm.default,
                                                                   torch.ops.aten.addmm.default)]
    ctx.notes.append(f"{len(gemms)} GEMMs in the graph")


gemm_census = kopt.FunctionPass("gemm-census", "reports the GEMM count", kopt.Contract.exact(), count_gemms)


class HandWrittenSiluMLP(torch.nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.up(x)
        return self.down(hidden * torch.sigmoid(hidden))


def main() -> None:
    model = HandWrittenSiluMLP().eval()
    compiled = kopt.compile(model, passes=["auto", fuse_silu, gemm_census], lower="eager", verify=True)
    x = torch.randn(4, 32, 64)
    with torch.no_grad():
        reference, output = model(x), compiled(x)
    print(compiled.kopt_report)
    error = ((output - reference).norm() / reference.norm()).item()
    print(f"\nfuse-silu fired {compiled.kopt_report.matches('fuse-silu')}x; relative error {error:.2e}")


if __name__ == "__main__":
    main()
