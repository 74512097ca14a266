"""Package discovery: ``kopt`` and every subpackage under it (``kopt/kernels`` among them), plus the
top-level ``agent/`` folder installed as ``kopt.agent`` (with its subpackages).

pyproject.toml holds the metadata; only the package list lives here, because setuptools'
declarative ``packages.find`` names packages relative to the folder it searches and so cannot
mount ``agent/sub`` as ``kopt.agent.sub``. A folder without ``__init__.py`` is not a package:
``tests/test_packaging.py`` fails if any tracked module is missing from the wheel.
"""

from setuptools import find_packages, setup

MOUNTED = {"kopt.agent": "agent"}  # package name -> folder in the checkout

packages = find_packages(include=["kopt", "kopt.*"])
for name, folder in MOUNTED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

# data read at run time: the autotune choices kopt ships per GPU model (kopt.kernels._autotune)
setup(packages=packages, package_dir=MOUNTED, package_data={"kopt.kernels": ["tuned/*.json"]})
