"""A stand-in for torchvision in the engine test venvs (CI only; never installed for users).

Why: PyPI's torchvision wheels link the CUDA build of torch and fail to import beside the CPU
build (``operator torchvision::nms does not exist``), and the CPU wheels are on no registry this
CI reaches. SGLang and vLLM import torchvision at module level on paths the tests import but never
run (image preprocessing of vision-language models). Every name here resolves, so those imports
succeed; anything actually used (called, instantiated) raises, so a test cannot pass by running it.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stand-in"


class _Missing(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torchvision stand-in: {cls.__qualname__} is not available in this test venv")


def _missing(qualname):
    return _Missing(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "__module__": __name__})


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(f"torchvision.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``torchvision.<sub>`` module is a package whose attributes are stand-ins."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = lambda name: (_ for _ in ()).throw(AttributeError(name)) if name.startswith("__") \
            else _missing(f"{spec.name}.{name}")
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
