# Sourced by run_on_gpu.sh / run_on_gpus.sh on the GPU machine (no network there): installs the
# carried wheels (.whl/: diffusers and the few packages the GPU image lacks) and kopt itself, and
# exports PYTHONPATH. Expects to be sourced from the repository root.

# 1. diffusers and friends, into a private folder put first on the import path.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD

# 2. kopt itself; editable so that kopt.agent maps to the top-level agent/.
if python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
    && python3 -c "import kopt.kernels, kopt.agent" 2>/dev/null; then
    echo "kopt: editable install OK"
else
    # Fallback without pip or symlinks: stage a copy laid out as the installed package would be.
    echo "kopt: editable install failed; staging a copy in /tmp/kopt_src (agent/ -> kopt/agent)"
    rm -rf /tmp/kopt_src && mkdir -p /tmp/kopt_src
    cp -r kopt /tmp/kopt_src/kopt
    cp -r agent /tmp/kopt_src/kopt/agent
    export PYTHONPATH=/tmp/site:/tmp/kopt_src:$PWD
    python3 -c "import kopt.kernels, kopt.agent"
fi

python3 - <<'PY'
import torch, triton, diffusers, kopt
print(f"torch {torch.__version__} triton {triton.__version__} diffusers {diffusers.__version__} "
      f"kopt {kopt.__file__} devices {[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
PY
