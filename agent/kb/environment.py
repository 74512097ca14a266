"""The environment a measurement belongs to: accelerator, driver, CUDA, library versions.

Nothing host-specific (no hostname, no paths): two machines with the same GPU and software are one
environment, so numbers measured on one apply to the other. A candidate accepted in one
environment is re-verified on first use in another (the loop's rule, not this module's).
"""

from __future__ import annotations

import platform
import shutil
import subprocess

from kopt.agent.kb.records import Environment


def _driver() -> str:
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return found.stdout.strip().splitlines()[0] if found.returncode == 0 and found.stdout.strip() else ""


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def current_environment() -> Environment:
    """This process's environment (GPU 0 when CUDA is available, else the CPU)."""
    import torch
    import triton

    from kopt.version import __version__

    cuda = torch.cuda.is_available()
    gpu = torch.cuda.get_device_name(0) if cuda else f"cpu: {_cpu_name()}"
    return Environment(gpu=gpu, driver=_driver() if cuda else "", cuda=torch.version.cuda or "",
                       torch=torch.__version__, triton=triton.__version__, kopt=__version__,
                       python=platform.python_version(), platform=f"{platform.system()}-{platform.machine()}")
