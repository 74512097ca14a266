#!/usr/bin/env bash
# Run the full-size DiT benchmark for ONE model on the GPU machine (no network there):
#     bash benchmarks/run_on_gpu.sh qwen-image [extra dit.py args, e.g. --whole-model --tag x]
# Needs the wheel folder .whl/ (diffusers and the few dependencies the GPU image lacks) carried
# along with the working tree (it is git-ignored). Results and the log go to $OUT (the folder that
# comes back from the device), else benchmarks/results.
set -euo pipefail
MODEL="${1:?usage: bash benchmarks/run_on_gpu.sh qwen-image|flux2 [dit.py args]}"
shift
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/benchmarks/results}"
mkdir -p "$OUT"

# 1. diffusers and friends, into a private folder put first on the import path.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD

# 2. kopt itself; editable so that kopt.kernels / kopt.agent map to the top-level kernels/ and agent/.
if python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
    && python3 -c "import kopt.kernels, kopt.agent" 2>/dev/null; then
    echo "kopt: editable install OK"
else
    # Fallback without pip or symlinks: stage a copy laid out as the installed package would be.
    echo "kopt: editable install failed; staging a copy in /tmp/kopt_src (kernels/ -> kopt/kernels, agent/ -> kopt/agent)"
    rm -rf /tmp/kopt_src && mkdir -p /tmp/kopt_src
    cp -r kopt /tmp/kopt_src/kopt
    cp -r kernels /tmp/kopt_src/kopt/kernels
    cp -r agent /tmp/kopt_src/kopt/agent
    export PYTHONPATH=/tmp/site:/tmp/kopt_src:$PWD
    python3 -c "import kopt.kernels, kopt.agent"
fi

python3 - <<'PY'
import torch, triton, diffusers, kopt
print(f"torch {torch.__version__} triton {triton.__version__} diffusers {diffusers.__version__} "
      f"kopt {kopt.__file__} device {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}")
PY

# 3. The benchmark: one process, one model, partial results written after every variant.
PYTHONUNBUFFERED=1 python3 benchmarks/dit.py --size full --models "$MODEL" --out "$OUT" "$@" 2>&1 \
    | tee "$OUT/log-$MODEL.txt"
