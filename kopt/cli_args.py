"""Command-line arguments shared by ``kopt``'s subcommands and the agent's (``kopt optimize``)."""

from __future__ import annotations

import os
import sys


def workload_argument(name: str) -> str:
    """A built-in workload name, or ``module:factory`` importable from the current folder (as with
    ``python -m``: the ``kopt`` script's own folder is on the path, the user's is not); exits with the
    reason when it names nothing."""
    from kopt.workloads import get_workload

    if ":" in name and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        get_workload(name)
    except (KeyError, ImportError, AttributeError, TypeError) as error:
        raise SystemExit(f"kopt: {error}") from None
    return name
