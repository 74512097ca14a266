"""The errors kopt raises from a compiled graph (re-exported by :mod:`kopt`)."""

class WeightsChangedError(RuntimeError):
    """Frozen weights changed after compiling and ``on_weight_change=WeightChange.RAISE``."""


class VerificationFailed(RuntimeError):
    """``verify=True`` and ``strict=True``, and the rewritten graph broke a pass's contract."""


class LoweringCheckFailed(VerificationFailed):
    """``strict=True``, and the lowered graph failed its numeric check (:mod:`kopt.checks`)."""
