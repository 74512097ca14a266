#!/usr/bin/env bash
# Run the full-size DiT benchmark for ONE model on the GPU machine (no network there):
#     bash benchmarks/tools/run_on_gpu.sh qwen-image [extra dit.py args, e.g. --whole-model --tag x]
# Needs the wheel folder .whl/ (diffusers and the few dependencies the GPU image lacks) carried
# along with the working tree (it is git-ignored). Results and the log go to $OUT (the folder that
# comes back from the device), else benchmarks/results. Several GPUs: run_on_gpus.sh.
set -euo pipefail
MODEL="${1:?usage: bash benchmarks/tools/run_on_gpu.sh qwen-image|flux2 [dit.py args]}"
shift
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/benchmarks/results}"
mkdir -p "$OUT"
source benchmarks/tools/gpu_setup.sh

# The benchmark: one process, one model, partial results written after every variant.
PYTHONUNBUFFERED=1 python3 benchmarks/dit/dit.py --size full --models "$MODEL" --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/log-$MODEL${LOG_SUFFIX:-}.txt"
