#!/usr/bin/env bash
# diffusers' own torch.compile and LoRA hot-swap tests for the Flux and QwenImage transformers, on
# the CPU, with kopt as torch.compile's backend (kopt_upstream_plugin.py says what it changes).
# Not run in CI: it needs diffusers' tests/ folder, which the PyPI package does not ship.
#
#   git clone https://github.com/huggingface/diffusers /tmp/diffusers
#   mkdir -p /tmp/diffusers-src && git -C /tmp/diffusers archive HEAD tests | tar -x -C /tmp/diffusers-src
#   tests/upstream/run_diffusers_tests.sh                       # kopt, the tests as written
#   KOPT_UPSTREAM_STATIC=1 tests/upstream/run_diffusers_tests.sh # hot-swap tests compare outputs (dynamic=False)
#   KOPT_UPSTREAM_BACKEND=inductor tests/upstream/run_diffusers_tests.sh   # the same under plain Inductor
#
# DIFFUSERS_SRC names the folder holding tests/ (default /tmp/diffusers-src); extra arguments go to
# pytest. Each run appends one JSON line per test to $KOPT_UPSTREAM_REPORT (default
# /tmp/kopt-upstream-<backend>[-static].jsonl) and prints a summary of what kopt did per test.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${DIFFUSERS_SRC:-/tmp/diffusers-src}"
backend="${KOPT_UPSTREAM_BACKEND:-kopt}"
suffix=""; [ "${KOPT_UPSTREAM_STATIC:-0}" = "1" ] && suffix="-static"
export KOPT_UPSTREAM_REPORT="${KOPT_UPSTREAM_REPORT:-/tmp/kopt-upstream-${backend}${suffix}.jsonl}"
rm -f "$KOPT_UPSTREAM_REPORT"
[ -d "$src/tests/models/testing_utils" ] || { echo "no diffusers tests under $src (see the header)" >&2; exit 2; }
cd "$src" || exit 2
# The compile mixin minus AOT export (AOTInductor, not torch.compile) and group offloading (CUDA
# streams); every LoRA hot-swap test of the two models.
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" python -m pytest -p kopt_upstream_plugin -p no:cacheprovider -q -rfEs \
  tests/models/transformers/test_models_transformer_flux.py \
  tests/models/transformers/test_models_transformer_qwenimage.py \
  -k "(TransformerCompile and not aot and not group_offloading) or TransformerLoRAHotSwap" \
  "$@"
