"""kopt: verified graph rewrites and fused kernels for PyTorch inference.

    import kopt
    fast = kopt.compile(transformer, passes="auto")
    print(fast.kopt_report)
"""

from kopt.api import KoptModule, compile, make_backend
from kopt.backend import (
    KoptBackend,
    LoweringCheckFailed,
    VerificationFailed,
    WeightsChangedError,
    last_backend_report,
)
from kopt.config import CompileOptions, Lowering, Role, WeightChange
from kopt.errors import CompileDuringCapture
from kopt.fallback import EagerFallbackWarning
from kopt.integrations.exports import kopt_post_grad_pass, optimize_pipeline, restore_pipeline
from kopt.passes.base import Contract, ContractKind, FunctionPass, NearMiss, Pass, PassContext
from kopt.passes.by_example import RewritePass, Rule
from kopt.passes.pipeline import available_passes, default_pipeline
from kopt.release import WeightsReleasedError
from kopt.report import Report
from kopt.version import __version__

__all__ = [
    "CompileDuringCapture", "CompileOptions", "Contract", "ContractKind", "EagerFallbackWarning", "FunctionPass",
    "KoptBackend",
    "KoptModule", "Lowering", "LoweringCheckFailed", "NearMiss", "Pass", "PassContext", "Report", "RewritePass",
    "Role", "Rule",
    "VerificationFailed", "WeightChange", "WeightsChangedError", "WeightsReleasedError", "available_passes", "compile",
    "default_pipeline", "kopt_post_grad_pass", "last_backend_report", "make_backend", "optimize_pipeline",
    "restore_pipeline", "__version__",
]
